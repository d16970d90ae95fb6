"""The supervisor's wait for a finished learner's process group: zombies (loader processes re-parented to PID 1 and not
yet reaped by it) count as gone, so a restart waits for no grace period and warns of nothing."""

import os
import signal
import subprocess
import sys
import time

import pytest

from mortal.learning import supervisor
from mortal.learning.supervisor import live_members

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
