"""Baseline rotation: promote a checkpoint to the baselines, keeping each replaced file as a stamped ``.bak``."""

from __future__ import annotations

import logging
import os
import time

from mortal.config import typed
from mortal.model.checkpoint import (INITIAL_BEST_PERF, MORTAL_ENTRIES, CheckpointError, atomic_torch_save,
                                     describe_error, load_checkpoint, require_entries)
from mortal.util.fsutil import atomic_copy, stamped_name

logger = logging.getLogger('mortal.rotation')  # the name before the package split (log format)


def keep_backup(target: str, stamp: str | None = None) -> str | None:
    """Copy ``target`` atomically to ``<target>.<stamp>.bak``; returns its name (None: nothing to keep)."""
    if not os.path.exists(target):
        return None
    backup = stamped_name(target, stamp or time.strftime('%Y%m%d-%H%M%S'), '.bak')
    atomic_copy(target, backup, keep_times=True)  # the backup keeps when that baseline was written
    return backup


def install_baseline(path: str, mortal: dict, dqn: dict, arch: dict) -> str | None:
    """Write a baseline from the server to ``path`` atomically, keeping the old file; the backup's name or None."""
    backup = keep_backup(path)
    config = {'control': {'version': arch['version']},
              'resnet': {'conv_channels': arch['conv_channels'], 'num_blocks': arch['num_blocks']}}
    atomic_torch_save({'mortal': mortal, 'current_dqn': dqn, 'config': config}, path)
    return backup


def rotate(config: dict, source: str | None = None, *, reset_best: bool = False, stamp: str | None = None) -> list:
    """Copy ``source`` (default best) over each baseline file with a backup; ``[(target, backup or None)]``.
    Raises, touching nothing, FileNotFoundError or ValueError (unusable, or a baseline itself)."""
    cfg = typed(config)
    source = source or cfg.control.best_state_file
    require_entries(load_checkpoint(source), MORTAL_ENTRIES, source)  # a loadable Mortal-layout checkpoint
    state = None
    if reset_best:  # read it before anything changes: a state file that cannot be reset stops the rotation
        state_file = cfg.control.state_file
        try:
            state = load_checkpoint(state_file)
            state['best_perf'] = dict(INITIAL_BEST_PERF)
        except (OSError, TypeError, CheckpointError) as e:
            raise CheckpointError(state_file, f'cannot reset best_perf: {describe_error(e)}') from None
    stamp = stamp or time.strftime('%Y%m%d-%H%M%S')
    targets = list(dict.fromkeys(slot.state_file for slot in (cfg.baseline.train, cfg.baseline.test)))
    for target in targets:
        if os.path.exists(target) and os.path.samefile(target, source):
            raise ValueError(f'{source} is the baseline file itself')
    done = []
    for target in targets:
        backup = keep_backup(target, stamp)
        atomic_copy(source, target)
        done.append((target, backup))
    if state is not None:
        atomic_torch_save(state, cfg.control.state_file)
    return done

