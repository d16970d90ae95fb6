"""Regression tests for a hostile review of the reliability work: a corrupted claim manifest, claimed names that
point outside the claim folder, loader workers orphaned by a SIGKILL race, a second server start, a stalled
upload, memory of pathological logs, a server/reader disagreement on log heads, and oversized frames."""

import gzip
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from conftest import DATA_DIR, ROOT, load_tiny_config, start_param_server, stop_server
from mortal.data import claims
from mortal.data.claims import MANIFEST, ClaimLedger

SIG = {'version': 3, 'player_names': ['trainee'], 'num_epochs': 1, 'enable_augmentation': False,
       'augmented_first': False}
HANCHAN = DATA_DIR / 'riichienv_selfplay_hanchan.jsonl'


def _manifest(files, passes=1):
    return json.dumps({'format': 1, 'signature': SIG, 'passes': passes, 'files': files})


def _claim_dir(tmp_path, manifest_text, logs=('a',)):
    d = tmp_path / 'drain.trainer'
    d.mkdir()
    for name in logs:
        (d / name).write_bytes(b'x')
    (d / MANIFEST).write_text(manifest_text)
    return d


# -- D1: malformed manifest entries ---------------------------------------------------------------------------

@pytest.mark.parametrize('entry', [
    {'0': {'total': 'many', 'trained': []}},
    5,
    [1],
    {'0': {'trained': []}},
    {'0': {'total': 3, 'trained': None}},
    {'0': {'total': 3, 'trained': 'xyz'}},
    {'0': {'total': 3, 'trained': [7]}},
    {'0': [1, 2]},
    {'x': 'done'},
    {'-1': 'done'},
    {'1': 'done'},
    {'0': {'total': 10 ** 30, 'trained': []}},
    {'0': {'total': True, 'trained': []}},
])
def test_malformed_manifest_entry_resumes_that_log_whole_with_one_warning(tmp_path, caplog, entry):
    d = _claim_dir(tmp_path, _manifest({'a': entry, 'b': {'0': {'total': 4, 'trained': [0, 1]}}}), logs=('a', 'b'))
    with caplog.at_level(logging.WARNING, logger='mortal.claims'):
        ledger = ClaimLedger.open(str(d), signature=SIG, passes=1)
    assert ledger.pending() == [str(d / 'a'), str(d / 'b')]
    assert ledger.trained_map() == {str(d / 'b'): {0: {0, 1}}}  # the good entry keeps its progress
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and MANIFEST in warnings[0] and "'a'" in warnings[0], warnings
    # the rewritten manifest is clean again
    assert json.loads((d / MANIFEST).read_text())['files'] == {'a': {}, 'b': {'0': {'total': 4, 'trained': [0, 1]}}}


def test_absurd_total_of_a_gone_log_is_not_counted_dropped(tmp_path):
    d = _claim_dir(tmp_path, _manifest({'gone': {'0': {'total': 10 ** 30, 'trained': []}},
                                         'gone2': {'0': {'total': 5, 'trained': [1]}}}), logs=())
    ledger = ClaimLedger.open(str(d), signature=SIG, passes=1)
    assert ledger.lost_samples == 4  # gone2's four; the corrupt total counts nothing
    assert ledger.end_epoch() == 4
    assert claims.MAX_SAMPLES < 10 ** 30


@pytest.mark.parametrize('text', ['[]', '"x"', '5', 'null', _manifest([1, 2]), '{not json'])
def test_unreadable_manifest_resumes_the_folder_whole(tmp_path, caplog, text):
    d = _claim_dir(tmp_path, text, logs=('a',))
    with caplog.at_level(logging.WARNING, logger='mortal.claims'):
        ledger = ClaimLedger.open(str(d), signature=SIG, passes=1)
    assert ledger.pending() == [str(d / 'a')]
    assert any('unreadable' in r.getMessage() for r in caplog.records)


# -- D2: claimed names outside the folder ---------------------------------------------------------------------

@pytest.mark.parametrize('kind', ['dotdot', 'absolute', 'manifest', 'tmp', 'symlink', 'dir', 'nul', 'dot'])
def test_claimed_names_never_reach_outside_the_claim_folder(tmp_path, caplog, kind):
    victim_dir = tmp_path / 'victim'
    victim_dir.mkdir()
    victim = victim_dir / 'precious.json.gz'
    victim.write_bytes(b'keep me')
    d = tmp_path / 'drain.trainer'
    d.mkdir()
    name = {'dotdot': '../victim/precious.json.gz', 'absolute': str(victim), 'manifest': MANIFEST,
            'tmp': MANIFEST + '.tmp', 'symlink': 'link', 'dir': 'sub', 'nul': 'a\0b', 'dot': '.'}[kind]
    if kind == 'symlink':
        os.symlink(victim, d / 'link')
    if kind == 'dir':
        (d / 'sub').mkdir()
    (d / 'ok').write_bytes(b'x')
    (d / MANIFEST).write_text(_manifest({name: {'0': 'done'}, 'ok': {}}))
    with caplog.at_level(logging.WARNING, logger='mortal.claims'):
        ledger = ClaimLedger.open(str(d), signature=SIG, passes=1)
    assert ledger.names() == {'ok'}
    assert ledger.pending() == [str(d / 'ok')]
    assert ledger.commit_with(0, lambda: None) == 0
    assert victim.read_bytes() == b'keep me'
    assert any(repr(name) in r.getMessage() for r in caplog.records)
    if kind == 'symlink':
        assert os.path.islink(d / 'link')  # left alone (the next claim of train.py clears the folder)
    assert name not in json.loads((d / MANIFEST).read_text())['files']


def test_epoch_paths_outside_the_claim_folder_are_not_tracked(tmp_path):
    d = tmp_path / 'drain.trainer'
    ledger = ClaimLedger.open(str(d), signature=SIG, passes=1)
    ledger.add(['a'])
    (d / 'a').write_bytes(b'x')
    ledger.begin_epoch([str(tmp_path / 'elsewhere' / 'a'), str(d / 'a')])
    ledger.record([[0, 0, 0, 1], [1, 0, 0, 1]])
    assert ledger.duplicates == 0
    assert ledger.files['a'] == {0: 'done'}


# -- D3: a worker forked just before its learner and fork server were killed ----------------------------------

_FAKE_FORKSERVER = r'''
import os, sys, time
import mortal.util._forkserver_preload  # as the real fork server's first preload: dies with the learner
from mortal.data.dataloader import worker_init_fn
gate, pidfile = sys.argv[1], sys.argv[2]
pid = os.fork()
if pid == 0:
    # a freshly forked worker held before its worker_init_fn (the race: SIGSTOP here, SIGKILL the learner)
    while not os.path.exists(gate):
        time.sleep(0.01)
    worker_init_fn(0)
    time.sleep(120)  # only reached by a survivor
    os._exit(0)
with open(pidfile + '.tmp', 'w') as f:
    f.write(f'{os.getpid()} {pid}')
os.replace(pidfile + '.tmp', pidfile)
time.sleep(600)
'''

_FAKE_LEARNER = r'''
import os, subprocess, sys, time
os.environ['MORTAL_LOADER_PARENT_PID'] = str(os.getpid())  # as safe_mp_context does before the fork server starts
subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], sys.argv[3]])
time.sleep(600)
'''


def _alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except (FileNotFoundError, ProcessLookupError):
        return False


def _ppid(pid):
    with open(f'/proc/{pid}/stat') as f:
        return int(f.read().rsplit(')', 1)[1].split()[1])


def _wait(cond, seconds, step=0.02):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='PR_SET_PDEATHSIG is Linux only')
@pytest.mark.timeout(120)
def test_worker_whose_fork_server_died_before_its_init_exits_at_once(tmp_path):
    gate, pidfile = tmp_path / 'go', tmp_path / 'pids'
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}
    learner = subprocess.Popen([sys.executable, '-c', _FAKE_LEARNER, _FAKE_FORKSERVER, str(gate), str(pidfile)],
                               env=env, cwd=tmp_path)
    fs = worker = None
    try:
        assert _wait(pidfile.exists, 90), 'the fake fork server never forked its worker'
        fs, worker = map(int, pidfile.read_text().split())
        learner.kill()
        learner.wait()
        assert _wait(lambda: not _alive(fs), 5), 'the fork server outlived the learner'
        assert _wait(lambda: _ppid(worker) != fs, 5)  # the worker was re-parented before its init ran
        gate.write_text('go')
        assert _wait(lambda: not _alive(worker), 5), 'the orphaned worker survived its worker_init_fn'
    finally:
        learner.kill()
        for pid in (fs, worker):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# -- D4: a second server with the same config ------------------------------------------------------------------

@pytest.mark.slow
def test_second_server_with_the_same_config_fails_on_the_port_and_keeps_the_buffer(tmp_path):
    from mortal import server as srv
    from mortal.net import wire

    dirs = {'buffer_dir': str(tmp_path / 'buffer'), 'drain_dir': str(tmp_path / 'drain'), 'capacity': 8,
            'force_sequential': False}  # a loaded config always holds it (a required key)
    first = srv.build_server({'online': {'remote': {'host': '127.0.0.1', 'port': 0}, 'server': dirs}})
    port = first.server_address[1]
    thread = threading.Thread(target=first.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        remote = wire.Remote('127.0.0.1', port, timeout=10)
        log = HANCHAN.read_bytes()
        assert remote.request({'type': 'submit_replay', 'logs': {'a.json': log, 'b.json': log}})['status'] == 'ok'
        before = sorted(os.listdir(tmp_path / 'buffer'))
        assert len(before) == 2
        _, config_path = load_tiny_config(tmp_path, port=port)
        env = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}
        second = subprocess.run([sys.executable, '-m', 'mortal.server', '-c', str(config_path)], env=env,
                                cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert 'Traceback' not in second.stderr
        errors = [line for line in second.stderr.splitlines() if ' ERROR ' in line]
        assert len(errors) == 1 and f'cannot listen on 127.0.0.1:{port}' in errors[0], second.stderr
        assert 'already running' in errors[0]
        assert sorted(os.listdir(tmp_path / 'buffer')) == before
        reply = remote.request({'type': 'drain'})
        assert reply['count'] == 2
    finally:
        first.shutdown()
        first.server_close()


# -- D5: a connection that trickles its payload; minor: an oversized frame ------------------------------------

def _header(length, token=None):
    from mortal.net import wire
    signed = wire.PREFIX.pack(wire.MAGIC, wire.PROTOCOL_VERSION) + struct.pack('<Q32s', length, b'\0' * 32)
    return signed + wire._mac(token, signed)


@pytest.fixture
def small_server(tmp_path):
    from mortal.net import wire
    server = start_param_server(tmp_path, 4, max_frame_size=1 << 20, timeout=5, payload_min_rate=1 << 20)
    server.remote = wire.Remote('127.0.0.1', server.server_address[1], timeout=10, max_frame_size=1 << 24)
    yield server
    stop_server(server)


@pytest.mark.slow
def test_a_trickling_upload_neither_delays_get_param_nor_lives_past_its_deadline(small_server, caplog):
    port = small_server.server_address[1]
    staller = socket.create_connection(('127.0.0.1', port), timeout=10)
    staller.sendall(_header(1 << 20))  # claims the whole in-flight budget, then sends a byte every 0.3 s
    stop = threading.Event()
    closed_at = []

    def trickle():
        while not stop.wait(0.3):
            try:
                staller.sendall(b'x')
            except OSError:
                closed_at.append(time.monotonic())
                return

    start = time.monotonic()
    threading.Thread(target=trickle, daemon=True).start()
    try:
        time.sleep(0.5)
        t = time.monotonic()
        reply = small_server.remote.request({'type': 'get_param', 'param_version': -1})
        assert reply['status'] == 'empty param'
        assert time.monotonic() - t < 1.5
        # 1 MiB/s over each 2 s window: closed at the first window's end (a recv sees EOF or a reset)
        staller.settimeout(8)
        try:
            assert staller.recv(1) == b''
        except ConnectionResetError:
            pass
        assert time.monotonic() - start < 5
        assert any('payload stalled' in r.getMessage() for r in caplog.records)
    finally:
        stop.set()
        staller.close()


def test_an_authentic_oversized_frame_is_answered_with_the_limit(small_server):
    from mortal.net import wire
    log = HANCHAN.read_bytes()
    msg = {'type': 'submit_replay', 'logs': {f'{i}.json': log for i in range(20)}}
    assert len(wire.encode_frame(msg)) > 1 << 20
    with pytest.raises(wire.RequestRefused, match=r"max_frame_bytes = 1048576"):
        small_server.remote.request(msg)

    def no_retry(seconds):
        raise AssertionError('request_with_retry retried a frame that can never fit')
    with pytest.raises(wire.RequestRefused, match='max_frame_bytes'):
        wire.request_with_retry(small_server.remote, msg, sleep=no_retry)


def test_an_oversized_frame_with_a_wrong_mac_gets_no_reply(tmp_path):
    server = start_param_server(tmp_path, 4, token='s3cret', max_frame_size=1024, timeout=5)
    try:
        with socket.create_connection(('127.0.0.1', server.server_address[1]), timeout=5) as s:
            s.sendall(_header(4096, token='wrong'))
            s.shutdown(socket.SHUT_WR)
            assert s.recv(100) == b''
    finally:
        stop_server(server)


# -- D6: memory of pathological logs; server and reader agree on log heads ------------------------------------

def _hanchan_lines():
    return HANCHAN.read_text(encoding='utf-8').rstrip('\n').split('\n')


def test_blank_lines_cost_no_memory_per_line_and_keep_line_numbers():
    import tracemalloc
    from mortal.data.mjai_log import BadLogError, parse_log
    lines = _hanchan_lines()
    reference = parse_log('\n'.join(lines) + '\n')
    padded = lines[0] + '\n' + '\n' * 4_000_000 + ' \r\n' * 1000 + '\n'.join(lines[1:]) + '\n'
    tracemalloc.start()
    try:
        log = parse_log(padded)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # a list of 4M lines alone is 32 MB
    assert log.events == reference.events and log.lines == reference.lines
    assert log.line_numbers[:2] == [1, 4_001_002] and log.line_numbers[-1] == 4_001_000 + len(lines)
    bad = lines[0] + '\n' + '\n' * 1000 + 'not json\n'
    with pytest.raises(BadLogError) as e:
        parse_log(bad)
    assert e.value.line == 1002


@pytest.mark.slow
def test_a_log_of_too_many_events_is_skipped_with_bounded_memory():
    import tracemalloc
    from mortal.data.mjai_log import MAX_EVENTS, BadLogError, parse_log
    lines = _hanchan_lines()
    raw = lines[0] + '\n' + '{"type":"none"}\n' * (2 * MAX_EVENTS) + '\n'.join(lines[1:]) + '\n'
    tracemalloc.start()
    try:
        with pytest.raises(BadLogError, match=f'more than {MAX_EVENTS:,} events') as e:
            parse_log(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.line == MAX_EVENTS + 1
    assert peak < 150 << 20, peak
    assert 1000 < len(lines) < MAX_EVENTS  # a real hanchan is far below the cap


@pytest.mark.parametrize('prefix', [b'\xef\xbb\xbf', b'\xef\xbb\xbf\n\n', b'\n' * 100])
@pytest.mark.parametrize('compress', [False, True])
def test_server_and_reader_agree_on_a_byte_order_mark_and_blank_lines(tmp_path, prefix, compress):
    from mortal.data.mjai_log import parse_log, read_log_text
    from mortal.net.replay_store import check_log_head
    content = prefix + HANCHAN.read_bytes()
    if compress:
        content = gzip.compress(content)
    check_log_head('x.json', content)  # accepted
    p = tmp_path / 'x.json'
    p.write_bytes(content)
    assert parse_log(read_log_text(p)).events == parse_log(HANCHAN.read_text(encoding='utf-8')).events


def test_server_names_leading_blank_lines_beyond_its_budget():
    from mortal.net.replay_store import FIRST_LINE_LIMIT, BadRequest, check_log_head
    log = HANCHAN.read_bytes()
    with pytest.raises(BadRequest) as e:
        check_log_head('x.json', b'\n' * FIRST_LINE_LIMIT + log)
    assert f'first {FIRST_LINE_LIMIT} bytes are blank lines' in str(e.value)
    assert 'no line ends' not in str(e.value)
    with pytest.raises(BadRequest) as e:
        check_log_head('x.json', b'\n' * (FIRST_LINE_LIMIT - 50) + log)
    assert f'after {FIRST_LINE_LIMIT - 50} bytes of leading blank lines' in str(e.value)
