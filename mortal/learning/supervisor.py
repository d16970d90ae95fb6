"""The online learner's supervisor (Mortal's ``train.py`` main): the learner runs as a child, restarted after each
clean exit (a fresh process after every test play); the config is checked before each start (docs/operations.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time

from mortal.entry import stops_deferred
from mortal.util.config_diff import changed_keys

logger = logging.getLogger('mortal.train')  # the learner's lines (log format)

IS_SUB_PROC_KEY = 'MORTAL_IS_SUB_PROC'  # set by the supervisor for its child; do not set it by hand
SUPERVISOR_PID_KEY = 'MORTAL_SUPERVISOR_PID'  # set with it: the learner dies with this process
START_FD_KEY = 'MORTAL_START_FD'  # with early_start: the pipe on which the child waits to be let go (wait_for_go)
GROUP_GRACE = 3.0  # seconds a finished learner's loader processes get to exit by themselves before a SIGKILL
GIVE_UP_WAIT = 0.5  # seconds a child started early and never let go gets to exit before a SIGKILL
RESTART_DELAY = 3.0  # seconds between a child's clean exit and the next start (Mortal)
CONFIG_RETRY_INTERVAL = 30.0  # seconds between two checks of a broken config before a restart
CONFIG_REMIND_EVERY = 60.0  # seconds between two lines saying that the learner still waits for a valid config
CONFIG_WATCH_INTERVAL = 5.0  # seconds between two looks at the config's modification time while a learner runs


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to every process of process group ``pgid`` (POSIX); returns False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def live_members(pgid: int, proc: str = '/proc') -> list[int] | None:
    """The pids of process group ``pgid`` that still run, zombies left out (Linux ``/proc``); None without ``proc``."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return None
    pids = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, 'stat'), 'rb') as f:
                fields = f.read().rsplit(b')', 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue  # gone meanwhile
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b'Z':
            pids.append(int(entry))
    return pids


def reap_process_group(pgid: int) -> None:
    """After the leader of ``pgid`` has exited: give the rest ``GROUP_GRACE`` seconds, then SIGKILL what is left."""
    if not hasattr(os, 'killpg'):
        return

    def alive() -> bool:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-pgid, os.WNOHANG)[0] > 0:  # members re-parented to us (we may be PID 1)
                pass
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        # the loader processes that ended re-parented to PID 1 stay zombies until it reaps them (1-2 s in a
        # container, never without an init): they are gone, not a reason to wait out the grace nor to warn
        members = live_members(pgid)
        return members is None or bool(members)

    deadline = time.monotonic() + GROUP_GRACE
    while alive():
        if time.monotonic() >= deadline:
            if signal_group(pgid, signal.SIGKILL):
                logger.warning('processes of the learner were still running %.0f s after it ended: killed them '
                               '(process group %d)', GROUP_GRACE, pgid)
                for _ in range(20):
                    if not alive():
                        break
                    time.sleep(0.05)
            return
        time.sleep(0.05)


def checked_config(path: str, required, env, inputs=None) -> tuple:
    """``(config, [])`` when ``path`` is valid, else ``(None, errors)``; warnings are left to the learner.
    ``inputs(config, path)``: more errors of a valid config (the learner's missing input files), or None."""
    from mortal.config import ConfigError, config_errors, load_config
    quiet = logging.getLogger('mortal.config')
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        errors = config_errors(path, required=required, env=env)
        if errors:
            return None, errors
        try:
            config = load_config(path, required=required, env=env)
        except ConfigError as exc:  # broken between the two reads
            return None, list(exc.problems)
        errors = inputs(config, path) if inputs is not None else []
        return (None, errors) if errors else (config, [])
    finally:
        quiet.setLevel(level)


def config_mtime(path: str):
    """The modification time of ``path`` in ns, or None when it cannot be read (removed, renamed mid-save)."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def report_config_edit(path: str, required, env, started_with, inputs=None) -> None:
    """Log what a save of ``path`` during a run means: its errors at ERROR, else the keys that will change."""
    config, errors = checked_config(path, required, env, inputs)
    if errors:
        logger.error('config %s was saved with errors: the running learner keeps its config, but the next one will '
                     'not start until they are fixed:\n%s', path, '\n'.join(f'  - {e}' for e in errors))
        return
    changed = changed_keys(started_with, config)
    logger.info('config %s saved: valid; at the learner\'s next start: %s', path,
                '; '.join(changed) if changed else 'no key changes')


def wait_for_config(path: str, required, env, *, stop_requested, inputs=None,
                    retry_interval: float = CONFIG_RETRY_INTERVAL, remind_every: float = CONFIG_REMIND_EVERY,
                    sleep=time.sleep, clock=time.monotonic):
    """The loaded config of ``path`` once valid (checked every ``retry_interval`` s, errors logged, a reminder every
    ``remind_every`` s); None when ``stop_requested()`` first."""
    config, errors = checked_config(path, required, env, inputs)
    if not errors:
        return config
    logger.error('config %s is broken: the learner is not restarted until it is fixed (checked every %.0f s; '
                 'its checkpoint is kept, the server and the clients wait):\n%s', path, retry_interval,
                 '\n'.join(f'  - {e}' for e in errors))
    since = said = clock()
    shown = errors
    while True:
        deadline = clock() + retry_interval
        while not stop_requested() and clock() < deadline:
            sleep(min(1.0, max(deadline - clock(), 0.0)))
        if stop_requested():
            return None
        config, errors = checked_config(path, required, env, inputs)
        if not errors:
            logger.info('config %s is valid again (broken for %.0f s): restarting the learner', path, clock() - since)
            return config
        if errors != shown or clock() - said >= remind_every:
            logger.error('still waiting for a valid config %s (broken for %.0f min; checked every %.0f s):\n%s',
                         path, (clock() - since) / 60, retry_interval, '\n'.join(f'  - {e}' for e in errors))
            shown, said = errors, clock()


def start_child(cmd, env, gated: bool) -> tuple:
    """``(Popen, gate)``: ``cmd`` started in a session of its own; with ``gated`` it waits in ``wait_for_go`` until
    ``let_go(gate)`` (``gate``: the write end of its pipe, else None)."""
    if not gated:
        return subprocess.Popen(cmd, env=env, start_new_session=True), None
    read, write = os.pipe()
    try:
        child = subprocess.Popen(cmd, env={**env, START_FD_KEY: str(read)}, start_new_session=True,
                                 pass_fds=(read,))
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    return child, write


def let_go(gate) -> bool:
    """Let the child waiting on ``gate`` (``start_child``) start; False when it had ended (its status says why).
    True when ``gate`` is None."""
    if gate is None:
        return True
    try:
        os.write(gate, b'1')
    except BrokenPipeError:
        return False
    finally:
        os.close(gate)
    return True


def give_up(child, gate) -> None:
    """End ``child``, started early and never let go: it exits on the closed ``gate`` once its imports are done, or
    is killed with its process group after ``GIVE_UP_WAIT`` s (it has only imported: nothing to lose)."""
    os.close(gate)
    try:
        child.wait(timeout=GIVE_UP_WAIT)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        signal_group(child.pid, signal.SIGKILL)
        child.wait()
    reap_process_group(child.pid)


def wait_for_go(warm_up=None) -> bool:
    """In a child that ``supervise`` started early: run ``warm_up()``, then block until it is let go (True), or
    given up (False: a stop in the restart delay, or the supervisor is gone). True at once in any other process."""
    fd = os.environ.pop(START_FD_KEY, '')  # popped: not passed on to the learner's own children
    if not fd.isdigit():
        return True
    try:
        if warm_up is not None:
            try:
                warm_up()
            except Exception:  # only a head start: a real failure recurs, and is reported, once the child runs
                pass
        return os.read(int(fd), 1) == b'1'
    finally:
        os.close(int(fd))


def supervise(argv, *, script: str, restart_delay: float = RESTART_DELAY, config_path: str | None = None,
              required=(), env=None, inputs=None, retry_interval: float = CONFIG_RETRY_INTERVAL,
              remind_every: float = CONFIG_REMIND_EVERY, watch_interval: float = CONFIG_WATCH_INTERVAL,
              early_start: bool = False) -> int:
    """Run ``python script argv`` as a child (own process group, reaped) with MORTAL_IS_SUB_PROC=1, restarted
    ``restart_delay`` s after each exit 0; returns its other status (128 + signal). SIGTERM and SIGINT are passed on.
    With ``config_path``: checked before each restart (and by ``inputs``, see ``checked_config``), edits reported,
    the lock of ``[control] state_file`` held throughout (``runlock.LockHeld``). With ``early_start`` (a script that
    calls ``wait_for_go`` first): the next child is started when the last one has ended, loads its modules during
    the delay, and is let go after it and the config check."""
    cmd = [sys.executable, script, *argv]
    child_env = {**os.environ, IS_SUB_PROC_KEY: '1', SUPERVISOR_PID_KEY: str(os.getpid())}
    locks = contextlib.ExitStack()  # the state file's lock, held from the first valid config to the end
    child = None
    gate = None  # the pipe of a child started early and not yet let go
    stopping = False
    stop_signal = 'SIGINT'  # the name of the signal that asked the supervisor to stop
    started_with = None  # the config the last learner started with

    def next_config() -> bool:
        """Wait for a valid config (with ``config_path``) and log what changed; False when a stop came first."""
        nonlocal started_with, child_env
        if config_path is None:
            return True
        config = wait_for_config(config_path, required, env, stop_requested=lambda: stopping, inputs=inputs,
                                 retry_interval=retry_interval, remind_every=remind_every)
        if config is None or stopping:  # a stop that came during the last check: no learner starts
            return False
        if started_with is None:  # held for the supervisor's whole life: refused even between two learners
            from mortal.config import typed
            from mortal.util import runlock
            lock_path = locks.enter_context(runlock.hold(
                typed(config).control.state_file, who='learner', key='[control] state_file',
                fix='give this run its own [control] state_file'))
            child_env = runlock.child_env(child_env, lock_path)
        else:
            changed = changed_keys(started_with, config)
            logger.info('config changed since the last start: %s', '; '.join(changed) if changed else 'nothing')
        started_with = config
        return True

    def forward(signum, frame):
        nonlocal stopping, stop_signal
        stopping = True
        stop_signal = signal.Signals(signum).name
        if child is not None and gate is None and child.poll() is None:  # one not yet let go ends with its gate
            child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            if not next_config():
                logger.info('stopped on %s while waiting for a valid config: no learner running, nothing '
                            'discarded', stop_signal)
                return 0
            # read before the learner starts, so that an edit saved at once is reported too
            seen = config_mtime(config_path) if config_path is not None else None
            # A session of its own: the whole learner (with its loader processes) is one process group to reap.
            started = None
            if child is None and not stopping:
                child, gate = start_child(cmd, child_env, early_start)
            try:
                with stops_deferred():  # a stop in here is handled once the gate is settled
                    if not stopping:
                        started = let_go(gate)
                        gate = None
            except KeyboardInterrupt:  # a Ctrl-C held in there: passed on, as in the wait below
                stopping = True
                if started is not None and child.poll() is None:
                    child.send_signal(signal.SIGINT)
            if started is None:  # a stop came during the config check: no learner starts
                logger.info('stopped on %s between learners: not restarting, nothing discarded', stop_signal)
                return 0
            if started:
                logger.info('learner started (pid %d)', child.pid)
            else:
                logger.info('learner (pid %d) ended before its start', child.pid)
            pending = None  # a new modification time, reported once it has held for one interval
            while True:
                try:
                    code = child.wait(timeout=watch_interval if config_path is not None else None)
                    break
                except subprocess.TimeoutExpired:
                    now = config_mtime(config_path)
                    if now != seen and now is not None and now == pending:
                        seen = now
                        report_config_edit(config_path, required, env, started_with, inputs)
                    pending = now
                except KeyboardInterrupt:  # the terminal's Ctrl-C does not reach the child's session: pass it on
                    stopping = True
                    if child.poll() is None:
                        child.send_signal(signal.SIGINT)
            reap_process_group(child.pid)
            child = None
            if (code != 0 and not stopping and config_path is not None
                    and checked_config(config_path, required, env, inputs)[1]):
                # most likely it failed on the broken config: wait for the fix (next_config) instead of stopping
                logger.error('learner exited with status %d on a broken config', code)
                continue
            if code != 0 or stopping:
                if code < 0:
                    code = 128 - code
                if stopping:
                    logger.info('stopped on %s: the learner ended with status %d (its last line says what it '
                                'kept)', stop_signal, code)
                else:
                    logger.error('learner exited with status %d: stopping', code)
                return code
            logger.info('learner exited normally; restarting in %.0f s', restart_delay)
            if early_start:  # its imports run in the delay; it trains only after the delay and the config check
                child, gate = start_child(cmd, child_env, True)
            try:
                time.sleep(restart_delay)
            except KeyboardInterrupt:
                stopping = True
            if stopping:  # a SIGTERM/SIGINT in the pause had no child to reach: honour it here
                logger.info('stopped on %s between learners: not restarting, nothing discarded', stop_signal)
                return 0
    finally:
        if gate is not None:  # started early and never let go
            give_up(child, gate)
        signal.signal(signal.SIGTERM, previous)
        locks.close()


def exit_for_restart() -> None:
    """End a learner whose supervisor restarts it (status 0) at once: the atexit handlers run (logging, the loader
    processes) and the output is flushed, then ``os._exit`` skips the interpreter's teardown of torch and about
    2,000 modules, 0.9 s on 2 cores that the next learner would wait for. Its files are closed before this."""
    import atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def is_supervised() -> bool:
    """Whether this process is a child that ``supervise`` started (``MORTAL_IS_SUB_PROC=1``)."""
    return os.environ.get(IS_SUB_PROC_KEY) == '1'


def end_with_supervisor() -> None:
    """In a child of ``supervise``: get SIGTERM when the supervisor exits, even by SIGKILL (Linux only)."""
    supervisor = os.environ.get(SUPERVISOR_PID_KEY, '')
    if supervisor.isdigit():
        from mortal.util.lifetime import die_with_parent
        die_with_parent(signal.SIGTERM, expected_parent=int(supervisor))
