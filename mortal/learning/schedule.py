"""Mortal's learning-rate schedule (``[optim.scheduler]``, ``LinearWarmUpCosineAnnealingLR``), times the long-run
guards' factor after a rollback (``[guard] lr_factor``)."""

from __future__ import annotations

import math

from torch.optim.lr_scheduler import LambdaLR

from mortal.config import scheduler_problems  # the same rules as the config check


class LinearWarmUpCosineAnnealingLR(LambdaLR):
    """Mortal's schedule (base lr 1): with ``s = step + offset`` (mod ``epoch_size`` when > 0), linear from ``init``
    to ``peak`` over ``warm_up_steps``, cosine to ``final`` at ``max_steps``, then ``final``. ValueError on a shape
    that ``mortal.config.scheduler_problems`` rejects."""

    def __init__(self, optimizer, *, peak, final, warm_up_steps, max_steps, init=1e-8, offset=0, epoch_size=0,
                 **kwargs):
        problems = scheduler_problems(peak=peak, final=final, warm_up_steps=warm_up_steps, max_steps=max_steps,
                                      init=init, offset=offset, epoch_size=epoch_size)
        if problems:
            raise ValueError('; '.join(f'[optim.scheduler] {key} {rule}' for key, rule in problems))
        self.init, self.peak, self.final = init, peak, final
        self.warm_up_steps, self.max_steps = warm_up_steps, max_steps
        self.offset, self.epoch_size = offset, epoch_size
        self.multiplier = None  # extra: a callable giving the rollbacks' factor (None = 1, Mortal)
        super().__init__(optimizer, lr_lambda=self.factor, **kwargs)

    def factor(self, step: int) -> float:
        """The learning rate at ``step``: ``base_factor(step)`` times ``multiplier()`` (1 without one)."""
        scale = 1.0 if self.multiplier is None else self.multiplier()
        return scale * self.base_factor(step)

    def base_factor(self, step: int) -> float:
        """Mortal's learning rate at ``step``, without ``multiplier``."""
        s = step + self.offset
        if self.epoch_size > 0:
            s %= self.epoch_size
        if self.warm_up_steps > 0 and s < self.warm_up_steps:
            return self.init + (self.peak - self.init) / self.warm_up_steps * s
        if s < self.max_steps:
            progress = (s - self.warm_up_steps) / (self.max_steps - self.warm_up_steps)
            return self.final + 0.5 * (self.peak - self.final) * (1 + math.cos(progress * math.pi))
        return self.final

    _SHAPE_KEYS = ('init', 'peak', 'final', 'warm_up_steps', 'max_steps', 'offset', 'epoch_size')

    def state_dict(self):
        """Plain numbers only (loadable with ``weights_only=True``); the factor function is not stored."""
        return {k: v for k, v in self.__dict__.items() if k not in ('optimizer', 'lr_lambdas', 'multiplier')}

    def load_state_dict(self, state_dict):
        """Restore the position but keep the config's shape, so an edited ``[optim.scheduler]`` takes effect
        (Mortal kept the old one). Accepts Mortal's checkpoints."""
        for key, value in state_dict.items():
            if key not in self._SHAPE_KEYS and key not in ('lr_lambdas', 'multiplier'):
                self.__dict__[key] = value
        self.refresh()

    def refresh(self) -> None:
        """Set the optimizer's learning rates to the schedule's value now."""
        lrs = [base * self.factor(self.last_epoch) for base in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group['lr'] = lr
        self._last_lr = lrs
