"""The learner's loss terms on one batch, as pure functions of tensors.

Mortal's loss is ``0.5 * MSE(q[taken], G) + next_rank_weight * CE + min_q_weight * CQL`` with the CQL term offline
only. The extras below are off by default (Mortal's behaviour) and exist because online fine-tuning without any
term on the untaken actions lets the ranking of actions dissolve (``docs/learning.md``):

* ``cql_term(..., calibrated=True)``: Cal-QL (Nakamoto et al. 2023, arXiv 2303.05479) clamps the pushed-down
  values at the Monte-Carlo return, so conservatism never drives a Q below what the data shows it is worth;
* ``anchor_term``: MSE of the untaken legal actions' Q to a frozen reference model's Q (the baseline), a trust
  region that keeps what the data says nothing about where it was.

Shapes: ``q_out (B, 46)`` float with ``-inf`` at illegal actions (``mortal.model.DQN``), ``masks (B, 46)`` bool,
``actions (B,)`` int64, ``q_target (B,)`` float32 (``gamma ** steps_to_done * kyoku_reward``, in ``[env] pts``
units).
"""

from __future__ import annotations

import torch
from torch import Tensor


def cql_term(q_out: Tensor, actions: Tensor, q_target: Tensor | None = None, *, calibrated: bool = False) -> Tensor:
    """CQL(H) for discrete actions: ``mean(logsumexp_legal(q) - q[taken])``, a scalar >= 0.

    With ``calibrated`` (Cal-QL) the push-down runs over ``max(q, G)`` per legal action, ``G = q_target`` of the
    row: an action already valued below the row's return is not pushed further. The taken action's pull-up is
    unchanged. Raises ValueError when ``calibrated`` is set without ``q_target``.
    """
    q_out = q_out.float()
    rows = torch.arange(q_out.shape[0], device=q_out.device)
    q_taken = q_out[rows, actions]
    if calibrated:
        if q_target is None:
            raise ValueError('the calibrated (Cal-QL) CQL term needs q_target')
        legal = torch.isfinite(q_out)
        clamped = torch.maximum(q_out, q_target.float().unsqueeze(-1))
        q_out = clamped.masked_fill(~legal, -torch.inf)
    return (q_out.logsumexp(-1) - q_taken).mean()


def anchor_term(q_out: Tensor, q_ref: Tensor, masks: Tensor, actions: Tensor) -> Tensor:
    """Mean squared difference to ``q_ref (B, 46)`` (a frozen model's Q) over legal actions other than the taken
    one; 0 when no row has a second legal action. A scalar in squared ``pts`` units."""
    untaken = masks.to(torch.bool).clone()
    untaken[torch.arange(untaken.shape[0], device=untaken.device), actions] = False
    if not untaken.any():
        return q_out.new_zeros((), dtype=torch.float32)
    diff = (q_out.float() - q_ref.float())[untaken]
    return diff.pow(2).mean()
