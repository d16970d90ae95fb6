"""Frame format, decoding errors and state-dict transport of mortal/net/wire.py."""

import hashlib
import hmac
import logging
import socket
import struct
import threading
import time
from collections import OrderedDict

import msgpack
import pytest
import torch

from mortal.net import signature, wire


def header(length, *, magic=b'MJRL', version=2, digest=b'\0' * 32, token=None):
    """A version-2 header built by hand: magic | version | length | digest | HMAC-SHA256(token) of the 46 before."""
    signed = struct.pack('<4sHQ32s', magic, version, length, digest)
    return signed + hmac.new((token or '').encode(), signed, hashlib.sha256).digest()


def test_frame_bytes_are_magic_version_length_digest_mac_payload():
    # {'type': 'drain'} in msgpack: fixmap(1)=0x81, fixstr(4)=0xa4 'type', fixstr(5)=0xa5 'drain' -> 12 bytes
    payload = b'\x81\xa4type\xa5drain'
    digest = hashlib.sha256(payload).digest()
    signed = b'MJRL' + b'\x02\x00' + b'\x0c\x00\x00\x00\x00\x00\x00\x00' + digest
    frame = wire.encode_frame({'type': 'drain'}, token='s3cret')
    assert len(frame) == 78 + 12 and wire.HEADER_SIZE == 78
    assert frame == signed + hmac.new(b's3cret', signed, hashlib.sha256).digest() + payload
    # without a token the MAC is keyed with the empty string; the token itself never travels
    assert wire.encode_frame({'type': 'drain'}) == signed + hmac.new(b'', signed, hashlib.sha256).digest() + payload
    assert b's3cret' not in frame


def test_mac_is_checked_before_any_payload_byte_is_read():
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(5)
        # a header announcing 1 MiB, signed with another token, and no payload at all: refused at once
        a.sendall(header(1 << 20, token='guess'))
        t0 = time.monotonic()
        with pytest.raises(wire.ProtocolError, match='bad MAC'):
            wire.recv_msg(b, token='s3cret')
        assert time.monotonic() - t0 < 1.0
        h = wire.recv_header(_feed(header(10, token='s3cret')), 1000)
        assert h.length == 10 and h.authentic('s3cret') and not h.authentic('s3creT') and h.authentic(None)


def _feed(data):
    a, b = socket.socketpair()
    a.sendall(data)
    a.close()
    b.settimeout(5)
    return b


def test_payload_must_match_its_digest():
    frame = bytearray(wire.encode_frame({'type': 'drain'}, token='t'))
    frame[-1] ^= 1  # one bit flipped in transit
    with pytest.raises(wire.ProtocolError, match='does not match the SHA-256 digest'):
        wire.recv_msg(_feed(bytes(frame)), token='t')
    assert wire.recv_msg(_feed(wire.encode_frame({'type': 'drain'}, token='t')), token='t') == {'type': 'drain'}


def test_roundtrip_over_socketpair_keeps_bytes_ints_and_nesting():
    a, b = socket.socketpair()
    with a, b:
        msg = {'type': 'submit_replay', 'logs': {'x.json.gz': b'\x1f\x8b\x00\xff'}, 'param_version': 2 ** 40}
        wire.send_msg(a, msg)
        assert wire.recv_msg(b) == msg


@pytest.mark.parametrize('data, reason', [
    (header(5, magic=b'XXXX'), 'bad magic'),
    (header(5, version=1), 'protocol version 1, this side speaks 2'),
    (header(1001), 'exceeds the limit of 1000'),
])
def test_bad_headers_raise_protocol_error(data, reason):
    with pytest.raises(wire.ProtocolError, match=reason):
        wire.decode_header(data, max_frame_size=1000)


def test_old_version_is_named_after_six_bytes():
    # a version-1 peer sends a 14-byte header: the version is reported without waiting for 78 bytes
    with pytest.raises(wire.ProtocolError, match='protocol version 1'):
        wire.recv_header(_feed(struct.pack('<4sHQ', b'MJRL', 1, 0)))


def test_limit_is_inclusive():
    assert wire.decode_header(header(1000), max_frame_size=1000).length == 1000


@pytest.mark.parametrize('payload, reason', [
    (b'\xc1', 'undecodable'),  # 0xc1 is the one byte msgpack never uses
    (msgpack.packb([1, 2]), 'is a list'),
    (msgpack.packb({'type': 'drain'}) + b'\x00', 'undecodable'),  # trailing bytes
    (msgpack.packb({'kind': 'drain'}), 'neither a string'),
    (msgpack.packb({1: 'drain'}, strict_types=False), 'undecodable'),  # int keys refused
])
def test_bad_payloads_raise_protocol_error(payload, reason):
    with pytest.raises(wire.ProtocolError, match=reason):
        wire.decode_payload(payload)


def test_truncated_frame_and_clean_close():
    a, b = socket.socketpair()
    with b:
        frame = wire.encode_frame({'type': 'drain'})
        a.sendall(frame[:-3])
        a.close()
        with pytest.raises(wire.ProtocolError, match='truncated frame: connection closed after 9 of 12 payload'):
            wire.recv_msg(b)
    a, b = socket.socketpair()
    with b:
        a.close()
        with pytest.raises(wire.PeerClosed):
            wire.recv_msg(b)
    a, b = socket.socketpair()
    with b:
        a.sendall(frame[:5])  # inside the header
        a.close()
        with pytest.raises(wire.ProtocolError, match='after 5 of 78 header'):
            wire.recv_msg(b)
    with pytest.raises(wire.ProtocolError, match='after 30 of 78 header'):
        wire.recv_msg(_feed(frame[:30]))  # past magic and version


def test_state_dict_roundtrip_is_exact():
    net = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.BatchNorm1d(4))
    sd = net.state_dict()
    back = wire.unpack_state_dict(wire.pack_state_dict(sd))
    assert list(back) == list(sd)  # order travels in the metadata
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)
    assert back['1.num_batches_tracked'].dtype == torch.int64
    fresh = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.BatchNorm1d(4))
    fresh.load_state_dict(back, strict=True)


def test_state_dict_from_non_contiguous_tensor():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    back = wire.unpack_state_dict(wire.pack_state_dict(OrderedDict(w=t)))
    assert back['w'].tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


@pytest.mark.parametrize('data', [b'', b'garbage', b'\xff' * 8 + b'{}', 'text'])
def test_bad_state_dict_bytes_raise_protocol_error(data):
    with pytest.raises(wire.ProtocolError):
        wire.unpack_state_dict(data)


def test_remote_from_config_defaults_and_overrides():
    from mortal.config import section
    config = {'online': {'remote': {'host': '127.0.0.1', 'port': 5000}}}
    r = wire.Remote.from_config(section(config, 'online.remote'))  # a client's file: no [online.server]
    assert (r.host, r.port, r.token, r.max_frame_size) == ('127.0.0.1', 5000, None, 512 * 1024 * 1024)
    config = {'online': {'remote': {'host': 'h', 'port': 1, 'token': 't'},
                         'server': {'buffer_dir': 'b', 'drain_dir': 'd', 'capacity': 4, 'force_sequential': False,
                                    'max_frame_bytes': 10}}}
    r = wire.Remote.from_config(section(config, 'online.remote'), section(config, 'online.server'))
    assert (r.host, r.port, r.token, r.max_frame_size) == ('h', 1, 't', 10)


def test_request_with_retry_retries_while_server_down():
    # Grab a free port, then close it: connecting is refused until a server appears.
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    remote = wire.Remote('127.0.0.1', port, timeout=5)
    sleeps = []

    class Stop(Exception):
        pass

    def fake_sleep(sec):
        sleeps.append(sec)
        if len(sleeps) == 3:
            raise Stop

    with pytest.raises(Stop):
        wire.request_with_retry(remote, {'type': 'drain'}, sleep=fake_sleep)
    assert sleeps == [3.0, 3.0, 3.0]


def test_request_with_retry_says_once_what_status_it_waits_out(caplog):
    # a hostile trial's server answered 'bogus' to every drain: the learner retried every 3 s without a line
    replies = iter([{'status': 'bogus'}, {'status': 'bogus'}, {'status': 'odd'}, {'status': 'ok', 'n': 1}])

    class Scripted(wire.Remote):
        def request(self, msg):
            return next(replies)

    sleeps = []
    with caplog.at_level(logging.WARNING, 'mortal'):
        reply = wire.request_with_retry(Scripted('127.0.0.1', 1), {'type': 'drain'}, sleep=sleeps.append)
    assert reply == {'status': 'ok', 'n': 1} and sleeps == [3.0, 3.0, 3.0]
    assert [r.getMessage() for r in caplog.records] == [
        "server 127.0.0.1:1 answered 'drain' with status 'bogus'; retrying every 3 s",
        "server 127.0.0.1:1 answered 'drain' with status 'odd'; retrying every 3 s"]


def test_a_reply_that_trickles_ends_at_its_deadline():
    # a hostile trial's server sent an honest reply a byte every 10 s: the client waited 9 minutes without a line
    frame = wire.encode_frame({'status': 'ok', 'blob': b'x' * 400})
    with socket.socket() as srv:
        srv.bind(('127.0.0.1', 0))
        srv.listen()

        def trickle():
            conn, _ = srv.accept()
            with conn:
                wire.recv_msg(conn)
                conn.sendall(frame[:-400])  # the header and the map's start at once, then the payload's bytes slowly
                for i in range(len(frame) - 400, len(frame)):
                    try:
                        conn.sendall(frame[i:i + 1])
                    except OSError:
                        return
                    time.sleep(0.05)

        threading.Thread(target=trickle, daemon=True).start()
        t0 = time.monotonic()  # the frame is due within the 1 s timeout + its size at 16 KiB/s: about 1.03 s
        with pytest.raises(wire.ProtocolError, match=r'payload \(due at 16,384 B/s\) incomplete after the time'):
            wire.Remote('127.0.0.1', srv.getsockname()[1], timeout=1.0).request({'type': 'drain'})
        assert time.monotonic() - t0 < 3  # each byte came well within the 1 s timeout: only the deadline ends it
    # the server's own floor, when a config lowers it below 16 KiB/s for a slow link, is the client's too
    from mortal.config import section
    config = {'online': {'remote': {'host': 'h', 'port': 1}, 'server': {
        'buffer_dir': 'b', 'drain_dir': 'd', 'capacity': 4, 'force_sequential': False,
        'payload_min_bytes_per_s': 4096}}}
    assert wire.Remote.from_config(section(config, 'online.remote'),
                                   section(config, 'online.server')).reply_min_bytes_per_s == 4096
    assert wire.Remote.from_config(section(config, 'online.remote')).reply_min_bytes_per_s == 16 << 10


def test_state_dict_signature_reads_the_header_only():
    net = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.BatchNorm1d(4))
    data = wire.pack_state_dict(net.state_dict())
    sig = signature.state_dict_signature(data)
    assert list(sig) == list(net.state_dict())
    assert sig['0.weight'] == ('F32', (4, 3, 3)) and sig['1.num_batches_tracked'] == ('I64', ())
    assert signature.state_dict_signature(wire.pack_state_dict({})) == {}
    for bad in (b'', b'\x05\x00\x00\x00\x00\x00\x00\x00[1,2]', b'\xff' * 8 + b'{}', 'text'):
        with pytest.raises(wire.ProtocolError):
            signature.state_dict_signature(bad)


def test_signature_difference_names_first_key_and_both_shapes():
    small = signature.state_dict_signature(wire.pack_state_dict(torch.nn.Conv1d(16, 16, 3).state_dict()))
    big = signature.state_dict_signature(wire.pack_state_dict(torch.nn.Conv1d(32, 32, 3).state_dict()))
    assert signature.signature_difference(big, big) is None
    assert signature.signature_difference(big, small) == "key 'weight' is F32 [16, 16, 3], expected F32 [32, 32, 3]"
    lin = signature.state_dict_signature(wire.pack_state_dict(torch.nn.Linear(2, 2, bias=False).state_dict()))
    assert signature.signature_difference(big, lin) == "key 'weight' is F32 [2, 2], expected F32 [32, 32, 3]"
    assert signature.signature_difference(lin, big) == "key 'weight' is F32 [32, 32, 3], expected F32 [2, 2]"
    nobias = {k: v for k, v in big.items() if k != 'bias'}
    assert signature.signature_difference(big, nobias) == "key 'bias' is missing (expected F32 [32])"
    assert signature.signature_difference(nobias, big) == "unexpected key 'bias' (F32 [32])"


class OneShotServer:
    """Answers each connection with the next of ``replies`` (a loopback socket server for retry tests)."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.sock = socket.create_server(('127.0.0.1', 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        for reply in self.replies:
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(5)
                wire.recv_msg(conn)
                wire.send_msg(conn, reply)


def test_error_replies_are_retried_and_logged_once_per_reason(caplog):
    err = {'status': 'error', 'reason': 'buffer_dir not writable: [Errno 13] Permission denied'}
    srv = OneShotServer([err, err, err, {'status': 'ok', 'count': 1}])
    sleeps = []
    with caplog.at_level(logging.INFO, logger='mortal.wire'):
        with srv.sock:
            reply = wire.request_with_retry(wire.Remote('127.0.0.1', srv.port, timeout=5), {'type': 'drain'},
                                            sleep=sleeps.append)
    assert reply == {'status': 'ok', 'count': 1} and sleeps == [3.0, 3.0, 3.0]
    assert caplog.text.count('buffer_dir not writable') == 1
    assert 'unreachable' not in caplog.text and caplog.text.count("handles 'drain' again") == 1


class Ledger:
    """take/give callbacks of recv_payload_paced that record what is held; refuses beyond ``limit``."""

    def __init__(self, limit=1 << 30):
        self.held = self.peak = 0
        self.limit = limit

    def take(self, n):
        if self.held + n > self.limit:
            raise wire.ProtocolError('refused')
        self.held += n
        self.peak = max(self.peak, self.held)

    def give(self, n):
        self.held -= n


def test_a_paced_payload_holds_only_the_bytes_that_came():
    payload = msgpack.packb({'type': 'drain', 'pad': b'x' * 300_000})
    h = wire.decode_header(wire.encode_frame({'type': 'drain', 'pad': b'x' * 300_000})[:wire.HEADER_SIZE])
    a, b = socket.socketpair()
    with a, b:
        ledger = Ledger()
        held_after_first = []

        def send():
            a.sendall(payload[:1000])
            time.sleep(0.3)
            held_after_first.append(ledger.held)
            a.sendall(payload[1000:])
        t = threading.Thread(target=send)
        t.start()
        msg = wire.recv_payload_paced(b, h, min_rate=1000, window=1.0, take=ledger.take, give=ledger.give)
        t.join()
    assert msg == {'type': 'drain', 'pad': b'x' * 300_000}
    assert held_after_first == [1000]  # a 300 KB frame holds only its first 1000 bytes while the rest is due
    assert ledger.held == len(payload)  # the caller gives the whole payload back once handled


def test_a_stalled_payload_is_closed_at_the_end_of_its_window():
    h = wire.decode_header(header(1 << 20))
    a, b = socket.socketpair()
    with a, b:
        ledger = Ledger()
        a.sendall(b'x' * 500)  # 500 bytes, then nothing: below 1000 bytes/s over a 0.3 s window (300 bytes)...
        t0 = time.monotonic()
        with pytest.raises(wire.ProtocolError, match=r'payload stalled: 0 bytes in the last 0.3 s, below '
                                                     r'\[online.server\] payload_min_bytes_per_s = 1000 '
                                                     r'\(500 of 1048576 bytes\)'):
            wire.recv_payload_paced(b, h, min_rate=1000, window=0.3, take=ledger.take, give=ledger.give)
        # ...the first window passes (500 >= 300), the second has 0: closed after two windows
        assert 0.55 < time.monotonic() - t0 < 1.0
        assert ledger.held == 500


def test_a_paced_payload_waits_for_data_before_it_takes_any_budget():
    h = wire.decode_header(header(1 << 20))
    a, b = socket.socketpair()
    with a, b:
        ledger = Ledger(limit=0)  # any take is refused
        with pytest.raises(wire.ProtocolError, match='payload stalled: 0 bytes'):
            wire.recv_payload_paced(b, h, min_rate=1, window=0.2, take=ledger.take, give=ledger.give)
        a.sendall(b'x')
        with pytest.raises(wire.ProtocolError, match='refused'):  # the refusal of take propagates
            wire.recv_payload_paced(b, h, min_rate=1, window=0.2, take=ledger.take, give=ledger.give)
        a.close()
        assert b.recv(1) == b'x'  # nothing was read before the budget allowed it
        with pytest.raises(wire.ProtocolError, match='truncated frame: connection closed after 0 of 1048576'):
            wire.recv_payload_paced(b, h, min_rate=1, window=0.2, take=Ledger().take, give=ledger.give)


def _one_reply_server(reply_token):
    """A listening socket on 127.0.0.1 whose thread answers one request with {'status': 'ok', 'x': 1} signed with
    ``reply_token``; returns (port, thread)."""
    srv = socket.socket()
    srv.bind(('127.0.0.1', 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn, srv:
            wire.recv_msg(conn)
            wire.send_msg(conn, {'status': wire.STATUS_OK, 'x': 1}, reply_token)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return srv.getsockname()[1], thread


@pytest.mark.parametrize('remote_host, reply_token, accepted', [
    (True, 'secret', True),     # a server off this machine signs its reply with the shared token
    (True, 'forged', False),    # someone on the path answers instead: refused, never used
    (True, None, False),        # an unsigned reply from off this machine
    (False, 'forged', True),    # this machine: a server here may run without a token (unchanged)
])
def test_a_reply_from_off_this_machine_must_carry_the_token(monkeypatch, remote_host, reply_token, accepted):
    if remote_host:  # the socket is local; the client is told its server is elsewhere
        monkeypatch.setattr(wire, 'is_loopback', lambda host: False)
    port, thread = _one_reply_server(reply_token)
    remote = wire.Remote(host='127.0.0.1', port=port, token='secret', timeout=5)
    if accepted:
        assert remote.request({'type': 'get_param'}) == {'status': 'ok', 'x': 1}
    else:
        with pytest.raises(wire.RequestRefused, match=r"reply of 127\.0\.0\.1:\d+ to 'get_param' is not signed with "
                                                      r"this \[online\.remote\] token"):
            remote.request({'type': 'get_param'})
    thread.join(5)
