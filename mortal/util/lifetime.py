"""Tie a helper process's lifetime to its parent's (Linux ``prctl(PR_SET_PDEATHSIG)``).

A SIGKILL gives a process no chance to stop its children. The learner's DataLoader fork server and workers
(``mortal.data.dataloader``) and the learner itself under the ``train.py`` supervisor therefore ask the kernel to
signal them when their parent exits, so nothing of a killed learner keeps running (and holding memory) under
PID 1. Importing this module has no effect; ``mortal.util._forkserver_preload`` is the one that acts on import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent (``expected_parent``, default: the current one)
    exits, at once when it is already gone; True where requested (Linux). The kernel signals when the forking
    *thread* exits: only for processes started from their parent's main thread."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if expected_parent is None else expected_parent
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the request: nobody will signal us
        os.kill(os.getpid(), sig)
    return True
