"""The learner's loss: Mortal's ``0.5 * MSE(q[taken], G) + next_rank_weight * CE + min_q_weight * CQL`` (CQL
offline only), and the extras, off by default (docs/learning.md). ``q_out (B, 46)`` float, ``-inf`` where illegal;
``masks (B, 46)`` bool; ``actions (B,)`` int64; ``q_target (B,)`` float32 (``gamma ** steps_to_done * reward``)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


class LossWeights(NamedTuple):
    """The weight of each term, resolved for online or offline training (``resolve``)."""

    cql: float  # CQL on the online rows (all rows offline)
    with_cql: bool  # whether that term is computed (and logged) at all
    offline_cql: float  # CQL on the offline-mix rows
    anchor: float
    next_rank: float
    calibrated: bool  # Cal-QL instead of CQL, in both CQL terms
    counterfactual: float = 0.0  # the counterfactual term (computed only when > 0)

    @classmethod
    def resolve(cls, *, online: bool, min_q_weight: float, online_min_q_weight: float, anchor_weight: float,
                next_rank_weight: float, calibrated: bool, counterfactual_weight: float = 0.0) -> LossWeights:
        """Offline, CQL at ``min_q_weight`` (computed even at 0: Mortal logs it); online, CQL only when
        ``online_min_q_weight`` > 0, plus the mix rows' CQL, the anchor and counterfactual terms."""
        cql = online_min_q_weight if online else min_q_weight
        return cls(cql=cql, with_cql=not online or cql > 0, offline_cql=min_q_weight,
                   anchor=anchor_weight if online else 0.0, next_rank=next_rank_weight, calibrated=calibrated,
                   counterfactual=counterfactual_weight if online else 0.0)


class LossTerms(NamedTuple):
    """What ``learner_loss`` returns: scalar tensors (float32), None for a term that is off."""

    total: Tensor  # the weighted sum to backpropagate
    dqn_loss: Tensor
    next_rank_loss: Tensor
    cql_loss: Optional[Tensor]
    offline_cql_loss: Optional[Tensor]
    anchor_loss: Optional[Tensor]
    q: Tensor  # (B,) Q of the taken actions, in the forward pass's dtype (for the q histograms)
    counterfactual_loss: Optional[Tensor] = None


def learner_loss(q_out: Tensor, next_rank_logits: Tensor, actions: Tensor, q_target: Tensor, player_ranks: Tensor,
                 *, masks: Tensor, online_rows: int, weights: LossWeights, q_ref: Optional[Tensor] = None,
                 cf_actions: Optional[Tensor] = None, cf_deltas: Optional[Tensor] = None) -> LossTerms:
    """The loss of one batch of ``B`` rows, the first ``online_rows`` online, the rest offline-mix rows.

    ``next_rank_logits (B, 4)``, ``player_ranks (B,)`` int64 in 0..3; ``q_ref (online_rows, 46)``: the anchor's Q;
    ``cf_actions (B,)`` int64 (-1: none), ``cf_deltas (B,)`` float (None: no term). Call inside autocast; every term
    is computed in float32."""
    n = online_rows
    rows = torch.arange(q_out.shape[0], device=q_out.device)
    q = q_out[rows, actions]
    # Mortal: the Monte-Carlo regression of the taken action's Q, and the next-rank auxiliary head.
    dqn_loss = 0.5 * F.mse_loss(q.float(), q_target)
    next_rank_loss = F.cross_entropy(next_rank_logits.float(), player_ranks)
    # Conservatism on the untaken actions: CQL (Mortal's, offline), its online and offline-mix extras, the anchor.
    cql_loss = offline_cql_loss = anchor_loss = counterfactual_loss = None
    if weights.with_cql:
        cql_loss = cql_term(q_out[:n], actions[:n], q_target[:n], calibrated=weights.calibrated)
    if q_out.shape[0] > n:
        offline_cql_loss = cql_term(q_out[n:], actions[n:], q_target[n:], calibrated=weights.calibrated)
    if q_ref is not None and weights.anchor > 0:
        anchor_loss = anchor_term(q_out[:n], q_ref, masks[:n], actions[:n])
    if weights.counterfactual > 0 and cf_actions is not None:
        counterfactual_loss = counterfactual_term(q_out, actions, cf_actions, cf_deltas)
    total = dqn_loss
    for term, weight in ((cql_loss, weights.cql), (anchor_loss, weights.anchor),
                         (offline_cql_loss, weights.offline_cql), (next_rank_loss, weights.next_rank),
                         (counterfactual_loss, weights.counterfactual)):
        if term is not None:  # a term that is off adds nothing
            total = total + term * weight
    return LossTerms(total, dqn_loss, next_rank_loss, cql_loss, offline_cql_loss, anchor_loss, q,
                     counterfactual_loss)


def cql_term(q_out: Tensor, actions: Tensor, q_target: Tensor | None = None, *, calibrated: bool = False) -> Tensor:
    """CQL(H): ``mean(logsumexp_legal(q) - q[taken])``, a scalar >= 0; ``calibrated`` (Cal-QL): over ``max(q,
    q_target)``."""
    q_out = q_out.float()
    rows = torch.arange(q_out.shape[0], device=q_out.device)
    q_taken = q_out[rows, actions]
    if calibrated:
        legal = torch.isfinite(q_out)
        clamped = torch.maximum(q_out, q_target.float().unsqueeze(-1))
        q_out = clamped.masked_fill(~legal, -torch.inf)
    return (q_out.logsumexp(-1) - q_taken).mean()


def anchor_term(q_out: Tensor, q_ref: Tensor, masks: Tensor, actions: Tensor) -> Tensor:
    """Mean squared difference to ``q_ref (B, 46)`` over legal untaken actions (0 if none); squared pts."""
    untaken = masks.to(torch.bool).clone()
    untaken[torch.arange(untaken.shape[0], device=untaken.device), actions] = False
    if not untaken.any():
        return q_out.new_zeros((), dtype=torch.float32)
    diff = (q_out.float() - q_ref.float())[untaken]
    return diff.pow(2).mean()


def counterfactual_term(q_out: Tensor, actions: Tensor, cf_actions: Tensor, cf_deltas: Tensor) -> Tensor:
    """Mean of ``((q[cf_action] - q[action]) - cf_delta) ** 2`` (float32, squared pts) over rows with
    ``cf_actions >= 0`` (0 if none); ``cf_deltas (B,)``: branch value minus real one, pts."""
    has = cf_actions >= 0
    if not has.any():
        return q_out.new_zeros((), dtype=torch.float32)
    q = q_out.float()[has]
    rows = torch.arange(q.shape[0], device=q.device)
    gap = q[rows, cf_actions[has]] - q[rows, actions[has]]
    return (gap - cf_deltas[has].float()).pow(2).mean()

