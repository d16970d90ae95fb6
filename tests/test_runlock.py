"""The learner's lock over the supervisor's whole life, and lock files that are broken (issue 35 item 1)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, load_tiny_config, wait_until
from mortal.config import ONLINE_TRAIN_SECTIONS
from mortal.learning import supervisor
from mortal.util import runlock

linux_only = pytest.mark.skipif(not sys.platform.startswith('linux'), reason='/proc, FIFOs')


def _try_hold(target):
    """Whether another process can take the lock of ``target``: its output (the refusal, or 'took it')."""
    code = (f'import sys; sys.path.insert(0, {str(ROOT)!r})\n'
            'from mortal.util import runlock\n'
            'try:\n'
            f'    with runlock.hold({str(target)!r}, who="learner", key="[control] state_file", fix="-"):\n'
            '        print("took it")\n'
            'except runlock.LockHeld as e:\n'
            '    print("refused:", e)\n')
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60).stdout


@pytest.mark.slow
def test_a_second_trainer_in_the_pause_between_learners_is_refused(tmp_path):
    config, cfg = load_tiny_config(tmp_path, online=True)
    state = config['control']['state_file']
    counter, script = tmp_path / 'n', tmp_path / 'learner.py'
    script.write_text(
        f'import os, sys; sys.path.insert(0, {str(ROOT)!r})\n'
        'from mortal.util import runlock\n'
        f'p = {str(counter)!r}\n'
        'n = int(open(p).read()) if os.path.exists(p) else 0\n'
        f'with runlock.hold({state!r}, who="learner", key="[control] state_file", fix="-"):\n'
        '    open(p, "w").write(str(n + 1))\n'  # the child runs under its supervisor's hold
        'sys.exit(0 if n == 0 else 3)\n')
    seen = []

    def intrude():
        wait_until(counter.exists)
        seen.append(_try_hold(state))

    intruder = threading.Thread(target=intrude)
    intruder.start()
    try:
        code = supervisor.supervise([], script=str(script), restart_delay=3.0, config_path=str(cfg),
                                    required=ONLINE_TRAIN_SECTIONS, env={})
    finally:
        intruder.join(timeout=60)
    assert code == 3 and counter.read_text() == '2'  # the first supervisor kept running its learners
    [out] = seen
    assert out.startswith(f'refused: another learner runs on [control] state_file = {state}: PID {os.getpid()} ')
    assert runlock.holder_if_held(state) is None  # released at its end


def test_a_sigterm_during_the_config_check_starts_no_learner(tmp_path, monkeypatch):
    config, cfg = load_tiny_config(tmp_path, online=True)
    counter, script = tmp_path / 'n', tmp_path / 'learner.py'
    script.write_text(f'open({str(counter)!r}, "w").write("ran")\n')

    def check_then_term(path, required, env, **kw):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the config is checked
        time.sleep(0.1)
        return config

    monkeypatch.setattr(supervisor, 'wait_for_config', check_then_term)
    code = supervisor.supervise([], script=str(script), restart_delay=0.05, config_path=str(cfg),
                                required=ONLINE_TRAIN_SECTIONS, env={})
    assert code == 0 and not counter.exists()


@linux_only
def test_a_fifo_as_the_config_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / 'config.toml'
    os.mkfifo(fifo)
    code = (f'import sys; sys.path.insert(0, {str(ROOT)!r})\n'
            'from mortal.config import config_errors\n'
            f'print(config_errors({str(fifo)!r}, env={{}}))\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=30).stdout
    assert out == f"['config path {fifo} is not a regular file']\n"


def test_a_directory_in_place_of_the_lock_file_is_one_line(tmp_path):
    target = tmp_path / 'mortal.pth'
    os.mkdir(runlock.lock_path_for(str(target)))
    with pytest.raises(runlock.LockHeld) as info:
        with runlock.hold(str(target), who='learner', key='[control] state_file', fix='-'):
            pass
    assert str(info.value) == (f'cannot take the lock {target}.lock of [control] state_file = {target}: '
                               f"[Errno 21] Is a directory: '{target}.lock'")
    assert runlock.holder_if_held(str(target)) is None


@linux_only
def test_a_lock_that_cannot_be_made_is_no_false_holder():
    with pytest.raises(runlock.LockHeld) as info:
        with runlock.hold('/proc/mortal.pth', who='learner', key='[control] state_file', fix='-'):
            pass
    text = str(info.value)
    assert text.startswith('cannot take the lock /proc/mortal.pth.lock of [control] state_file = /proc/mortal.pth: ')
    assert 'another learner' not in text and '[Errno' in text


def test_a_read_only_folder_is_one_line(tmp_path, monkeypatch):
    class ReadOnly:
        def __init__(self, path):
            self.path = path

        def acquire(self, timeout):
            raise PermissionError(13, 'Permission denied', self.path)

    monkeypatch.setattr(runlock, 'FileLock', ReadOnly)
    target = tmp_path / 'mortal.pth'
    with pytest.raises(runlock.LockHeld, match=r"^cannot take the lock .*mortal\.pth\.lock of \[control\] "
                                               r"state_file = .*: \[Errno 13\] Permission denied"):
        with runlock.hold(str(target), who='learner', key='[control] state_file', fix='-'):
            pass


@pytest.mark.parametrize('record, shown', [
    ('{"pid": 12, "host": "h", "since": 1e300}', 'PID 12 on host h since an unknown time'),
    ('{"pid": 12, "host": "h", "since": Infinity}', 'PID 12 on host h since an unknown time'),
    ('{"pid": 12, "host": "h", "since": NaN}', 'PID 12 on host h since an unknown time'),
    ('{"pid": "' + '7' * 5_000_000 + '", "host": "h", "since": 0}', 'PID ? on host ? since an unknown time'),
    ('{"pid": true, "host": ["h"], "since": 0}', 'PID ? on host ? since 1970-01-01 00:00:00 UTC'),
    ('{"pid": 12, "host": "' + 'h' * 1000 + '", "since": 0}',
     'PID 12 on host ' + 'h' * 200 + ' since 1970-01-01 00:00:00 UTC'),
], ids=['since-1e300', 'since-inf', 'since-nan', 'pid-5MB', 'wrong-types', 'host-1000'])
def test_a_broken_holder_record_is_shown_clipped_or_unknown(tmp_path, record, shown):
    lock_path = runlock.lock_path_for(str(tmp_path / 'mortal.pth'))
    with open(lock_path + runlock.OWNER_SUFFIX, 'w') as f:
        f.write(record)
    assert runlock.describe_holder(runlock._holder(lock_path)) == shown


def test_a_directory_in_place_of_the_holder_record_does_not_stop_the_holder(tmp_path):
    target = tmp_path / 'mortal.pth'
    os.mkdir(runlock.lock_path_for(str(target)) + runlock.OWNER_SUFFIX)
    with runlock.hold(str(target), who='learner', key='[control] state_file', fix='-') as lock_path:
        assert lock_path == f'{target}.lock'
        assert _try_hold(target).startswith('refused: another learner runs on [control] state_file = ')


def test_a_valid_record_is_read_back(tmp_path):
    lock_path = runlock.lock_path_for(str(tmp_path / 'mortal.pth'))
    with open(lock_path + runlock.OWNER_SUFFIX, 'w') as f:
        json.dump({'pid': 4242, 'host': 'box', 'since': 86400.0}, f)
    assert runlock.describe_holder(runlock._holder(lock_path)) == 'PID 4242 on host box since 1970-01-02 00:00:00 UTC'
