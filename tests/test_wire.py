"""Frame format, decoding errors and state-dict transport of mortal/wire.py."""

import socket
import struct
from collections import OrderedDict

import msgpack
import pytest
import torch

from mortal import wire


def test_frame_bytes_are_magic_version_length_payload():
    # {'type': 'drain'} in msgpack: fixmap(1)=0x81, fixstr(4)=0xa4 'type', fixstr(5)=0xa5 'drain' -> 12 bytes
    frame = wire.encode_frame({'type': 'drain'})
    assert frame == b'MJRL' + b'\x01\x00' + b'\x0c\x00\x00\x00\x00\x00\x00\x00' + b'\x81\xa4type\xa5drain'


def test_roundtrip_over_socketpair_keeps_bytes_ints_and_nesting():
    a, b = socket.socketpair()
    with a, b:
        msg = {'type': 'submit_replay', 'logs': {'x.json.gz': b'\x1f\x8b\x00\xff'}, 'param_version': 2 ** 40}
        wire.send_msg(a, msg)
        assert wire.recv_msg(b) == msg


@pytest.mark.parametrize('header, reason', [
    (struct.pack('<4sHQ', b'XXXX', 1, 5), 'bad magic'),
    (struct.pack('<4sHQ', b'MJRL', 2, 5), 'protocol version 2'),
    (struct.pack('<4sHQ', b'MJRL', 1, 1001), 'exceeds the limit of 1000'),
])
def test_bad_headers_raise_protocol_error(header, reason):
    with pytest.raises(wire.ProtocolError, match=reason):
        wire.decode_header(header, max_frame_size=1000)


def test_limit_is_inclusive():
    assert wire.decode_header(struct.pack('<4sHQ', b'MJRL', 1, 1000), max_frame_size=1000) == 1000


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
        with pytest.raises(wire.ProtocolError, match='after 5 of 14 header'):
            wire.recv_msg(b)


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


def test_token_matches():
    assert wire.token_matches(None, None)
    assert wire.token_matches('', 'anything')
    assert wire.token_matches('s3cret', 's3cret')
    assert not wire.token_matches('s3cret', 's3creT')
    assert not wire.token_matches('s3cret', None)
    assert not wire.token_matches('s3cret', b's3cret')


def test_remote_from_config_defaults_and_overrides():
    r = wire.Remote.from_config({'online': {'remote': {'host': '127.0.0.1', 'port': 5000}}})
    assert (r.host, r.port, r.token, r.max_frame_size) == ('127.0.0.1', 5000, None, 512 * 1024 * 1024)
    r = wire.Remote.from_config({'online': {'remote': {'host': 'h', 'port': 1, 'token': 't'},
                                            'server': {'max_frame_bytes': 10}}})
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
