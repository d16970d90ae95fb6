"""Tie a helper process's lifetime to its parent's (Linux ``prctl(PR_SET_PDEATHSIG)``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` when the parent exits (at once if gone); True where requested (Linux).
    The kernel watches the forking thread: start children from the main thread."""
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
