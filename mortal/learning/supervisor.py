"""The online learner's supervisor (Mortal's ``train.py`` main): run the learner as a child, restart it after each
clean exit.

The online learner exits 0 after every test play and a fresh process takes its place, as in Mortal: DataLoader
workers forked from a process that already ran native threaded code (torch and Rust thread pools) can hang, and a
fresh process has run none. ``supervise`` starts ``python <script> argv`` with ``MORTAL_IS_SUB_PROC=1``, restarts
it 3 s after each exit with status 0 and returns the child's status on anything else. The child runs in a session
and process group of its own; whatever is left of that group when the child has ended is killed
(``reap_process_group``), and the child ends with the supervisor (``end_with_supervisor``), so no process of a
learner outlives it (its loader processes die with it: ``mortal.util.lifetime``).

``mortal.quickstart`` has no supervisor of its own: it starts ``python -m mortal.train`` (this supervisor, which
restarts the learner) beside the server and a client, treats any exit of the three as a failure, and stops them
with ``signal_group``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

# The learner's lines keep the logger name they have always had (README, log filters).
logger = logging.getLogger('mortal.train')

IS_SUB_PROC_KEY = 'MORTAL_IS_SUB_PROC'  # set by the supervisor for its child; do not set it by hand
SUPERVISOR_PID_KEY = 'MORTAL_SUPERVISOR_PID'  # set with it: the learner dies with this process
GROUP_GRACE = 3.0  # seconds a finished learner's loader processes get to exit by themselves before a SIGKILL
RESTART_DELAY = 3.0  # seconds between a child's clean exit and the next start (Mortal)


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to every process of process group ``pgid`` (POSIX); returns False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def reap_process_group(pgid: int, grace: float = GROUP_GRACE) -> bool:
    """After the leader of process group ``pgid`` (the learner) has exited and been waited for: give the rest of
    the group (DataLoader fork server and workers, multiprocessing's resource tracker) ``grace`` seconds to exit
    by themselves (they die with the learner, see ``mortal.util.lifetime``; the tracker then cleans up), then SIGKILL
    whatever is left. Reaps members that are this process's children. Returns True when something was killed;
    False also where process groups do not exist (not POSIX)."""
    if not hasattr(os, 'killpg'):
        return False

    def alive() -> bool:
        try:
            while os.waitpid(-pgid, os.WNOHANG)[0] > 0:  # members re-parented to us (we may be PID 1)
                pass
        except ChildProcessError:
            pass
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    deadline = time.monotonic() + grace
    while alive():
        if time.monotonic() >= deadline:
            if not signal_group(pgid, signal.SIGKILL):
                return False
            logger.warning('processes of the learner were still running %.0f s after it ended: killed them '
                           '(process group %d)', grace, pgid)
            for _ in range(20):
                if not alive():
                    break
                time.sleep(0.05)
            return True
        time.sleep(0.05)
    return False


def supervise(argv, *, script: str, restart_delay: float = RESTART_DELAY) -> int:
    """Run ``python script argv`` as a child with MORTAL_IS_SUB_PROC=1; restart it ``restart_delay`` seconds after
    each exit with 0; return its status otherwise (128 + signal number when killed). SIGTERM and Ctrl-C (SIGINT)
    to the supervisor are passed on to the child.

    The child runs in its own session and process group; whenever it has ended, however it ended, what is left
    of its group is killed (``reap_process_group``), so no process of a learner outlives it."""
    cmd = [sys.executable, script, *argv]
    env = {**os.environ, IS_SUB_PROC_KEY: '1', SUPERVISOR_PID_KEY: str(os.getpid())}
    child = None
    stopping = False

    def forward(signum, frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            # A session of its own: the whole learner (with its loader processes) is one process group to reap.
            child = subprocess.Popen(cmd, env=env, start_new_session=True)
            logger.info('learner started (pid %d)', child.pid)
            while True:
                try:
                    code = child.wait()
                    break
                except KeyboardInterrupt:  # the terminal's Ctrl-C does not reach the child's session: pass it on
                    stopping = True
                    if child.poll() is None:
                        child.send_signal(signal.SIGINT)
            reap_process_group(child.pid)
            if code != 0 or stopping:
                if code < 0:
                    code = 128 - code
                if stopping:
                    logger.info('learner stopped on request (status %d)', code)
                else:
                    logger.info('learner exited with status %d: stopping', code)
                return code
            logger.info('learner exited normally; restarting in %.0f s', restart_delay)
            try:
                time.sleep(restart_delay)
            except KeyboardInterrupt:
                stopping = True
            if stopping:  # a SIGTERM/SIGINT in the pause had no child to reach: honour it here
                logger.info('stop requested between learners: not restarting')
                return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def is_supervised() -> bool:
    """Whether this process is a child that ``supervise`` started (``MORTAL_IS_SUB_PROC=1``)."""
    return os.environ.get(IS_SUB_PROC_KEY) == '1'


def end_with_supervisor() -> None:
    """In a child of ``supervise``: have the kernel send this process SIGTERM when the supervisor exits, even by
    SIGKILL (the child is out of the terminal's session, so nothing else would stop it). Does nothing without
    the supervisor's pid in the environment, or off Linux (``mortal.util.lifetime.die_with_parent``)."""
    supervisor = os.environ.get(SUPERVISOR_PID_KEY, '')
    if supervisor.isdigit():
        from mortal.util.lifetime import die_with_parent
        die_with_parent(signal.SIGTERM, expected_parent=int(supervisor))
