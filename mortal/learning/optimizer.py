"""The learner's optimization (Mortal's ``train.py``): AdamW with decay on Linear/Conv1d weights only, the optimizer
step with AMP unscaling and clipping, and Mortal's learning-rate schedule (``[optim.scheduler]``) times the
rollbacks' factor (``[guard] lr_factor``). The base lr is 1 so the schedule's factor is the learning rate."""

from __future__ import annotations

import math
import warnings
from itertools import chain

from torch import nn, optim
from torch.optim.lr_scheduler import LambdaLR

from mortal.config import scheduler_problems  # the same rules as the config check


def build_param_groups(models, weight_decay: float) -> list:
    """Two AdamW groups: Linear/Conv1d weights decayed, the rest not, each in sorted-name order, as Mortal."""
    decay, no_decay = [], []
    for model in models:
        params, to_decay = {}, set()
        for mod_name, mod in model.named_modules():
            for name, param in mod.named_parameters(prefix=mod_name, recurse=False):
                params[name] = param
                if isinstance(mod, (nn.Linear, nn.Conv1d)) and name.endswith('weight'):
                    to_decay.add(name)
        decay.extend(params[n] for n in sorted(to_decay))
        no_decay.extend(params[n] for n in sorted(params.keys() - to_decay))
    return [{'params': decay, 'weight_decay': weight_decay}, {'params': no_decay}]


def build_optimizer(models, optim_cfg) -> tuple:
    """``(AdamW, LinearWarmUpCosineAnnealingLR)`` over ``models`` from the typed ``[optim]``; ValueError on a schedule
    shape the config check rejects."""
    groups = build_param_groups(models, optim_cfg.weight_decay)
    optimizer = optim.AdamW(groups, lr=1, weight_decay=0, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                            fused=_fused(groups))
    scheduler = LinearWarmUpCosineAnnealingLR(optimizer, **optim_cfg.scheduler.model_dump(exclude_none=True))
    # With accumulation the scheduler steps before the optimizer has (Mortal): torch's warning about it is noise.
    warnings.filterwarnings('ignore', message=r'Detected call of `lr_scheduler.step\(\)` before')
    return optimizer, scheduler


def _fused(groups) -> bool | None:
    """True where every parameter is on the CPU: torch's fused AdamW there is the same update up to float rounding
    at half the CPU time of its default per-tensor loop in the learner's step (docs/performance.md, session 21).
    None (torch's choice) elsewhere, as Mortal."""
    return True if all(p.device.type == 'cpu' for g in groups for p in g['params']) else None


def load_optimizer_state(optimizer, state: dict) -> None:
    """``optimizer.load_state_dict(state)``, keeping how this process computes the step (``fused``, ``foreach``):
    torch takes those from the checkpoint's groups, which another machine or version wrote."""
    kept = [{k: g.get(k) for k in ('fused', 'foreach')} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, flags in zip(optimizer.param_groups, kept):
        group.update(flags)


def optimizer_step(optimizer, scaler, max_grad_norm: float) -> None:
    """Unscale, clip the grad norm to ``max_grad_norm`` (when > 0), step, update ``scaler``, zero the grads."""
    if max_grad_norm > 0:
        scaler.unscale_(optimizer)  # clipping must see the true gradients, not the AMP-scaled ones
        params = chain.from_iterable(g['params'] for g in optimizer.param_groups)
        nn.utils.clip_grad_norm_(params, max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


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
        """The learning rate at ``step``: Mortal's, times ``multiplier()`` (1 without one)."""
        scale = 1.0 if self.multiplier is None else self.multiplier()
        s = step + self.offset
        if self.epoch_size > 0:
            s %= self.epoch_size
        if self.warm_up_steps > 0 and s < self.warm_up_steps:
            return scale * (self.init + (self.peak - self.init) / self.warm_up_steps * s)
        if s < self.max_steps:
            progress = (s - self.warm_up_steps) / (self.max_steps - self.warm_up_steps)
            return scale * (self.final + 0.5 * (self.peak - self.final) * (1 + math.cos(progress * math.pi)))
        return scale * self.final

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
