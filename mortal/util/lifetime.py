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
    """Have the kernel send ``sig`` to this process as soon as its parent exits.

    ``expected_parent``: the pid the parent should have (default: the parent at the time of the call). If the
    parent is already gone when the request takes effect (this process was re-parented), ``sig`` is sent to
    this process at once. Returns True where the request was made (Linux), False elsewhere (nothing happens).

    The kernel signals when the parent *thread* that forked this process exits: call it only in processes
    started from their parent's main thread (as the DataLoader's fork server and workers are).
    """
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
