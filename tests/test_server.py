"""mortal/server.py over real sockets on 127.0.0.1 (port 0): requests, back-pressure, drain, faults."""

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
from mortal import wire

MAX_FRAME = 1 << 20


def tiny_params(scale=1.0):
    mortal = torch.nn.Conv1d(2, 3, 3)
    dqn = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in list(mortal.parameters()) + list(dqn.parameters()):
            p.fill_(scale)
    return wire.pack_state_dict(mortal.state_dict()), wire.pack_state_dict(dqn.state_dict())


class Running:
    def __init__(self, tmp_path, capacity=4, force_sequential=False, token=None, host='127.0.0.1'):
        self.store = srv.ReplayStore(tmp_path / 'buffer', tmp_path / 'drain', capacity, force_sequential)
        self.store.reset_dirs()
        self.server = srv.ParamServer((host, 0), self.store, token=token, max_frame_size=MAX_FRAME, timeout=5)
        self.port = self.server.server_address[1]
        self.remote = wire.Remote('127.0.0.1', self.port, token=token, timeout=5, max_frame_size=MAX_FRAME)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def request(self, msg):
        return self.remote.request(msg)

    def raw(self, data, *, close_write=True):
        """Send raw bytes; return what the server sent back before closing (b'' = closed without reply)."""
        with socket.create_connection(('127.0.0.1', self.port), timeout=5) as s:
            s.sendall(data)
            if close_write:
                s.shutdown(socket.SHUT_WR)
            chunks = []
            while True:
                c = s.recv(65536)
                if not c:
                    return b''.join(chunks)
                chunks.append(c)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


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
    logs = {n: f'content of {n}'.encode() for n in names}
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
    with open(os.path.join(buf, '1_a.json.gz'), 'rb') as f:
        assert f.read() == b'content of a.json.gz'


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
    store = srv.ReplayStore(tmp_path / 'buffer', tmp_path / 'drain', 4)
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


def test_failed_write_leaves_no_temp_file_and_counts_nothing(running, monkeypatch):
    real_replace = os.replace
    calls = []

    def failing_replace(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise OSError(28, 'No space left on device')
        return real_replace(a, b)

    monkeypatch.setattr(srv.os, 'replace', failing_replace)
    with pytest.raises(OSError):
        running.store.submit_replay({'a': b'1', 'b': b'2'}, 0)
    # the first log was renamed before the failure and is counted; the second left no temp file behind
    assert sorted(os.listdir(running.store.buffer_dir)) == ['0_a']
    assert list(running.store.buffer) == ['0_a']


def test_wrong_field_types_are_bad_requests(running):
    for msg, reason in [
        ({'type': 'get_param'}, "missing field 'param_version'"),
        ({'type': 'get_param', 'param_version': 'x'}, 'is a str'),
        ({'type': 'get_param', 'param_version': True}, 'is a bool'),
        ({'type': 'submit_param', 'mortal': b'junk', 'dqn': b'junk'}, 'invalid safetensors'),
        ({'type': 'submit_replay', 'logs': {'a': 'text'}, 'param_version': 0}, 'expected bytes'),
        ({'type': 'shutdown'}, "unknown request type 'shutdown'"),
    ]:
        with pytest.raises(wire.RequestRefused, match=reason):
            running.request(msg)
    assert get_param(running) == {'status': 'empty param'}  # nothing changed, still serving


def frame(payload: bytes, *, magic=b'MJRL', version=1, length=None):
    return struct.pack('<4sHQ', magic, version, len(payload) if length is None else length) + payload


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
            assert running.raw(data) == b''
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
    assert srv.is_loopback('127.0.0.1') and srv.is_loopback('localhost') and srv.is_loopback('::1')
    assert not srv.is_loopback('0.0.0.0') and not srv.is_loopback('')
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
