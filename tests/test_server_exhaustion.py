"""Issue 35, cases 2 and 3: hostile connections before and after authentication never starve a real peer.

A small-scale run of ``bench/server_exhaustion.py``'s hostile kinds against a server with the default
``[online.server]`` limits (64 unauthenticated connections, 512 MiB frames and in-flight budget): 70-80 hostile
connections, renewed 0.2 s after the server drops them, while a real peer sends get_param and a 111 KB
submit_replay three times each.
"""

import logging
import socket
import threading
import time

import msgpack
import pytest

from conftest import load_script, start_param_server, stop_server, wait_until
from mortal.net import msgpack_bounds, param_server, wire

bench = load_script('bench/server_exhaustion.py', 'server_exhaustion_bench')
TOKEN = 's3cret'



@pytest.mark.parametrize('kind, conns', [
    ('wrong-mac', 70),           # wrong MAC declaring 512 MiB, then silence (token)
    ('oversized', 70),           # 1 TiB declared, then silence (no token: the length is what is refused)
    ('slowloris', 80),           # a valid header, one byte every 0.5 s (token)
    ('slowloris-no-token', 80),  # the same without a token
    ('stalled', 70),             # a valid MAC declaring 512 MiB, then silence (token)
])
def test_a_real_peer_is_served_at_once_under_hostile_connections(tmp_path, kind, conns):
    token = TOKEN if bench.KINDS[kind] else None
    server = start_param_server(tmp_path, 1000, token=token)
    port = server.server_address[1]
    hostile = bench.Hostile(kind, port, conns, token=token, renew=0.2, interval=0.5, limit=30).start()
    try:
        wait_until(lambda: hostile.opened >= conns)
        time.sleep(0.3)
        if kind == 'stalled':  # all connected (closed only after 2 s without a byte), yet they hold no budget
            assert hostile.opened - hostile.dropped == conns and server.inflight.used == 0
        results = bench.real_requests(port, token, count=6, pause=0.2, timeout=3)
        assert [(t, ok) for t, ok, _ in results] == [('get_param', True), ('submit_replay', True)] * 3
        assert max(seconds for _, _, seconds in results) < 2.0  # ~2 ms unloaded; the bench checks p99 < 1 s
        assert server.pending <= 64
    finally:
        hostile.stop()
        stop_server(server)


def test_refusals_before_authentication_are_logged_a_few_then_counted(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(param_server, 'REFUSED_LOG_PERIOD', 2.0, raising=False)
    server = start_param_server(tmp_path, 10, token=TOKEN)
    try:
        with caplog.at_level(logging.WARNING, logger='mortal.server'):
            t0 = time.monotonic()
            for _ in range(25):
                with socket.create_connection(('127.0.0.1', server.server_address[1]), timeout=5) as s:
                    s.sendall(bench.header(1000, 'not-the-token'))
                    assert wire.recv_msg(s)['status'] == 'unauthorized'
            assert time.monotonic() - t0 < 2.0  # all in one period
            wait_until(lambda: 'more connections before authentication' in caplog.text, 4)
        lines = [r.getMessage() for r in caplog.records]
        assert sum(1 for line in lines if line.endswith(': missing or wrong token')) == 10
        assert lines[-1] == ('closed 15 more connections before authentication in the last 2 s (the last: missing '
                             'or wrong token)')
    finally:
        stop_server(server)


# -- issue 35 (hostile tester, second round): what an authenticated peer can make the server hold ---------------------

def bomb(entries: int) -> bytes:
    """A get_param whose extra field is ``entries`` empty lists (1 byte each): about 70x its size once decoded."""
    import msgpack
    return msgpack.packb({'type': 'get_param', 'x': [[]] * entries}, use_bin_type=True)


def test_a_decoding_bomb_is_refused_before_it_is_decoded(tmp_path, caplog):
    """A frame of 1 MiB of empty lists (no token on loopback) used to cost ~70 MiB while decoding; now its objects
    are counted first and it is refused, the server holding little more than the frame itself."""
    import tracemalloc
    payload = bomb(1 << 20)
    limit, _ = msgpack_bounds.request_limits(len(payload))
    assert limit == 1024 + len(payload) // 256 == 5120
    with pytest.raises(wire.ProtocolError, match=f'more than {limit} msgpack objects'):
        wire.decode_payload(payload, msgpack_bounds.request_limits(len(payload)))
    server = start_param_server(tmp_path, 10)
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger='mortal.server'):
            with socket.create_connection(('127.0.0.1', server.server_address[1]), timeout=10) as s:
                s.sendall(wire.encode_header(payload) + payload)
                with pytest.raises(wire.PeerClosed):
                    wire.recv_msg(s)  # closed without a reply, as any undecodable payload
            wait_until(lambda: 'a decoding bomb?' in caplog.text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        stop_server(server)
    assert peak < 8 * len(payload)  # the frame, read in 1 MiB parts; decoding it used to take ~70x
    # a real request of the same size decodes: 100 logs of 10 KiB each
    logs = {f'{i}.json.gz': bytes(10240) for i in range(100)}
    real = __import__('msgpack').packb({'type': 'submit_replay', 'logs': logs}, use_bin_type=True)
    assert wire.decode_payload(real, msgpack_bounds.request_limits(len(real)))['logs'] == logs


def test_shape_check_counts_every_msgpack_object_and_bounds_nesting():
    import msgpack
    msg = {'a': [1, -3, 200, -200, 70000, 2 ** 40, -2 ** 40, 2.5, 'x' * 40, 'y' * 300, 'z' * 70000, b'q', b'w' * 300,
                 b'e' * 70000, True, None, {'k': {}}],
           'b': msgpack.ExtType(3, b'abc'), 'c': msgpack.ExtType(3, b'a' * 20)}
    # the map (1), its 3 keys and 3 values (6), the list's 17 items, the inner map's key and value (2)
    assert msgpack_bounds.check_shape(msgpack.packb(msg, use_bin_type=True), 100, 4) == 1 + 6 + 17 + 2
    with pytest.raises(ValueError, match='more than 25 msgpack objects'):
        msgpack_bounds.check_shape(msgpack.packb(msg, use_bin_type=True), 25, 4)
    with pytest.raises(ValueError, match='deeper than 4 levels'):
        msgpack_bounds.check_shape(msgpack.packb({'a': [[[[1]]]]}), 100, 4)


def test_peers_that_never_read_their_reply_are_closed_within_seconds_and_hold_no_copy(tmp_path, caplog):
    """20 peers send get_param and never read the 16 MiB reply (their receive buffers are 4 KiB): each used to
    hold its own packed copy of the parameters, and its thread, until the 300 s socket timeout. Now the reply
    shares the stored parameters and must keep payload_min_bytes_per_s, so all are closed within two 2 s windows
    after their socket buffers fill, and a real peer is served meanwhile."""
    import threading
    import tracemalloc
    import torch
    server = start_param_server(tmp_path, 10)
    port = server.server_address[1]
    weights = wire.pack_state_dict({'w': torch.zeros(4 << 20)})  # 16 MiB
    assert server.store.submit_param(weights, wire.pack_state_dict({'b': torch.zeros(4)}), True)['status'] == 'ok'
    threads_before = threading.active_count()
    socks = []
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger='mortal.server'):
            for _ in range(20):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(('127.0.0.1', port))
                s.sendall(wire.encode_frame({'type': 'get_param', 'param_version': -1}))
                socks.append(s)
            wait_until(lambda: threading.active_count() == threads_before + 20, 5)  # a thread each
            t0 = time.monotonic()
            results = bench.real_requests(port, None, count=2, timeout=5)
            assert [(t, ok) for t, ok, _ in results] == [('get_param', True), ('submit_replay', True)]
            wait_until(lambda: threading.active_count() <= threads_before, 10)
            closed_after = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        for s in socks:
            s.close()
        stop_server(server)
    assert closed_after < 6.0
    assert caplog.text.count('reply stalled: the peer took') == 20
    assert peak < 3 * len(weights)  # the real peer's reply and submit; 20 copies were 20 x 16 MiB


def test_replies_travel_in_pieces_equal_to_the_frame_sharing_the_large_fields():
    big, small = bytes(range(256)) * 300, b'x' * 100
    msg = {'status': 'ok', 'mortal': big, 'dqn': small, 'param_version': 3, 'z': bytearray(b'q' * 70000)}
    pieces = wire.encode_pieces(msg, 'tok')
    payload = msgpack.packb(msg, use_bin_type=True)  # what the receiver decodes: one plain msgpack map
    assert b''.join(pieces) == wire.encode_header(payload, 'tok') + payload
    assert any(piece is big for piece in pieces) and not any(piece is small for piece in pieces)


def test_connections_beyond_max_connections_are_closed_at_once_with_one_line(tmp_path, caplog):
    """With every slot held by authenticated peers (payloads trickling at the floor), a new connection is closed
    at once, logged once; once they end, new ones are served again."""
    # payload_min_rate 1 byte/s: the held payloads are not closed as stalled while the test runs
    server = start_param_server(tmp_path, 10, max_pending=2, max_connections=4, payload_min_rate=1)
    port = server.server_address[1]
    held = []
    stop_feeding = threading.Event()

    def feed():  # a byte every 0.3 s keeps each held payload above 1 byte/s, however slow this machine is
        while not stop_feeding.wait(0.3):
            for s in list(held):
                try:
                    s.sendall(b'x')
                except OSError:
                    pass
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        with caplog.at_level(logging.INFO, logger='mortal.server'):
            for _ in range(4):  # authenticated, then slow: a trickle of a 1 MiB payload
                s = socket.create_connection(('127.0.0.1', port), timeout=5)
                s.sendall(bench.header(1 << 20, None) + b'x')
                held.append(s)
                # its header read before the next connects: max_pending = 2 would close the oldest unread one
                wait_until(lambda: server.serving == len(held) and server.pending == 0)
            feeder.start()
            wait_until(lambda: server.serving == 4 and server.pending == 0)
            for _ in range(3):
                with socket.create_connection(('127.0.0.1', port), timeout=5) as s:
                    assert s.recv(10) == b''  # closed at once, unread
            wait_until(lambda: 'closing new ones until some end' in caplog.text)
            assert caplog.text.count('4 connections are being served, the most at once') == 1
            stop_feeding.set()
            feeder.join(5)
            for s in held:
                s.close()
            wait_until(lambda: server.serving == 0)
            results = bench.real_requests(port, None, count=2, timeout=5)
            assert [ok for _, ok, _ in results] == [True, True]
            assert 'accepting new connections again (3 closed at once meanwhile' in caplog.text
    finally:
        stop_feeding.set()
        for s in held:
            s.close()
        stop_server(server)


def test_uploads_trickling_just_above_the_floor_do_not_keep_a_real_upload_out(tmp_path, caplog):
    """12 frames declaring the whole budget (1 MiB here) trickle at 160 KiB/s, above the 128 KiB/s floor, and
    hold all of max_inflight_bytes. A real 111 KB submit_replay used to wait behind them until its timeout; now
    after 1 s of waiting it goes first and closes the slowest of them."""
    server = start_param_server(tmp_path, 1000, token=TOKEN, max_frame_size=1 << 20, max_inflight_bytes=1 << 20)
    port = server.server_address[1]
    hostile = bench.Hostile('trickle', port, 12, token=TOKEN, max_frame=1 << 20, renew=0.2, limit=40).start()
    try:
        with caplog.at_level(logging.WARNING, logger='mortal.server'):
            wait_until(lambda: server.inflight.used > (1 << 20) - 64 * 1024, 10)  # the budget is theirs
            results = bench.real_requests(port, TOKEN, count=4, pause=0.2, timeout=8)
        assert [(t, ok) for t, ok, _ in results] == [('get_param', True), ('submit_replay', True)] * 2
        assert max(seconds for t, _, seconds in results if t == 'submit_replay') < 4.0  # ~1 s: the wait to preempt
        assert server.inflight.preempted >= 1
        assert 'preempted to admit another frame: it held' in caplog.text
    finally:
        hostile.stop()
        stop_server(server)
