"""The learner's checkpoint: resuming a ``Trainer`` from ``[control] state_file`` and writing it back.

``LearnerCheckpoint`` is a part of ``mortal.train.Trainer`` (a mixin, so that ``trainer.load_state()``,
``trainer.checkpoint()`` and ``trainer.save()`` stay the trainer's own methods): it reads and writes the models,
optimizer, scheduler, GradScaler, step count, ``best_perf``, the long-run guards' state and the EMA under Mortal's
checkpoint keys (``mortal.model.checkpoint.CHECKPOINT_KEYS``, plus ``guard``, ``ema_mortal``, ``ema_dqn``), with
the atomic save of ``mortal.model.checkpoint``. Its lines are logged as ``mortal.train``, the trainer's logger.
"""

import logging
from datetime import datetime
from os import path

from mortal.config import for_checkpoint, lookup
from mortal.learning.guards import INITIAL_GUARD
from mortal.model.checkpoint import (INITIAL_BEST_PERF, atomic_torch_save, check_fits_config, load_checkpoint,
                                     require_entries)

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)


class LearnerCheckpoint:
    """The trainer's checkpoint methods. The host (``mortal.train.Trainer``) provides ``config``, ``online``,
    ``device``, ``state_file``, the models ``mortal``, ``dqn``, ``aux_net``, ``optimizer``, ``scheduler``,
    ``scaler``, ``ema`` (None or the (mortal, dqn) EMA copies), and the state this class fills in: ``best_perf``,
    ``guard``, ``steps``, ``saved_steps`` (the step of ``state_file`` as last loaded or written), ``_loaded_ema``."""

    def load_state(self) -> bool:
        """Resume from ``[control] state_file`` if it exists; returns whether it did.

        An offline checkpoint loaded for online training keeps the config's optimizer/scheduler (Mortal).
        Raises CheckpointError: not loadable, lacking an entry, or weights that do not fit the config.
        """
        if not path.exists(self.state_file):
            logger.info('no checkpoint at %s: starting from scratch', self.state_file)
            return False
        state = load_checkpoint(self.state_file, map_location=self.device)
        require_entries(state, ('mortal', 'current_dqn', 'aux_net', 'steps'), self.state_file)
        ckpt_cfg = state.get('config')
        for model, entry in ((self.mortal, 'mortal'), (self.dqn, 'current_dqn'), (self.aux_net, 'aux_net')):
            check_fits_config(model, state[entry], entry=entry, source=self.state_file, ckpt_cfg=ckpt_cfg,
                              cfg=self.cfg)
            model.load_state_dict(state[entry])
        ckpt_online = bool(lookup(ckpt_cfg, 'control.online'))  # the checkpoint's plain dict, of any writer
        if 'optimizer' not in state or 'scheduler' not in state:
            logger.info('%s has no optimizer/scheduler state (a bare model checkpoint): starting them fresh',
                        self.state_file)
        elif not self.online or ckpt_online:
            self.optimizer.load_state_dict(state['optimizer'])
            self.scheduler.load_state_dict(state['scheduler'])
        else:
            logger.info('offline checkpoint in online mode: optimizer and scheduler start fresh from the config')
        if self.scaler.is_enabled() and state.get('scaler'):
            self.scaler.load_state_dict(state['scaler'])
        self.best_perf = dict(state.get('best_perf', INITIAL_BEST_PERF))
        self.guard = {**INITIAL_GUARD, **state.get('guard', {})}
        self.steps = int(state['steps'])
        self.saved_steps = self.steps
        if 'ema_mortal' in state and 'ema_dqn' in state:
            self._loaded_ema = (state['ema_mortal'], state['ema_dqn'])
        when = datetime.fromtimestamp(state.get('timestamp', 0)).strftime('%Y-%m-%d %H:%M:%S')
        logger.info('loaded %s (saved %s, steps %d)', self.state_file, when, self.steps)
        return True

    def played(self) -> tuple:
        """The (mortal, dqn) that self-play, test play and best.pth use: the EMA when ``[online] ema_decay`` > 0."""
        return self.ema if self.ema is not None else (self.mortal, self.dqn)

    def checkpoint(self) -> dict:
        """The checkpoint dict with Mortal's keys (config without the shared token), plus ``ema_mortal`` and
        ``ema_dqn`` with an EMA."""
        extra = {}
        if self.ema is not None:
            extra = {'ema_mortal': self.ema[0].state_dict(), 'ema_dqn': self.ema[1].state_dict()}
        if self.online:  # the long-run guards' state (mortal/learning/guards.py), after Mortal's keys
            extra['guard'] = dict(self.guard)
        return {
            'mortal': self.mortal.state_dict(),
            'current_dqn': self.dqn.state_dict(),
            'aux_net': self.aux_net.state_dict(),
            'optimizer': self.optimizer.state_dict(),
            'scheduler': self.scheduler.state_dict(),
            'scaler': self.scaler.state_dict(),
            'steps': self.steps,
            'timestamp': datetime.now().timestamp(),
            'best_perf': dict(self.best_perf),
            'config': for_checkpoint(self.config),
            **extra,
        }

    def stop_summary(self) -> str:
        """What a learner stopped now keeps and discards (its last line): the steps since ``saved_steps``, and
        online the claimed logs, which the next learner trains."""
        if self.saved_steps is None:
            kept = f'the {self.steps:,} steps trained discarded (no checkpoint written yet)'
        elif self.saved_steps == self.steps:
            kept = f'nothing discarded ({self.state_file} holds step {self.steps:,})'
        else:
            kept = (f'the {self.steps - self.saved_steps:,} steps since the last save discarded '
                    f'({self.state_file} keeps step {self.saved_steps:,})')
        if self.online:
            kept += '; claimed logs not yet trained are kept for the next learner'
        return kept

    def save(self) -> None:
        """Write ``checkpoint()`` to ``[control] state_file`` atomically; online, in one step with the claim
        ledger's commit (``mortal.data.claims.ClaimLedger.commit_with``), so that the ledger on disk always
        describes the checkpoint on disk, whatever the kill point; ``saved_steps`` is then its step."""
        ledger = getattr(self, 'ledger', None) if self.online else None
        if ledger is None:
            atomic_torch_save(self.checkpoint(), self.state_file)
        else:
            ledger.commit_with(self.steps, lambda: atomic_torch_save(self.checkpoint(), self.state_file))
        self.saved_steps = self.steps
