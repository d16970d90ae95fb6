"""One process per folder or state file: an OS file lock plus an owner record (docs/operations.md)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import time

from filelock import FileLock, Timeout

from mortal.util.fsutil import atomic_write_bytes

logger = logging.getLogger(__name__)

OWNER_SUFFIX = '.owner'


INHERITED_KEY = 'MORTAL_LOCK_HELD_BY_PARENT'  # '<parent pid>:<lock path>': the parent holds that lock for the child
SHOWN_CHARS = 200  # a holder record's host is cut to this many characters in messages
RECORD_BYTES = 4096  # a holder record larger than this is a bad record (it is a few dozen bytes)
HARM = {'learner': "train on each other's checkpoint and claim each other's logs",
        'client': "submit each other's logs (trained twice)"}  # of two holders at once, by ``who``


class LockHeld(RuntimeError):
    """Another live process holds the lock, or the OS refused the lock file. ``str()`` is the whole refusal."""


def lock_path_for(target: str) -> str:
    """``<target>.lock`` beside ``target`` (never inside a folder its user empties)."""
    return os.path.normpath(os.path.abspath(target)) + '.lock'


def _holder(lock_path: str) -> dict:
    """The holder record of ``lock_path`` (its sound parts), ``{}`` when absent or unreadable."""
    try:
        with open(lock_path + OWNER_SUFFIX, 'rb') as f:
            data = f.read(RECORD_BYTES + 1)
        owner = json.loads(data.decode('utf-8')) if len(data) <= RECORD_BYTES else None
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(owner, dict):
        return {}
    out = {}
    pid, host, since = owner.get('pid'), owner.get('host'), owner.get('since')
    if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 32:
        out['pid'] = pid
    if isinstance(host, str) and host:
        out['host'] = host[:SHOWN_CHARS]
    if isinstance(since, (int, float)) and not isinstance(since, bool) and math.isfinite(since) \
            and 0 <= since < 1e11:  # gmtime accepts it; later than year 5000 is no time a holder started
        out['since'] = float(since)
    return out


def describe_holder(owner: dict) -> str:
    """``PID 123 on host h since 2026-12-04 20:00:00 UTC`` from a holder record (``_holder``'s, checked there)."""
    since = owner.get('since')
    try:
        when = 'an unknown time' if since is None else time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(since))
    except (OverflowError, OSError, ValueError):  # a platform whose gmtime ends before the record's bound
        when = 'an unknown time'
    return f"PID {owner.get('pid', '?')} on host {owner.get('host', '?')} since {when}"


def _inherited(lock_path: str) -> bool:
    """Whether this process's parent holds ``lock_path`` for it (``INHERITED_KEY``, set by ``child_env``)."""
    return os.environ.get(INHERITED_KEY) == f'{os.getppid()}:{lock_path}'


def child_env(env: dict, lock_path: str) -> dict:
    """``env`` for a child running under this process's hold of ``lock_path`` (its ``hold`` takes nothing)."""
    return {**env, INHERITED_KEY: f'{os.getpid()}:{lock_path}'}


def _failed(lock_path: str, key: str, target: str, exc: BaseException) -> LockHeld:
    return LockHeld(f'cannot take the lock {lock_path} of {key} = {target}: {exc}')


@contextlib.contextmanager
def hold(target: str, *, who: str, key: str, fix: str):
    """Hold the lock of ``target`` for the block (``who``, ``key``, ``fix`` word the refusal). ``LockHeld`` also when
    the OS refuses the lock file; a dead holder's lock is taken over with a warning; none under ``child_env``."""
    lock_path = lock_path_for(target)
    if _inherited(lock_path):
        yield lock_path
        return
    try:
        os.makedirs(os.path.dirname(lock_path), exist_ok=True)
        lock = FileLock(lock_path)
        lock.acquire(timeout=0)
    except Timeout:
        try:  # filelock answers Timeout also when the file cannot be made at all (e.g. under /proc)
            os.close(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644))
        except OSError as e:
            raise _failed(lock_path, key, target, e) from None
        harm = HARM.get(who, "get in each other's way")
        raise LockHeld(f'another {who} runs on {key} = {target}: {describe_holder(_holder(lock_path))} holds '
                       f'{lock_path}. Two {who}s on one {key} would {harm}; stop the other one, or {fix}') from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise _failed(lock_path, key, target, e) from None
    try:
        left = _holder(lock_path)
        if left or os.path.lexists(lock_path + OWNER_SUFFIX):
            logger.warning('taking over %s: its holder (%s) ended without releasing it (killed?)', lock_path,
                           describe_holder(left))
        owner = {'host': socket.gethostname(), 'pid': os.getpid(), 'since': time.time()}
        try:
            if os.path.isdir(lock_path + OWNER_SUFFIX) and not os.path.islink(lock_path + OWNER_SUFFIX):
                raise IsADirectoryError(f'{lock_path + OWNER_SUFFIX} is a directory')
            atomic_write_bytes(json.dumps(owner).encode('utf-8'), lock_path + OWNER_SUFFIX, fsync=False)
        except OSError as e:  # the lock holds without its record; a refusal then names an unknown holder
            logger.warning('cannot write the holder record of %s: %s', lock_path, e)
        yield lock_path
    finally:
        with contextlib.suppress(OSError):
            os.remove(lock_path + OWNER_SUFFIX)  # first: a record without a lock would read as a killed holder
        lock.release()


def holder_if_held(target: str) -> str | None:
    """``describe_holder`` of the live holder of ``target``'s lock, None when free (not taking it)."""
    lock_path = lock_path_for(target)
    if not os.path.isfile(lock_path) or _inherited(lock_path):
        return None  # not a lock file: ``hold`` says what is wrong with it
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return describe_holder(_holder(lock_path))
    except OSError:
        return None  # ``hold`` names the OS error
    lock.release()
    return None
