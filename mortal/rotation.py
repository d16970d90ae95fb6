"""Baseline rotation: promote a checkpoint (normally best.pth) to ``[baseline.train]``/``[baseline.test]``, and the
opponent pool of the newest baselines.

Used by ``scripts/rotate_baseline.py`` (by hand) and by the trainer's automatic rotation (``[rotation] after``).
Every replaced baseline is kept as ``<file>.<YYYYmmdd-HHMMSS>.bak``; the pool (``[rotation] pool_size``) is the
current baseline file and its newest ``.bak`` copies.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import time

from mortal.fsutil import stamped_name

logger = logging.getLogger(__name__)


def check_source(path: str) -> None:
    """Raise ``ValueError`` naming ``path`` unless it is a loadable Mortal-layout checkpoint (``mortal``,
    ``current_dqn`` and ``config`` entries, loaded with ``weights_only=True``)."""
    import torch
    try:
        state = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        raise ValueError(f'{path}: cannot load: {type(e).__name__}: {e}') from None
    missing = [k for k in ('mortal', 'current_dqn', 'config') if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f'{path}: not a usable checkpoint, lacks {missing}')


def rotate(config: dict, source: str | None = None, *, reset_best: bool = False, stamp: str | None = None) -> list:
    """Copy ``source`` (default ``[control] best_state_file``) over each distinct baseline file, keeping the old
    one as ``<file>.<stamp>.bak``; returns ``[(target, backup or None)]``.

    ``reset_best``: also reset ``best_perf`` in ``[control] state_file`` (only while the trainer is stopped).
    Raises ValueError when ``source`` is unusable or is a baseline file itself (nothing is touched then)."""
    import torch
    from mortal.train import INITIAL_BEST_PERF, atomic_copy, atomic_torch_save

    source = source or config['control']['best_state_file']
    check_source(source)
    state = None
    if reset_best:  # read it before anything changes: a state file that cannot be reset stops the rotation
        state_file = config['control']['state_file']
        try:
            state = torch.load(state_file, map_location='cpu', weights_only=True)
            state['best_perf'] = dict(INITIAL_BEST_PERF)
        except Exception as e:
            raise ValueError(f'{state_file}: cannot reset best_perf: {type(e).__name__}: {e}') from None
    stamp = stamp or time.strftime('%Y%m%d-%H%M%S')
    targets = list(dict.fromkeys(config['baseline'][slot]['state_file'] for slot in ('train', 'test')))
    for target in targets:
        if os.path.exists(target) and os.path.samefile(target, source):
            raise ValueError(f'{source} is the baseline file itself')
    done = []
    for target in targets:
        backup = None
        if os.path.exists(target):
            backup = stamped_name(target, stamp, '.bak')
            shutil.copy2(target, backup + '.tmp')  # a client drawing its pool never sees half a file
            os.replace(backup + '.tmp', backup)
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        atomic_copy(source, target)
        done.append((target, backup))
    if state is not None:
        atomic_torch_save(state, config['control']['state_file'])
    return done


def baseline_pool(state_file: str, size: int) -> list:
    """The ``size`` newest baselines: ``state_file`` first, then its ``.bak`` copies, newest first (by the
    modification time each kept, i.e. when that baseline was written). Fewer when fewer exist; ``[state_file]`` for
    size 1."""
    backups = []
    for name in glob.glob(f'{glob.escape(state_file)}.*.bak'):
        try:
            backups.append((os.path.getmtime(name), name))  # copy2 keeps the time the baseline was written
        except OSError:
            continue
    return [state_file, *(name for _, name in sorted(backups, reverse=True))][:max(1, size)]
