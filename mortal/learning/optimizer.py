"""The learner's optimization (Mortal's ``train.py``): AdamW with decay on Linear/Conv1d weights only, Mortal's
learning-rate schedule, and the optimizer step with AMP unscaling and gradient clipping.

The optimizer's base learning rate is 1, so that the schedule's factor (``mortal.learning.schedule``) is the learning
rate. With gradient accumulation (``[control] opt_step_every``) the scheduler steps every batch but the optimizer only
every ``opt_step_every`` batches, as in Mortal.
"""

from __future__ import annotations

import warnings
from itertools import chain

import torch
from torch import nn, optim

from mortal.learning.schedule import LinearWarmUpCosineAnnealingLR


def build_param_groups(models, weight_decay: float) -> list:
    """Two AdamW groups: weights of Linear/Conv1d layers decayed by ``weight_decay``; everything else (biases,
    norms) undecayed, each in a deterministic (sorted-name) order, as Mortal."""
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
    """``(AdamW, LinearWarmUpCosineAnnealingLR)`` over the parameters of ``models`` from the typed ``[optim]``
    (``mortal.config.typed``: ``weight_decay``, ``betas``, ``eps``, ``[optim.scheduler]``, whose keys the file
    leaves unset keep the scheduler's own defaults, as Mortal's). Raises ValueError on a schedule shape the config
    check rejects."""
    optimizer = optim.AdamW(build_param_groups(models, optim_cfg.weight_decay), lr=1, weight_decay=0,
                            betas=tuple(optim_cfg.betas), eps=optim_cfg.eps)
    scheduler = LinearWarmUpCosineAnnealingLR(optimizer, **optim_cfg.scheduler.model_dump(exclude_none=True))
    # With accumulation the scheduler steps before the optimizer has (Mortal): torch's warning about it is noise.
    warnings.filterwarnings('ignore', message=r'Detected call of `lr_scheduler.step\(\)` before')
    return optimizer, scheduler


def optimizer_step(optimizer, scaler, max_grad_norm: float) -> None:
    """Unscale the gradients, clip their norm to ``max_grad_norm`` (when > 0), step, update the GradScaler
    ``scaler``, clear the gradients."""
    if max_grad_norm > 0:
        scaler.unscale_(optimizer)  # clipping must see the true gradients, not the AMP-scaled ones
        params = chain.from_iterable(g['params'] for g in optimizer.param_groups)
        nn.utils.clip_grad_norm_(params, max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

