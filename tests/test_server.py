"""mortal/server.py over real sockets on 127.0.0.1 (port 0): requests, back-pressure, drain, faults."""

import errno
import gzip
import hashlib
import hmac
import json
import logging
import os
import pickle
import socket
import struct
import threading
import time

import msgpack
import pytest
import torch

from mortal import server as srv
from mortal.config import ConfigError
from mortal.net import address, param_server, replay_store, signature, wire

from conftest import load_tiny_config, start_param_server, stop_server, wait_until

MAX_FRAME = 1 << 20


def tiny_params(scale=1.0):
    mortal = torch.nn.Conv1d(2, 3, 3)
    dqn = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in list(mortal.parameters()) + list(dqn.parameters()):
            p.fill_(scale)
    return wire.pack_state_dict(mortal.state_dict()), wire.pack_state_dict(dqn.state_dict())


def mjai(name='x', *, compress=True):
    """A (tiny) mjai log: its first line is a start_game event, as the server requires."""
    text = (json.dumps({'type': 'start_game', 'names': ['a', 'b', 'c', name]}) + '\n'
            + json.dumps({'type': 'end_game'}) + '\n').encode()
    return gzip.compress(text) if compress else text


class Running:
    def __init__(self, tmp_path, capacity=4, force_sequential=False, token=None, host='127.0.0.1',
                 max_frame=MAX_FRAME, **kwargs):
        self.server = start_param_server(tmp_path, capacity, force_sequential=force_sequential, host=host,
                                         token=token, max_frame_size=max_frame, timeout=5, **kwargs)
        self.store = self.server.store
        self.port = self.server.server_address[1]
        self.remote = wire.Remote('127.0.0.1', self.port, token=token, timeout=5, max_frame_size=max_frame)

    def request(self, msg):
        return self.remote.request(msg)

    def raw(self, data, *, close_write=True):
        """Send raw bytes; return what the server sent back before closing (b'' = closed without reply)."""
        chunks = []
        with socket.create_connection(('127.0.0.1', self.port), timeout=5) as s:
            try:  # the server may close (and reset) before it has read everything: that is a close too
                s.sendall(data)
                if close_write:
                    s.shutdown(socket.SHUT_WR)
                while True:
                    c = s.recv(65536)
                    if not c:
                        break
                    chunks.append(c)
            except (ConnectionResetError, BrokenPipeError, OSError) as ex:
                if isinstance(ex, socket.timeout):
                    raise
        return b''.join(chunks)

    def close(self):
        stop_server(self.server)


@pytest.fixture
def running(tmp_path):
    r = Running(tmp_path)
    yield r
    r.close()


def submit_param(r, is_idle=False, scale=1.0):
    m, d = tiny_params(scale)
    return r.request({'type': 'submit_param', 'mortal': m, 'dqn': d, 'is_idle': is_idle})


def get_param(r, version=-1, server_id=None):
    return r.request({'type': 'get_param', 'param_version': version, 'server_id': server_id})


def submit_logs(r, names, version=0, server_id=None):
    logs = {n: mjai(n) for n in names}
    return r.request({'type': 'submit_replay', 'logs': logs, 'param_version': version, 'server_id': server_id})


def test_empty_param_then_params_roundtrip(running):
    assert get_param(running) == {'status': 'empty param'}
    assert submit_param(running, scale=0.5)['param_version'] == 1
    rsp = get_param(running)
    assert rsp['status'] == 'ok' and rsp['param_version'] == 1
    sd = wire.unpack_state_dict(rsp['mortal'])
    assert sd['weight'].shape == (3, 2, 3) and sd['weight'].unique().tolist() == [0.5]
    assert wire.unpack_state_dict(rsp['dqn'])['bias'].tolist() == [0.5, 0.5]
    assert submit_param(running)['param_version'] == 2


def test_same_names_from_two_submissions_never_overwrite(running):
    assert submit_logs(running, ['a.json.gz', 'b.json.gz'])['count'] == 2
    assert submit_logs(running, ['a.json.gz'])['submission_id'] == 1
    buf = running.store.buffer_dir
    assert sorted(os.listdir(buf)) == ['0_a.json.gz', '0_b.json.gz', '1_a.json.gz']
    with gzip.open(os.path.join(buf, '1_a.json.gz'), 'rt') as f:
        assert json.loads(f.readline())['names'][3] == 'a.json.gz'


def test_capacity_back_pressure_and_drain(running):
    submit_param(running)
    submit_logs(running, ['a', 'b', 'c'])
    assert get_param(running)['status'] == 'ok'  # 3 < capacity 4
    submit_logs(running, ['d'])
    assert get_param(running) == {'status': 'samples overflow'}
    rsp = running.request({'type': 'drain'})
    assert rsp['count'] == 4 and rsp['drain_dir'] == running.store.drain_dir
    assert rsp['files'] == ['0_a', '0_b', '0_c', '1_d']
    assert sorted(os.listdir(rsp['drain_dir'])) == rsp['files']
    assert os.listdir(running.store.buffer_dir) == []
    assert get_param(running)['status'] == 'ok'
    # a second drain with nothing buffered leaves the previous drain in place and answers 0
    assert running.request({'type': 'drain'})['count'] == 0
    assert sorted(os.listdir(rsp['drain_dir'])) == rsp['files']
    # the next drain empties drain_dir first
    submit_logs(running, ['e'])
    rsp = running.request({'type': 'drain'})
    assert rsp['files'] == ['2_e'] and os.listdir(rsp['drain_dir']) == ['2_e']


def test_drain_reports_param_versions_for_staleness(running):
    submit_param(running)
    sid = get_param(running)['server_id']
    submit_logs(running, ['a'], version=1, server_id=sid)
    submit_param(running)
    submit_param(running)
    submit_logs(running, ['b'], version=3, server_id=sid)
    submit_logs(running, ['c'], version=3, server_id='another-server-instance')
    rsp = running.request({'type': 'drain'})
    assert rsp['files'] == ['0_a', '1_b', '2_c']
    assert rsp['param_versions'] == [1, 3, -1]
    assert rsp['param_version'] == 3 and rsp['has_param'] is True


def test_force_sequential(tmp_path):
    r = Running(tmp_path, capacity=2, force_sequential=True)
    try:
        submit_param(r, is_idle=True)  # version 1, idle 1
        rsp = get_param(r)
        assert rsp['status'] == 'ok' and rsp['param_version'] == 1
        sid = rsp['server_id']
        assert get_param(r, 1, sid) == {'status': 'trainer is busy'}
        # a client of a previous server instance holds nothing of this one
        assert get_param(r, 1, 'old-instance')['status'] == 'ok'
        submit_logs(r, ['a'])
        assert r.request({'type': 'drain'})['count'] == 0  # not full yet
        submit_logs(r, ['b'])
        assert r.request({'type': 'drain'})['count'] == 2
        submit_param(r, is_idle=False)  # version 2: mid-epoch, still busy
        assert get_param(r, 1, sid) == {'status': 'trainer is busy'}
        submit_param(r, is_idle=True)  # version 3, idle 3
        assert get_param(r, 1, sid)['param_version'] == 3
    finally:
        r.close()


def test_stray_files_and_folders_are_ignored_and_logged(running, caplog):
    buf, drn = running.store.buffer_dir, running.store.drain_dir
    open(os.path.join(buf, 'stray.json.gz'), 'wb').close()
    os.mkdir(os.path.join(buf, 'stray_dir'))
    open(os.path.join(drn, 'old_stray'), 'wb').close()
    os.makedirs(os.path.join(drn, 'old_dir', 'sub'))
    submit_param(running)
    submit_logs(running, ['a', 'b', 'c'])
    assert get_param(running)['status'] == 'ok'  # strays do not count towards capacity
    with caplog.at_level(logging.WARNING, logger='mortal.server'):
        rsp = running.request({'type': 'drain'})
    assert rsp['count'] == 3 and rsp['files'] == ['0_a', '0_b', '0_c']
    assert sorted(os.listdir(drn)) == ['0_a', '0_b', '0_c']
    assert sorted(os.listdir(buf)) == ['stray.json.gz', 'stray_dir']
    text = caplog.text
    for name in ('stray.json.gz', 'stray_dir', 'old_stray', 'old_dir'):
        assert name in text


def test_reset_dirs_clears_and_logs(tmp_path, caplog):
    (tmp_path / 'buffer').mkdir()
    (tmp_path / 'buffer' / 'left_over').write_bytes(b'x')
    store = replay_store.ReplayStore(tmp_path / 'buffer', tmp_path / 'drain', 4)
    with caplog.at_level(logging.INFO, logger='mortal.server'):
        store.reset_dirs()
    assert os.listdir(tmp_path / 'buffer') == [] and os.listdir(tmp_path / 'drain') == []
    assert 'cleared and recreated ' + str(tmp_path / 'buffer') in caplog.text
    assert 'created ' + str(tmp_path / 'drain') in caplog.text


@pytest.mark.parametrize('name', ['../evil', 'a/b', '.hidden', '', 'x' * 201, '..'])
def test_unsafe_log_names_are_refused_and_nothing_is_written(running, name):
    with pytest.raises(wire.RequestRefused, match='unsafe log name'):
        running.request({'type': 'submit_replay', 'logs': {'ok': b'1', name: b'2'}, 'param_version': 0})
    assert os.listdir(running.store.buffer_dir) == []
    assert running.store.buffer == {}


def test_failed_write_midway_stores_nothing_and_answers_error(running, monkeypatch):
    real_replace = os.replace
    calls = []

    def failing_replace(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise OSError(28, 'No space left on device')
        return real_replace(a, b)

    monkeypatch.setattr(replay_store.os, 'replace', failing_replace)
    reply = running.store.submit_replay({'a': mjai(), 'b': mjai()}, 0)
    assert reply == {'status': 'error', 'reason': 'buffer_dir not writable: [Errno 28] No space left on device'}
    # the first log had been renamed before the failure: it is taken back, so a resubmission stores it once
    assert os.listdir(running.store.buffer_dir) == [] and running.store.buffer == {}
    monkeypatch.undo()
    assert running.store.submit_replay({'a': mjai(), 'b': mjai()}, 0)['status'] == 'ok'
    assert sorted(os.listdir(running.store.buffer_dir)) == ['1_a', '1_b']


def test_wrong_field_types_are_bad_requests(running):
    for msg, reason in [
        ({'type': 'get_param'}, "missing field 'param_version'"),
        ({'type': 'get_param', 'param_version': 'x'}, 'is a str'),
        ({'type': 'get_param', 'param_version': True}, 'is a bool'),
        ({'type': 'submit_param', 'mortal': b'junk', 'dqn': b'junk'}, 'invalid safetensors'),
        ({'type': 'submit_replay', 'logs': {'a': 'text'}, 'param_version': 0}, 'expected bytes'),
        ({'type': 'submit_param', 'mortal': b'junk', 'dqn': b'junk', 'learner': 5}, "field 'learner' is a int"),
        ({'type': 'submit_param', 'mortal': b'junk', 'dqn': b'junk', 'learner': ''}, "'learner' must be 1-1024"),
        ({'type': 'shutdown'}, "unknown request type 'shutdown'"),
    ]:
        with pytest.raises(wire.RequestRefused, match=reason):
            running.request(msg)
    assert get_param(running) == {'status': 'empty param'}  # nothing changed, still serving


def frame(payload: bytes, *, magic=b'MJRL', version=2, length=None, token=None):
    """A frame built by hand: magic | version | length | SHA-256(payload) | HMAC-SHA256(token) | payload."""
    signed = struct.pack('<4sHQ32s', magic, version, len(payload) if length is None else length,
                         hashlib.sha256(payload).digest())
    return signed + hmac.new((token or '').encode(), signed, hashlib.sha256).digest() + payload


class Exploit:
    """Unpickling this runs os.system: proves that nothing from the network is unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


def test_pickle_payload_never_executes(running, tmp_path):
    marker = tmp_path / 'pwned'
    evil = pickle.dumps(Exploit(marker))
    # sanity: the payload really executes when unpickled
    pickle.loads(pickle.dumps(Exploit(tmp_path / 'control')))
    assert (tmp_path / 'control').exists()
    # raw (Mortal's framing: u64 length + pickle), inside a valid frame, and as a "state dict" field
    assert running.raw(struct.pack('<Q', len(evil)) + evil) == b''
    assert running.raw(frame(evil)) == b''
    with pytest.raises(wire.RequestRefused, match='invalid safetensors'):
        running.request({'type': 'submit_param', 'mortal': evil, 'dqn': evil, 'is_idle': True})
    # and what torch.save would send (a zip holding a pickle)
    import io
    buf = io.BytesIO()
    torch.save({'type': 'drain', 'x': Exploit(marker)}, buf)
    assert running.raw(frame(buf.getvalue())) == b''
    time.sleep(0.2)
    assert not marker.exists()
    assert get_param(running) == {'status': 'empty param'}


@pytest.mark.parametrize('data, reason', [
    (b'GET / HTTP/1.1\r\nHost: x\r\n\r\n', 'bad magic'),
    (frame(msgpack.packb({'type': 'drain'}), version=7), 'protocol version 7'),
    (frame(b'', length=MAX_FRAME + 1), 'exceeds the limit'),
    (frame(msgpack.packb({'type': 'drain'}))[:-2], 'truncated frame'),
    (frame(b'\xc1\xc1\xc1'), 'undecodable payload'),
    (frame(msgpack.packb(['drain'])), 'expected a map'),
    (b'MJ', 'truncated frame'),
])
def test_malformed_frames_close_that_connection_only(running, caplog, data, reason):
    # a well-behaved peer holds a half-sent frame open on another connection meanwhile
    with socket.create_connection(('127.0.0.1', running.port), timeout=5) as slow:
        slow.sendall(frame(msgpack.packb({'type': 'drain'}))[:10])
        with caplog.at_level(logging.WARNING, logger='mortal.server'):
            answer = running.raw(data)
        if reason == 'exceeds the limit':  # authentic (no token here): told why before the close
            reply = wire.decode_payload(answer[wire.HEADER_SIZE:])
            assert reply == {'status': 'bad request', 'reason': f'frame of {MAX_FRAME + 1} bytes exceeds the '
                             f"server's [online.server] max_frame_bytes = {MAX_FRAME}"}
        else:
            assert answer == b''
        assert get_param(running) == {'status': 'empty param'}
        slow.sendall(frame(msgpack.packb({'type': 'drain'}))[10:])
        reply = wire.recv_msg(slow)
        assert reply['status'] == 'ok' and reply['count'] == 0
    assert reason in caplog.text and 'closing connection from 127.0.0.1' in caplog.text


def test_client_killed_mid_upload_leaves_nothing(running):
    full = wire.encode_frame({'type': 'submit_replay', 'logs': {'a': b'x' * 5000}, 'param_version': 0})
    s = socket.create_connection(('127.0.0.1', running.port))
    s.sendall(full[:3000])
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))  # RST, like a killed process
    s.close()
    time.sleep(0.2)
    assert os.listdir(running.store.buffer_dir) == []
    submit_logs(running, ['b'])
    assert os.listdir(running.store.buffer_dir) == ['0_b']  # the cut upload never got a submission id
    assert len(running.store.buffer) == 1


def test_token_required_when_configured(tmp_path):
    r = Running(tmp_path, token='s3cret')
    try:
        assert submit_param(r)['status'] == 'ok'
        anon = wire.Remote('127.0.0.1', r.port, timeout=5)
        with pytest.raises(wire.RequestRefused, match='unauthorized'):
            anon.request({'type': 'drain'})
        wrong = wire.Remote('127.0.0.1', r.port, token='guess', timeout=5)
        with pytest.raises(wire.RequestRefused, match='unauthorized'):
            wrong.request({'type': 'get_param', 'param_version': -1})
    finally:
        r.close()


def test_bind_beyond_loopback_requires_token(tmp_path):
    with pytest.raises(ValueError, match=r'\[online.remote\] token must be set'):
        Running(tmp_path, host='0.0.0.0')
    assert address.is_loopback('127.0.0.1') and address.is_loopback('localhost') and address.is_loopback('::1')
    assert not address.is_loopback('0.0.0.0') and not address.is_loopback('')
    r = Running(tmp_path, host='0.0.0.0', token='s3cret')
    r.close()


def test_build_server_from_config(tmp_path):
    config = {
        'online': {
            'remote': {'host': '127.0.0.1', 'port': 0},
            'server': {'buffer_dir': str(tmp_path / 'b'), 'drain_dir': str(tmp_path / 'd'), 'capacity': 8,
                       'force_sequential': True, 'sample_reuse_rate': 0, 'sample_reuse_threshold': 0},
        },
    }
    server = srv.build_server(config)
    try:
        assert server.store.capacity == 8 and server.store.force_sequential
        assert os.path.isdir(tmp_path / 'b') and os.path.isdir(tmp_path / 'd')
    finally:
        server.server_close()


def test_build_server_refuses_a_buffer_dir_it_cannot_empty_in_one_line(tmp_path):
    # a config of another run in the folder (fsutil.empty_dir refuses), a file where drain_dir's parent should be
    (tmp_path / 'b').mkdir()
    (tmp_path / 'b' / 'other.toml').write_text('')
    (tmp_path / 'file').write_text('')
    for dirs, shown in (({'buffer_dir': str(tmp_path / 'b'), 'drain_dir': str(tmp_path / 'd')},
                         f'refusing to empty {tmp_path / "b"}: it holds 1 config or checkpoint file(s)'),
                        ({'buffer_dir': str(tmp_path / 'b2'), 'drain_dir': str(tmp_path / 'file' / 'd')},
                         f"Not a directory: '{tmp_path / 'file' / 'd'}'")):
        config = {'online': {'remote': {'host': '127.0.0.1', 'port': 0},
                             'server': {**dirs, 'capacity': 8, 'force_sequential': False}}}
        with pytest.raises(srv.ServerStartError) as info:
            srv.build_server(config)
        assert str(info.value).startswith('[online.server] buffer_dir / drain_dir cannot be emptied: ')
        assert shown in str(info.value)
    assert os.listdir(tmp_path / 'b') == ['other.toml']


def test_concurrent_submissions_get_distinct_ids(running):
    errors = []

    def worker():
        try:
            for _ in range(5):
                submit_logs(running, ['same.json.gz'])
        except Exception as ex:  # pragma: no cover - reported below
            errors.append(ex)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    names = sorted(os.listdir(running.store.buffer_dir), key=lambda n: int(n.split('_')[0]))
    assert names == [f'{i}_same.json.gz' for i in range(20)]


# -- issue 13: poisoned parameters, unwritable dirs, memory before authentication, non-mjai logs ----------------

def brain_params(channels, blocks):
    from mortal.model.networks import DQN, Brain
    torch.manual_seed(0)
    return (wire.pack_state_dict(Brain(version=3, conv_channels=channels, num_blocks=blocks).state_dict()),
            wire.pack_state_dict(DQN(version=3).state_dict()))


@pytest.fixture
def roomy(tmp_path):
    r = Running(tmp_path, max_frame=64 << 20)  # room for real Brain parameters
    yield r
    r.close()


def test_parameters_of_another_architecture_are_refused(roomy, caplog):
    running = roomy
    m32, d = brain_params(32, 2)
    m16, _ = brain_params(16, 1)
    assert running.request({'type': 'submit_param', 'mortal': m32, 'dqn': d, 'is_idle': True})['param_version'] == 1
    # a 16-channel 1-block Brain against the 32x2 one accepted first: refused, naming the key and both shapes
    with pytest.raises(wire.RequestRefused) as err:
        running.request({'type': 'submit_param', 'mortal': m16, 'dqn': d, 'is_idle': True})
    first = next(k for k, v in signature.state_dict_signature(m32).items()
                 if signature.state_dict_signature(m16).get(k) != v)
    want, got = signature.state_dict_signature(m32)[first][1], signature.state_dict_signature(m16)[first][1]
    assert want != got
    reason = str(err.value)
    assert 'bad request' in reason and f"key {first!r} is F32 {list(got)}, expected F32 {list(want)}" in reason
    assert "field 'mortal'" in reason and 'arch_change' in reason
    rsp = get_param(running)
    assert rsp['param_version'] == 1 and rsp['mortal'] == m32  # still serving the first parameters
    # a dqn with an extra key is refused too (names the key)
    dqn_sd = wire.unpack_state_dict(d)
    dqn_sd['extra.weight'] = torch.zeros(2)
    with pytest.raises(wire.RequestRefused, match=r"field 'dqn'.*unexpected key 'extra.weight' \(F32 \[2\]\)"):
        running.request({'type': 'submit_param', 'mortal': m32, 'dqn': wire.pack_state_dict(dqn_sd)})
    # a deliberate change is accepted, logged, and becomes the new reference
    with caplog.at_level(logging.WARNING, logger='mortal.server'):
        rsp = running.request({'type': 'submit_param', 'mortal': m16, 'dqn': d, 'arch_change': True})
    assert rsp['param_version'] == 2 and 'architecture change accepted' in caplog.text
    assert get_param(running)['mortal'] == m16
    with pytest.raises(wire.RequestRefused, match=f'key {first!r} is F32 {list(want)}'.replace('[', r'\[')):
        running.request({'type': 'submit_param', 'mortal': m32, 'dqn': d})
    assert running.store.param_version == 2
    with pytest.raises(wire.RequestRefused, match="field 'arch_change' is a int"):
        running.request({'type': 'submit_param', 'mortal': m16, 'dqn': d, 'arch_change': 1})


@pytest.mark.parametrize('first', [True, False])
def test_empty_state_dicts_are_always_refused(running, first):
    m, d = tiny_params()
    if not first:
        submit_param(running)
    empty = wire.pack_state_dict({})
    for msg in ({'mortal': empty, 'dqn': d}, {'mortal': m, 'dqn': empty},
                {'mortal': empty, 'dqn': empty, 'arch_change': True}):
        with pytest.raises(wire.RequestRefused, match='is an empty state dict'):
            running.request({'type': 'submit_param', 'is_idle': True, **msg})
    assert running.store.param_version == (0 if first else 1)


def test_unwritable_buffer_dir_is_answered_error_and_logged_once(running, caplog):
    buf = running.store.buffer_dir
    os.rmdir(buf)
    with open(buf, 'wb'):  # a file where the directory should be: fails for root too
        pass
    with caplog.at_level(logging.INFO, logger='mortal.server'):
        for _ in range(3):
            reply = running.request({'type': 'submit_replay', 'logs': {'a': mjai()}, 'param_version': 0})
            assert reply['status'] == 'error'
            assert reply['reason'].startswith('buffer_dir not writable: [Errno 20] Not a directory')
        errors = [r for r in caplog.records if 'buffer_dir not writable' in r.getMessage()]
        assert len(errors) == 1 and errors[0].levelno == logging.ERROR and errors[0].exc_info is None
        assert running.store.buffer == {}
        os.remove(buf)
        os.mkdir(buf)
        assert submit_logs(running, ['b'])['status'] == 'ok'
        assert submit_logs(running, ['c'])['status'] == 'ok'
    assert caplog.text.count('writable again') == 1 and 'Traceback' not in caplog.text
    assert sorted(os.listdir(buf)) == ['3_b', '4_c']


def test_drain_failing_midway_loses_and_duplicates_nothing(tmp_path, monkeypatch, caplog):
    r = Running(tmp_path, capacity=10)
    try:
        submit_logs(r, ['a', 'b', 'c'])
        submit_logs(r, ['d'])
        names = ['0_a', '0_b', '0_c', '1_d']
        real_replace = os.replace
        calls = []

        def failing_replace(a, b):
            calls.append(b)
            if len(calls) >= 2:
                raise PermissionError(13, 'Permission denied', a)
            return real_replace(a, b)

        monkeypatch.setattr(replay_store.os, 'replace', failing_replace)
        with caplog.at_level(logging.INFO, logger='mortal.server'):
            for _ in range(2):
                reply = r.request({'type': 'drain'})
                assert reply['status'] == 'error' and 'Permission denied' in reply['reason']
                buffered, drained = os.listdir(r.store.buffer_dir), os.listdir(r.store.drain_dir)
                assert sorted(buffered + drained) == names  # each log in exactly one place
                assert drained == ['0_a']
            assert caplog.text.count('drain from buffer_dir to drain_dir failed') == 1
            assert get_param(r)['status'] == 'empty param'  # still serving; nothing counted twice or lost
            assert len(r.store.buffer) + len(r.store.pending) == 4
            monkeypatch.undo()
            reply = r.request({'type': 'drain'})
        assert reply['status'] == 'ok' and reply['files'] == names and reply['count'] == 4
        assert sorted(os.listdir(r.store.drain_dir)) == names and os.listdir(r.store.buffer_dir) == []
        assert 'drain works again' in caplog.text
        assert r.request({'type': 'drain'})['count'] == 0
    finally:
        r.close()


def test_cross_device_move_never_leaves_a_log_in_both_places(tmp_path, monkeypatch):
    src, dst = tmp_path / 'src', tmp_path / 'dst'
    src.write_bytes(b'log')
    real_replace, real_remove = os.replace, os.remove

    def replace(a, b):
        if str(a) == str(src):
            raise OSError(errno.EXDEV, 'Invalid cross-device link')
        return real_replace(a, b)

    def remove(p):
        if str(p) == str(src):
            raise PermissionError(13, 'Permission denied', p)
        return real_remove(p)

    monkeypatch.setattr(replay_store.os, 'replace', replace)
    monkeypatch.setattr(replay_store.os, 'remove', remove)
    with pytest.raises(PermissionError):
        replay_store._move(str(src), str(dst))
    assert sorted(os.listdir(tmp_path)) == ['src']  # the copy was taken back
    monkeypatch.setattr(replay_store.os, 'remove', real_remove)
    replay_store._move(str(src), str(dst))
    assert sorted(os.listdir(tmp_path)) == ['dst'] and dst.read_bytes() == b'log'


@pytest.mark.parametrize('content, reason', [
    (b'content of a', 'first line is not JSON'),
    (gzip.compress(b'hello\n{"type": "start_game"}\n'), 'first line is not JSON'),
    (gzip.compress(b'{"type": "start_kyoku"}\n'), "first event is 'start_kyoku'"),
    (gzip.compress(b'[1, 2]\n'), 'first event is None'),
    (gzip.compress(b'\xff\xfe\n'), 'first line is not JSON'),
    (b'\x1f\x8b' + b'\x00' * 20, 'corrupt gzip data'),
    (gzip.compress(b'{' + b' ' * (10 << 20)), 'its first line does not end within its first 65536 bytes'),  # bomb
    (b'', 'first line is not JSON'),
], ids=['plain-text', 'gz-text', 'gz-start_kyoku', 'gz-list', 'gz-not-utf8', 'corrupt-gz', 'gz-bomb', 'empty'])
def test_non_mjai_logs_are_refused_and_nothing_is_stored(running, content, reason):
    with pytest.raises(wire.RequestRefused, match=f"bad request: log 'b' is not an mjai log: {reason}"):
        running.request({'type': 'submit_replay', 'logs': {'a': mjai(), 'b': content}, 'param_version': 0})
    assert os.listdir(running.store.buffer_dir) == [] and running.store.buffer == {}


def test_plain_and_blank_led_mjai_logs_are_accepted(running):
    logs = {'plain': mjai(compress=False), 'blank': gzip.compress(b'\n\n' + mjai(compress=False))}
    assert running.request({'type': 'submit_replay', 'logs': logs, 'param_version': 0})['count'] == 2


def read_reply(sock, timeout):
    sock.settimeout(timeout)
    return wire.recv_msg(sock)


def test_wrong_token_is_refused_before_the_payload_is_read(tmp_path):
    r = Running(tmp_path, token='s3cret')
    try:
        with socket.create_connection(('127.0.0.1', r.port), timeout=5) as s:
            # a header announcing a maximal payload that never comes: answered at once, not after the payload
            s.sendall(frame(b'', length=MAX_FRAME, token='guess'))
            t0 = time.monotonic()
            reply = read_reply(s, 2)
            assert reply == {'status': 'unauthorized', 'reason': 'missing or wrong token'}
            assert time.monotonic() - t0 < 2
        # a large request with a wrong token still gets its 'unauthorized' (the server drops what it sends)
        wrong = wire.Remote('127.0.0.1', r.port, token='guess', timeout=5, max_frame_size=MAX_FRAME)
        with pytest.raises(wire.RequestRefused, match='unauthorized'):
            wrong.request({'type': 'submit_replay', 'logs': {'a': os.urandom(900_000)}, 'param_version': 0})
        # the token travels in no frame; the right one works
        assert b's3cret' not in wire.encode_frame({'type': 'drain'}, token='s3cret')
        assert r.request({'type': 'drain'})['status'] == 'ok'
        wait_until(lambda: r.server.pending == 0)  # the refused connections' slots are free again
        assert r.server.inflight.used == 0
    finally:
        r.close()



def test_unauthenticated_connections_are_capped_and_the_oldest_gives_way(tmp_path, caplog):
    r = Running(tmp_path, max_pending=3)
    try:
        idle = [socket.create_connection(('127.0.0.1', r.port), timeout=5) for _ in range(3)]
        idle[0].sendall(b'MJRL')  # a partial header
        wait_until(lambda: r.server.pending == 3)
        with caplog.at_level(logging.INFO, logger='mortal.server'):
            # a real peer still gets through: the oldest unauthenticated connection is closed for it
            assert get_param(r) == {'status': 'empty param'}
            assert idle[0].recv(10) == b''  # closed, without a reply
            assert r.server.pending == 2
            idle.append(socket.create_connection(('127.0.0.1', r.port), timeout=5))
            wait_until(lambda: r.server.pending == 3)
            assert get_param(r) == {'status': 'empty param'}
            assert idle[1].recv(10) == b''
            assert r.server.pending == 2
            assert 'closing connection' not in caplog.text  # the closed ones are not logged one by one
            for s in idle:
                s.close()
            wait_until(lambda: r.server.pending == 0)
        assert caplog.text.count('connections are still sending their frame header') == 1
        assert 'accepting new connections again (2 oldest closed meanwhile)' in caplog.text
    finally:
        r.close()


def test_header_must_arrive_in_time(tmp_path, caplog):
    r = Running(tmp_path, header_timeout=0.5)
    try:
        with caplog.at_level(logging.WARNING, logger='mortal.server'):
            with socket.create_connection(('127.0.0.1', r.port), timeout=5) as s:
                t0 = time.monotonic()
                data = frame(msgpack.packb({'type': 'drain'}))
                closed = False
                for i in range(20):  # one byte every 0.1 s: each recv is quick, the whole header is not
                    try:
                        s.sendall(data[i:i + 1])
                    except OSError:
                        closed = True
                        break
                    time.sleep(0.1)
                s.settimeout(5)
                assert closed or s.recv(10) == b''
                assert time.monotonic() - t0 < 3
        assert 'header incomplete after the time allowed' in caplog.text
        assert r.server.pending == 0
    finally:
        r.close()


def test_payloads_in_flight_share_one_byte_budget(tmp_path):
    r = Running(tmp_path, max_inflight_bytes=MAX_FRAME)
    try:
        msg = {'type': 'get_param', 'param_version': -1, 'pad': b''}
        msg['pad'] = b'x' * (MAX_FRAME - len(msgpack.packb({**msg, 'pad': b'x' * 70000})) + 70000)
        big = frame(msgpack.packb(msg))
        length = len(big) - wire.HEADER_SIZE
        assert length == MAX_FRAME  # the whole budget: any other payload must wait
        with socket.create_connection(('127.0.0.1', r.port), timeout=5) as a, \
                socket.create_connection(('127.0.0.1', r.port), timeout=5) as b:
            a.sendall(big[:wire.HEADER_SIZE])
            time.sleep(0.2)
            assert r.server.inflight.used == 0  # a declared length holds nothing: bytes are held as they come
            a.sendall(big[wire.HEADER_SIZE:-1000])  # holds nearly the whole budget
            wait_until(lambda: r.server.inflight.used == length - 1000)
            # a payload above SMALL_FRAME_BYTES waits for the budget; a small one has a share of its own
            b.sendall(frame(msgpack.packb({'type': 'get_param', 'param_version': -1,
                                           'pad': b'x' * param_server.SMALL_FRAME_BYTES})))
            with pytest.raises(socket.timeout):
                read_reply(b, 0.5)  # waits for the budget
            assert get_param(r) == {'status': 'empty param'}
            a.sendall(big[-1000:])  # the frame that holds bytes is served before the one waiting for its first
            assert read_reply(a, 5) == {'status': 'empty param'}
            assert read_reply(b, 5) == {'status': 'empty param'}
        wait_until(lambda: r.server.inflight.used == 0)
    finally:
        r.close()
    with pytest.raises(ConfigError, match=r'max_inflight_bytes = 1000 in .* must be 0 or at least \[online.server\] '
                                          r'max_frame_bytes = 4096'):  # the config check: a largest frame must fit
        load_tiny_config(tmp_path, **{'online.server': {'max_frame_bytes': 4096, 'max_inflight_bytes': 1000}})


def test_frames_that_wait_on_each_other_for_budget_are_resolved_at_once():
    budget = param_server.ByteBudget(100)
    assert budget.acquire(60, 1) and budget.acquire(30, 1)  # frames A and B hold 60 and 30 bytes
    assert (budget.used, budget.holders) == (90, 2)
    got = {}

    def more(name, size, held):
        t0 = time.monotonic()
        got[name] = (budget.acquire(size, 5, held=held), time.monotonic() - t0)
    a = threading.Thread(target=more, args=('a', 20, 60))
    a.start()
    time.sleep(0.3)
    assert 'a' not in got  # B is not waiting (it reads or is handled): A waits for it
    new = threading.Thread(target=more, args=('new', 5, 0))
    new.start()
    time.sleep(0.1)
    assert 'new' not in got  # 5 bytes would fit, but A, holding bytes, is served first
    more('b', 20, 30)  # now both holders wait for more and A's 20 do not fit: B, holding least, is refused
    assert got['b'][0] is False and got['b'][1] < 0.1
    budget.release(30, held=0)  # B's connection closes
    a.join(5)
    new.join(5)
    assert got['a'][0] is True and got['new'][0] is True
    assert (budget.used, budget.holders) == (85, 2)


# -- one learner per server (issue 35, case 1) ----------------------------------------------------------------------

def test_a_second_learners_parameters_are_refused_while_the_first_is_live(tmp_path, caplog):
    """Two learners (their runs: host and state file) on one server: the second's submit_param is refused with
    'another learner is live', naming the first, until the first has been silent for the liveness window; the
    first's restarts (same run) and a peer that sends no 'learner' are taken as before."""
    import time as _time
    from mortal.learning.server_traffic import ServerTraffic
    store = replay_store.ReplayStore(tmp_path / 'buffer', tmp_path / 'drain', 4, learner_liveness=0.5)
    mortal, dqn = tiny_params()
    params = {'mortal': mortal, 'dqn': dqn}

    def submit(learner, **extra):
        msg = {'type': 'submit_param', **params, 'is_idle': True, **extra}
        if learner is not None:
            msg['learner'] = learner
        return store.handle(msg)

    assert submit('h:/run1/mortal.pth')['status'] == 'ok'
    refused = submit('h:/run2/mortal.pth')
    assert refused['status'] == wire.STATUS_OTHER_LEARNER == 'another learner is live'
    assert 'learner h:/run1/mortal.pth submitted parameters 0 s ago' in refused['reason']
    assert store.param_version == 1
    assert submit('h:/run1/mortal.pth')['param_version'] == 2  # the first learner restarted by its supervisor
    # a peer without the field while an identified learner is live: refused as another learner would be
    anonymous = submit(None)
    assert anonymous['status'] == 'another learner is live'
    assert 'learner h:/run1/mortal.pth submitted parameters 0 s ago' in anonymous['reason']
    assert '(this one is a learner without an id)' in anonymous['reason']
    assert store.param_version == 2
    _time.sleep(0.6)
    assert submit(None)['param_version'] == 3  # no learner identified within the window: an older learner
    assert submit('h:/run2/mortal.pth')['param_version'] == 4  # the first went silent: the second takes over
    assert submit('h:/run1/mortal.pth')['status'] == 'another learner is live'
    # the learner's id: its host and state file, the same across the supervisor's restarts
    traffic = ServerTraffic(None, state_file=str(tmp_path / 'mortal.pth'), sleep=None, writer=None)
    assert traffic.learner_id() == f'{socket.gethostname()}:{tmp_path / "mortal.pth"}'


@pytest.mark.parametrize('learner', ['evil\n2026-12-04 21:00:00,000 ERROR mortal.server: FAKE LINE',
                                     'red \x1b[31m text', 'tab\there', 'bell\x07', 'nul\x00', 'del\x7f',
                                     'line\u2028separator', 'bidi\u202eoverride'])
def test_a_learner_id_with_control_characters_is_a_bad_request_and_forges_no_log_line(tmp_path, caplog, learner):
    """submit_param's 'learner' is logged: a newline, an ANSI escape or another non-printable character is
    refused as a bad request (its reason shows it escaped), and nothing of it reaches the log raw."""
    store = replay_store.ReplayStore(tmp_path / 'buffer', tmp_path / 'drain', 4)
    mortal, dqn = tiny_params()
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(replay_store.BadRequest, match="field 'learner' must be printable characters only") as ex:
            store.handle({'type': 'submit_param', 'mortal': mortal, 'dqn': dqn, 'learner': learner})
    assert ascii(learner) in str(ex.value) and learner not in str(ex.value)
    assert store.param_version == 0 and store.learner is None
    assert learner not in caplog.text
    # a printable id, non-ASCII letters included (a state file under such a folder), is taken
    ok = store.handle({'type': 'submit_param', 'mortal': mortal, 'dqn': dqn, 'learner': 'h\u00f4te:/r\u00e9p/m.pth'})
    assert ok['status'] == 'ok' and store.learner == 'h\u00f4te:/r\u00e9p/m.pth'


def test_a_second_learner_on_one_server_exits_naming_the_first(tmp_path, caplog):
    """End to end over TCP: a learner submits; a second learner of another state file ends with status 2 and one
    error line naming the first; a restart of the first (a fresh Trainer of its config) is accepted."""
    from conftest import fake_trainer, load_tiny_config, start_param_server, stop_server
    server = start_param_server(tmp_path, 4)
    try:
        port = server.server_address[1]
        remote = wire.Remote('127.0.0.1', port)
        (tmp_path / 'a').mkdir()
        (tmp_path / 'b').mkdir()
        first, _ = load_tiny_config(tmp_path / 'a', online=True)
        second, _ = load_tiny_config(tmp_path / 'b', online=True)
        fake_trainer(first, remote=remote).submit_param(is_idle=True)
        with caplog.at_level(logging.ERROR, logger='mortal.train'), pytest.raises(SystemExit) as info:
            fake_trainer(second, remote=remote).submit_param(is_idle=True)
        assert info.value.code == 2
        assert 'another learner is live' in caplog.text
        assert f"learner {socket.gethostname()}:{first['control']['state_file']} submitted" in caplog.text
        fake_trainer(first, remote=remote).submit_param(is_idle=True)  # the supervisor's restart
        assert server.store.param_version == 2
    finally:
        stop_server(server)


def test_a_full_buffer_without_drains_says_that_the_clients_wait(running, caplog):
    # issue 36: with the trainer stopped the server said nothing while its clients waited
    server, store = running.server, running.store
    now = [store.last_drain]
    server.clock = lambda: now[0]
    with caplog.at_level(logging.WARNING, logger='mortal.net.param_server'):
        now[0] += 61
        server.service_actions()  # the buffer has room: the clients play on
        assert store.submit_replay({f'l{i}': mjai() for i in range(4)}, 0)['status'] == 'ok'  # capacity 4: full
        server.service_actions()
        now[0] += 30
        server.service_actions()  # said 30 s ago
        now[0] += 31
        server.service_actions()
        store.drain()  # the trainer is back
        now[0] += 30
        server.service_actions()
    said = [r.getMessage() for r in caplog.records if 'no drain' in r.getMessage()]
    assert said == ['no drain for 1 min and the buffer is full (4 logs, capacity 4): the clients wait until the '
                    'trainer drains it (is it running? its log says why)',
                    'no drain for 2 min and the buffer is full (4 logs, capacity 4): the clients wait until the '
                    'trainer drains it (is it running? its log says why)']


def test_a_drain_names_the_claimed_logs_left_from_before(tmp_path, caplog):
    """An epoch after a drain trains the drained logs and those an earlier epoch left partly trained: the learner
    says so, so that the 'file list size' after 'drained N logs' adds up (a new user's trial)."""
    from types import SimpleNamespace
    from mortal.learning.server_traffic import ServerTraffic
    traffic = ServerTraffic(None, state_file=str(tmp_path / 'mortal.pth'), sleep=None, writer=None)
    traffic.resumed = True  # past the first epoch's resume
    traffic.drain = lambda steps, resubmit: ['d/b.json.gz', 'd/c.json.gz']
    for pending, line in ((['d/a.json.gz', 'd/b.json.gz', 'd/c.json.gz'], 'with 1 claimed logs left from before: 3 '
                           'to train'), (['d/b.json.gz', 'd/c.json.gz'], None)):
        traffic.ledger = SimpleNamespace(pending=lambda pending=pending: pending)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger='mortal.train'):
            assert traffic.online_files(7, None) == (pending, ['trainee'])
        assert [r.getMessage() for r in caplog.records] == ([line] if line else [])
