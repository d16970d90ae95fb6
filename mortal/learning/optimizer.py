"""The learner's optimization (Mortal's ``train.py``): AdamW with decay on Linear/Conv1d weights only, and the
optimizer step with AMP unscaling and clipping. The base lr is 1 so the schedule's factor is the learning rate."""

from __future__ import annotations

import warnings
from itertools import chain

from torch import nn, optim

from mortal.learning.schedule import LinearWarmUpCosineAnnealingLR


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
    optimizer = optim.AdamW(build_param_groups(models, optim_cfg.weight_decay), lr=1, weight_decay=0,
                            betas=tuple(optim_cfg.betas), eps=optim_cfg.eps)
    scheduler = LinearWarmUpCosineAnnealingLR(optimizer, **optim_cfg.scheduler.model_dump(exclude_none=True))
    # With accumulation the scheduler steps before the optimizer has (Mortal): torch's warning about it is noise.
    warnings.filterwarnings('ignore', message=r'Detected call of `lr_scheduler.step\(\)` before')
    return optimizer, scheduler


def optimizer_step(optimizer, scaler, max_grad_norm: float) -> None:
    """Unscale, clip the grad norm to ``max_grad_norm`` (when > 0), step, update ``scaler``, zero the grads."""
    if max_grad_norm > 0:
        scaler.unscale_(optimizer)  # clipping must see the true gradients, not the AMP-scaled ones
        params = chain.from_iterable(g['params'] for g in optimizer.param_groups)
        nn.utils.clip_grad_norm_(params, max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

