"""Issue 35, cases 2 and 3: hostile connections before and after authentication never starve a real peer.

A small-scale run of ``bench/server_exhaustion.py``'s hostile kinds against a server with the default
``[online.server]`` limits (64 unauthenticated connections, 512 MiB frames and in-flight budget): 70-80 hostile
connections, renewed 0.2 s after the server drops them, while a real peer sends get_param and a 111 KB
submit_replay three times each.
"""

import logging
import socket
import time

import pytest

from conftest import load_script, start_param_server, stop_server
from mortal.net import param_server, wire

bench = load_script('bench/server_exhaustion.py', 'server_exhaustion_bench')
TOKEN = 's3cret'


def wait_until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, 'timed out'
        time.sleep(0.01)


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
    limit, _ = wire.request_limits(len(payload))
    assert limit == 1024 + len(payload) // 256 == 5120
    with pytest.raises(wire.ProtocolError, match=f'more than {limit} msgpack objects'):
        wire.decode_payload(payload, wire.request_limits(len(payload)))
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
    assert wire.decode_payload(real, wire.request_limits(len(real)))['logs'] == logs


def test_shape_check_counts_every_msgpack_object_and_bounds_nesting():
    import msgpack
    msg = {'a': [1, -3, 200, -200, 70000, 2 ** 40, -2 ** 40, 2.5, 'x' * 40, 'y' * 300, 'z' * 70000, b'q', b'w' * 300,
                 b'e' * 70000, True, None, {'k': {}}], 'b': msgpack.ExtType(3, b'abc'), 'c': msgpack.ExtType(3, b'a' * 20)}
    # the map (1), its 3 keys and 3 values (6), the list's 17 items, the inner map's key and value (2)
    assert wire.check_shape(msgpack.packb(msg, use_bin_type=True), 100, 4) == 1 + 6 + 17 + 2
    with pytest.raises(wire.ProtocolError, match='more than 25 msgpack objects'):
        wire.check_shape(msgpack.packb(msg, use_bin_type=True), 25, 4)
    with pytest.raises(wire.ProtocolError, match='deeper than 4 levels'):
        wire.check_shape(msgpack.packb({'a': [[[[1]]]]}), 100, 4)
