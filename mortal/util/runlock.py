"""One process per folder or state file: an OS file lock with a record of its holder.

A learner holds ``<[control] state_file>.lock`` and a client ``<log_dir>.lock`` for as long as it runs (``hold``), so
that a second one started on the same config refuses at once, naming the holder and the config key that points
both at the same place, instead of training on the first one's state or submitting its logs.

The lock is ``filelock``'s OS lock (``flock`` on POSIX), which the kernel releases when its process dies, also by
SIGKILL: a lock left by a dead process is free. Beside it, ``<lock>.owner`` records the holder (host, PID, since
when) for the refusal message; a holder that ends normally removes it, so finding one when the lock is free means
its holder was killed: the taker logs that it takes the lock over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time

from filelock import FileLock, Timeout

from mortal.util.fsutil import atomic_write_bytes

logger = logging.getLogger(__name__)

OWNER_SUFFIX = '.owner'


class LockHeld(RuntimeError):
    """Another live process holds the lock. ``str()`` is the whole refusal: the holder and what to change."""


def lock_path_for(target: str) -> str:
    """The lock file of a state file or folder ``target``: ``<target>.lock`` beside it (never inside a folder that
    its user empties or lists)."""
    return os.path.normpath(os.path.abspath(target)) + '.lock'


def _holder(lock_path: str) -> dict:
    """The holder record of ``lock_path`` (``{}`` when there is none or it cannot be read)."""
    try:
        with open(lock_path + OWNER_SUFFIX, encoding='utf-8') as f:
            owner = json.load(f)
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def describe_holder(owner: dict) -> str:
    """``PID 123 on host h since 2026-12-04 20:00:00 UTC``, from a holder record (unknown parts said so)."""
    since = owner.get('since')
    when = (time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(since)) if isinstance(since, (int, float))
            else 'an unknown time')
    return f"PID {owner.get('pid', '?')} on host {owner.get('host', '?')} since {when}"


@contextlib.contextmanager
def hold(target: str, *, who: str, key: str, fix: str):
    """Hold the lock of ``target`` (``lock_path_for``) for the block; the folder of the lock is created.

    ``who`` names the process ('learner', 'client'), ``key`` the config key whose value is ``target`` (e.g.
    ``[control] state_file``), ``fix`` what to change, for the refusal. Raises :class:`LockHeld` at once when a
    live process holds it. A lock whose holder died (its record left behind) is taken over with a warning."""
    lock_path = lock_path_for(target)
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise LockHeld(f'another {who} runs on {key} = {target}: {describe_holder(_holder(lock_path))} holds '
                       f'{lock_path}. Two {who}s on one {key} would {_harm(who)}; stop the other one, or {fix}'
                       ) from None
    try:
        left = _holder(lock_path)
        if left:
            logger.warning('taking over %s: its holder (%s) ended without releasing it (killed?)', lock_path,
                           describe_holder(left))
        owner = {'host': socket.gethostname(), 'pid': os.getpid(), 'since': time.time()}
        atomic_write_bytes(json.dumps(owner).encode('utf-8'), lock_path + OWNER_SUFFIX, fsync=False)
        yield lock_path
    finally:
        with contextlib.suppress(OSError):
            os.remove(lock_path + OWNER_SUFFIX)  # first: a record without a lock would read as a killed holder
        lock.release()


def holder_if_held(target: str) -> str | None:
    """``describe_holder`` of the live holder of ``target``'s lock, or None when it is free (a check without taking
    it, e.g. for a supervisor whose child will take it)."""
    lock_path = lock_path_for(target)
    if not os.path.exists(lock_path):
        return None
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return describe_holder(_holder(lock_path))
    lock.release()
    return None


def _harm(who: str) -> str:
    return {'learner': "train on each other's checkpoint and claim each other's logs",
            'client': "submit each other's logs (trained twice)"}.get(who, 'get in each other\'s way')
