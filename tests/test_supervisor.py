"""The supervisor's restarts: its wait for a finished learner's process group (zombies, loader processes re-parented to
PID 1 and not yet reaped by it, count as gone, so a restart waits for no grace period and warns of nothing), and the
next learner started early, loading during the restart delay and let go after it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from mortal.learning import supervisor
from mortal.learning.supervisor import live_members

from conftest import ROOT

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='Linux /proc')


def _stat(proc, pid, comm, state, pgrp):
    (proc / str(pid)).mkdir()
    # pid (comm) state ppid pgrp session ...: a comm may hold spaces and parentheses
    (proc / str(pid) / 'stat').write_text(f'{pid} ({comm}) {state} 1 {pgrp} {pgrp} 0 -1 4194560 0\n')


def test_live_members_reads_state_and_group(tmp_path):
    _stat(tmp_path, 101, 'python', 'S', 100)
    _stat(tmp_path, 102, 'pt_data_worker', 'Z', 100)
    _stat(tmp_path, 103, 'a (b) c', 'R', 100)
    _stat(tmp_path, 104, 'python', 'S', 999)
    (tmp_path / 'self').mkdir()
    (tmp_path / '105').mkdir()  # gone between the listing and the read
    assert sorted(live_members(100, proc=str(tmp_path))) == [101, 103]
    assert live_members(999, proc=str(tmp_path)) == [104]
    assert live_members(100, proc=str(tmp_path / 'none')) is None


@pytest.mark.slow
def test_a_group_of_zombies_is_reaped_at_once(monkeypatch):
    """A group whose one member is a zombie another process has not reaped (as PID 1 leaves a learner's loader
    processes): no grace period, no warning; counted as live (the old check) it waits the grace and warns."""
    parent = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time\n'
                               'p = subprocess.Popen(["true"], start_new_session=True)\n'
                               'print(p.pid, flush=True)\n'
                               'time.sleep(30)\n'], stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while live_members(pgid) != [] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live_members(pgid) == []
        os.killpg(pgid, 0)  # the zombie keeps the group in existence for killpg
        warned = []
        monkeypatch.setattr(supervisor.logger, 'warning', lambda *a: warned.append(a))
        monkeypatch.setattr(supervisor, 'GROUP_GRACE', 0.5)
        t = time.monotonic()
        supervisor.reap_process_group(pgid)
        assert time.monotonic() - t < 0.3 and not warned
        monkeypatch.setattr(supervisor, 'live_members', lambda pgid: None)  # no /proc: killpg alone decides
        t = time.monotonic()
        supervisor.reap_process_group(pgid)
        assert time.monotonic() - t >= 0.5 and warned
    finally:
        parent.kill()
        parent.wait()


# A child that logs when it loads (warm, its monotonic clock and pid), when it is let go or given up (go), and when it
# exits; the third start exits 3, which ends the supervisor.
EARLY_CHILD = """import os, sys, time
from mortal.learning.supervisor import wait_for_go
log = open({log!r}, 'a')
def say(*words):
    log.write(' '.join(map(str, words)) + '\\n')
    log.flush()
ok = wait_for_go(lambda: say('warm', time.monotonic(), os.getpid()))
blocked = [line.split()[1] for line in open('/proc/self/status') if line.startswith('SigBlk')]
say('go', time.monotonic(), ok, 'MORTAL_START_FD' in os.environ, *blocked)
if not ok:
    sys.exit(0)
n = sum(line.startswith('go') for line in open({log!r}))
say('exit', time.monotonic())
sys.exit(0 if n < 3 else 3)
"""


def _lines(log):
    return [line.split() for line in log.read_text().splitlines()]


def _run_supervisor(tmp_path, child_text, patch='', delay=1.0):
    """``supervise`` with ``early_start`` in a process of its own (its stderr piped), on a child of ``child_text``;
    ``patch``: code run before it."""
    script = tmp_path / 'child.py'
    script.write_text(child_text)
    runner = tmp_path / 'runner.py'
    runner.write_text('import logging, os, signal, sys\n'
                      'logging.basicConfig(level=logging.INFO)\n'
                      # Python leaves SIGINT ignored where its parent ignored it (a job started with &): not here
                      'signal.signal(signal.SIGINT, signal.default_int_handler)\n'
                      'from mortal.learning import supervisor\n'
                      f'{patch}\n'
                      f'sys.exit(supervisor.supervise([], script={str(script)!r}, restart_delay={delay}, '
                      'early_start=True))\n')
    return subprocess.Popen([sys.executable, str(runner)], env={**os.environ, 'PYTHONPATH': str(ROOT)},
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_an_early_start_loads_during_the_delay_and_trains_only_after_it(tmp_path):
    log = tmp_path / 'log'
    script = tmp_path / 'child.py'
    script.write_text(EARLY_CHILD.format(log=str(log)))
    code = supervisor.supervise([], script=str(script), restart_delay=1.0, early_start=True)
    lines = _lines(log)
    assert code == 3
    assert [w[0] for w in lines] == ['warm', 'go', 'exit'] * 3
    # let go; the pipe's variable popped; no signal blocked (a learner that inherited a mask would ignore its stop)
    assert all(w[2:] in (['True', 'False'], ['True', 'False', '0000000000000000']) for w in lines if w[0] == 'go')
    for before, after in ((lines[2], lines[3:5]), (lines[5], lines[6:8])):
        exited = float(before[1])
        warm, go = float(after[0][1]), float(after[1][1])
        assert warm - exited < 0.9  # loaded inside the 1 s delay, not after it
        assert go - exited >= 1.0  # and let go only once the delay had passed


@pytest.mark.slow
def test_without_early_start_the_next_learner_starts_after_the_delay(tmp_path):
    log = tmp_path / 'log'
    script = tmp_path / 'child.py'
    script.write_text(EARLY_CHILD.format(log=str(log)))
    assert supervisor.supervise([], script=str(script), restart_delay=1.0) == 3
    lines = _lines(log)
    assert [w[0] for w in lines] == ['go', 'exit'] * 3  # no pipe: wait_for_go returns at once, warm_up never runs
    assert float(lines[2][1]) - float(lines[1][1]) >= 1.0


@pytest.mark.slow
def test_a_stop_in_the_delay_gives_up_the_learner_started_early(tmp_path):
    log = tmp_path / 'log'
    proc = _run_supervisor(tmp_path, EARLY_CHILD.format(log=str(log)), delay=3.0)
    try:
        deadline = time.monotonic() + 60
        while (not log.exists() or len(_lines(log)) < 4) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [w[0] for w in _lines(log)] == ['warm', 'go', 'exit', 'warm']  # the second waits in the delay
        proc.terminate()
        proc.communicate(timeout=20)
        assert proc.returncode == 0
    finally:
        proc.kill()
    lines = _lines(log)
    assert [w[0] for w in lines] == ['warm', 'go', 'exit', 'warm', 'go']
    assert lines[4][2] == 'False'  # given up, never let go
    with pytest.raises(ProcessLookupError):
        os.kill(int(lines[3][2]), 0)  # and gone, reaped by the supervisor


def test_exit_for_restart_runs_the_atexit_handlers_flushes_and_skips_the_teardown(tmp_path):
    mark = tmp_path / 'atexit'
    script = tmp_path / 'child.py'
    script.write_text('import atexit, sys\n'
                      'from mortal.learning.supervisor import exit_for_restart\n'
                      f'atexit.register(lambda: open({str(mark)!r}, "w").write("ran"))\n'
                      'class Teardown:\n'
                      '    def __del__(self):\n'
                      '        print("torn down")\n'
                      'kept = Teardown()\n'
                      'print("buffered", end="")\n'
                      'exit_for_restart()\n'
                      'print("not reached")\n')
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert out.returncode == 0 and out.stderr == ''
    assert out.stdout == 'buffered'  # flushed, and the module's objects were not torn down
    assert mark.read_text() == 'ran'


def test_a_failing_warm_up_still_waits_for_the_go_and_the_child_runs(tmp_path, monkeypatch):
    read, write = os.pipe()
    monkeypatch.setenv(supervisor.START_FD_KEY, str(read))
    os.write(write, b'1')
    os.close(write)

    def broken():
        raise ImportError('an edit that does not import')
    assert supervisor.wait_for_go(broken) is True  # the child's own start reports the failure, with its traceback
    assert supervisor.START_FD_KEY not in os.environ
    with pytest.raises(OSError):
        os.fstat(read)  # closed


# The child below turns SIGTERM and SIGINT into status 7; the second one let go trains for 30 s.
STOPPABLE_CHILD = """import signal, sys, time
from mortal.learning.supervisor import wait_for_go
log = open({log!r}, 'a')
def warm_up():
    log.write('warm\\n')
    log.flush()
    time.sleep({warm_s})
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: sys.exit(7))
if not wait_for_go(warm_up):
    sys.exit(0)
log.write('go\\n')
log.flush()
if sum(1 for _ in open({log!r})) < 4:
    sys.exit(0)
time.sleep(30)
"""


@pytest.mark.slow
@pytest.mark.parametrize('sig', ['SIGTERM', 'SIGINT'])
def test_a_stop_at_the_moment_of_the_go_reaches_the_learner(tmp_path, sig):
    # the signal lands while the second child is being let go (the supervisor signals itself there)
    log = tmp_path / 'log'
    patch = ('real = supervisor.let_go\n'
             'calls = []\n'
             'def let_go(gate):\n'
             '    calls.append(gate)\n'
             f'    if len(calls) == 2:\n'
             f'        os.kill(os.getpid(), signal.{sig})\n'
             '    return real(gate)\n'
             'supervisor.let_go = let_go\n')
    started = time.monotonic()
    proc = _run_supervisor(tmp_path, STOPPABLE_CHILD.format(log=str(log), warm_s=0), patch)
    try:
        _, err = proc.communicate(timeout=25)
    finally:
        proc.kill()
    assert proc.returncode == 7, err  # the learner that was let go got the stop, and its status is the run's
    assert time.monotonic() - started < 20  # not its 30 s of training
    assert 'Traceback' not in err and f'stopped on {sig}: the learner ended with status 7' in err
    assert log.read_text().split() in (['warm', 'go', 'warm'], ['warm', 'go', 'warm', 'go'])  # stopped at its go


@pytest.mark.slow
def test_a_stop_during_a_slow_warm_up_kills_the_waiting_child_at_once(tmp_path):
    log = tmp_path / 'log'
    proc = _run_supervisor(tmp_path, STOPPABLE_CHILD.format(log=str(log), warm_s=0) .replace(
        'time.sleep(0)', 'time.sleep(0 if sum(1 for _ in open(%r)) < 2 else 60)' % str(log)))
    try:
        deadline = time.monotonic() + 30
        while (not log.exists() or log.read_text().split() != ['warm', 'go', 'warm']) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        stopped = time.monotonic()
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0 and 'between learners' in err
    assert time.monotonic() - stopped < 1.0 + supervisor.GIVE_UP_WAIT + 1.0  # the delay's rest, the wait, slack
    assert 'still running' not in err and 'Traceback' not in err
    assert log.read_text().split() == ['warm', 'go', 'warm']  # the second never started
