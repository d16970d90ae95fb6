"""The learner's checkpoint under Mortal's keys (plus ``guard``): resuming from ``[control] state_file`` and
writing it back atomically. Lines are logged as ``mortal.train``."""

import logging
from collections import namedtuple
from datetime import datetime
from os import path

from mortal.config import for_checkpoint, lookup
from mortal.learning.guards import INITIAL_GUARD
from mortal.model.checkpoint import (INITIAL_BEST_PERF, atomic_torch_save, check_fits_config, load_checkpoint,
                                     require_entries)

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)

# What a resumed learner takes from its checkpoint besides the weights and optimizer states it loads in place.
Resumed = namedtuple('Resumed', 'steps best_perf guard')


def load_state(state_file: str, models: tuple, optimizer, scheduler, scaler, *, online: bool, device,
               cfg) -> 'Resumed | None':
    """Load ``models`` (mortal, dqn, aux_net), optimizer, scheduler and scaler from ``state_file`` in place; returns
    the rest (``Resumed``), None without a file. Online from an offline checkpoint: fresh optimizer (Mortal)."""
    if not path.exists(state_file):
        logger.info('no checkpoint at %s: starting from scratch', state_file)
        return None
    state = load_checkpoint(state_file, map_location=device)
    require_entries(state, ('mortal', 'current_dqn', 'aux_net', 'steps'), state_file)
    ckpt_cfg = state.get('config')
    for model, entry in zip(models, ('mortal', 'current_dqn', 'aux_net')):
        check_fits_config(model, state[entry], entry=entry, source=state_file, ckpt_cfg=ckpt_cfg, cfg=cfg)
        model.load_state_dict(state[entry])
    ckpt_online = bool(lookup(ckpt_cfg, 'control.online'))  # the checkpoint's plain dict, of any writer
    if 'optimizer' not in state or 'scheduler' not in state:
        logger.info('%s has no optimizer/scheduler state (a bare model checkpoint): starting them fresh', state_file)
    elif not online or ckpt_online:
        optimizer.load_state_dict(state['optimizer'])
        scheduler.load_state_dict(state['scheduler'])
    else:
        logger.info('offline checkpoint in online mode: optimizer and scheduler start fresh from the config')
    if scaler.is_enabled() and state.get('scaler'):
        scaler.load_state_dict(state['scaler'])
    steps = int(state['steps'])
    when = datetime.fromtimestamp(state.get('timestamp', 0)).strftime('%Y-%m-%d %H:%M:%S')
    logger.info('loaded %s (saved %s, steps %d)', state_file, when, steps)
    return Resumed(steps=steps, best_perf=dict(state.get('best_perf', INITIAL_BEST_PERF)),
                   guard={**INITIAL_GUARD, **state.get('guard', {})})


def checkpoint_dict(models: tuple, optimizer, scheduler, scaler, *, steps: int, best_perf: dict, guard: dict,
                    online: bool, config: dict) -> dict:
    """The checkpoint dict with Mortal's keys (``config`` without the shared token), plus ``guard`` online."""
    mortal, dqn, aux_net = models
    extra = {}
    if online:  # the long-run guards' state (mortal/learning/guards.py), after Mortal's keys
        extra['guard'] = dict(guard)
    return {
        'mortal': mortal.state_dict(),
        'current_dqn': dqn.state_dict(),
        'aux_net': aux_net.state_dict(),
        'optimizer': optimizer.state_dict(),
        'scheduler': scheduler.state_dict(),
        'scaler': scaler.state_dict(),
        'steps': steps,
        'timestamp': datetime.now().timestamp(),
        'best_perf': dict(best_perf),
        'config': for_checkpoint(config),
        **extra,
    }


def write(build, state_file: str, steps: int, ledger=None) -> None:
    """Write ``build()`` to ``state_file`` atomically; with a claim ``ledger``, in one step with its commit."""
    if ledger is None:
        atomic_torch_save(build(), state_file)
    else:
        ledger.commit_with(steps, lambda: atomic_torch_save(build(), state_file))


def stop_summary(steps: int, saved_steps, state_file: str, online: bool) -> str:
    """What a learner stopped at ``steps`` keeps and discards (its last line)."""
    if saved_steps is None:
        kept = f'the {steps:,} steps trained discarded (no checkpoint written yet)'
    elif saved_steps == steps:
        kept = f'nothing discarded ({state_file} holds step {steps:,})'
    else:
        kept = (f'the {steps - saved_steps:,} steps since the last save discarded '
                f'({state_file} keeps step {saved_steps:,})')
    if online:
        kept += '; claimed logs not yet trained are kept for the next learner'
    return kept
