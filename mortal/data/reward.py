"""Per-kyoku rewards (``[env] reward``): ``'grp'``, Mortal's ``reward_calculator.py``, E[pt | after kyoku k] -
E[pt | before kyoku k] by the GRP's rank probabilities (the last state: the final rank); ``'points'`` (the
bootstrap's fallback for a GRP no better than uniform): the seat's score change times ``points_scale(pts)``."""

from __future__ import annotations

import numpy as np
import torch

from mortal.data.grp import rank_by_player as ranks_of
from mortal.model.checkpoint import CheckpointError, load_checkpoint, one_line, require_entries

REWARDS = ("grp", "points")
# Points of score mapped onto max(pts) - min(pts): about a hanchan's final gap between first and last.
POINTS_SPREAD = 30000.0


def points_scale(pts) -> float:
    """pt per point of score, ``(max(pts) - min(pts)) / POINTS_SPREAD``; ValueError for pts without 4 entries."""
    pts = [float(p) for p in pts]
    if len(pts) != 4:
        raise ValueError(f"pts must have 4 entries (ranks 1-4), got {pts!r}")
    return (max(pts) - min(pts)) / POINTS_SPREAD


def load_grp(state_file, network=None):
    """The eval-mode ``GRP`` of a ``train_grp`` checkpoint, sized by the typed ``[grp.network]`` (None: defaults).
    Raises FileNotFoundError, or ``CheckpointError`` naming the file, the sizes and torch's shape report."""
    from mortal.model.networks import GRP

    grp = GRP(hidden_size=network.hidden_size, num_layers=network.num_layers) if network is not None else GRP()
    state = require_entries(load_checkpoint(state_file), ("model",), state_file, kind="GRP checkpoint")
    try:
        grp.load_state_dict(state["model"])
    except (RuntimeError, TypeError, AttributeError) as e:
        shape = network.model_dump() if network is not None else 'defaults'
        raise CheckpointError(state_file, f"GRP weights do not fit [grp.network] {shape}: "
                                          f"{one_line(e)}") from None
    return grp.eval()


class RewardCalculator:
    """Kyoku rewards of one seat: ``grp`` (the GRP; None with ``reward='points'``), ``pts`` by final rank (default
    Mortal's ``[3, 1, -1, -3]``), ``uniform_init`` (a uniform E1 prediction, Mortal's option). ValueError for a
    missing GRP, an unknown reward or pts without 4 entries."""

    def __init__(self, grp=None, pts=None, *, uniform_init: bool = False, reward: str = "grp"):
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if grp is None and reward == "grp":
            raise ValueError("RewardCalculator needs a GRP model (see mortal.data.reward.load_grp)")
        self.grp = None if grp is None else grp.cpu().eval()
        self.uniform_init = uniform_init
        self.reward = reward
        pts = list(pts) if pts is not None else [3, 1, -1, -3]
        self.points_scale = points_scale(pts)
        self.pts = torch.tensor(pts, dtype=torch.float64)

    def calc_grp(self, grp_feature: np.ndarray) -> torch.Tensor:
        """``grp_feature (K, 7)`` float64 -> ``(K, 4, 4)`` float64 P(seat p at rank r) for prefixes 1..K."""
        feature = torch.as_tensor(np.asarray(grp_feature, dtype=np.float64))
        seqs = [feature[:k + 1] for k in range(feature.shape[0])]
        with torch.inference_mode():
            logits = self.grp(seqs)
            return self.grp.calc_matrix(logits)

    def calc_rank_prob(self, player_id: int, grp_feature, rank_by_player) -> torch.Tensor:
        """``(K+1, 4)`` float64: rank distribution of ``player_id`` before each kyoku, then the actual final rank."""
        matrix = self.calc_grp(grp_feature)
        final = torch.zeros((1, 4), dtype=torch.float64)
        final[0, int(rank_by_player[player_id])] = 1.0
        rank_prob = torch.cat((matrix[:, player_id].to(torch.float64), final))
        if self.uniform_init:
            rank_prob[0, :] = 0.25
        return rank_prob

    def calc_delta_pt(self, player_id: int, grp_feature, rank_by_player) -> np.ndarray:
        """``(K,)`` float64 reward of each kyoku in pts units for ``player_id`` (0-3)."""
        exp_pts = self.calc_rank_prob(player_id, grp_feature, rank_by_player) @ self.pts
        return (exp_pts[1:] - exp_pts[:-1]).numpy()

    def calc_delta_points(self, player_id: int, grp_feature, final_scores) -> np.ndarray:
        """``(K,)`` float64 raw score change (points) of ``player_id`` in each kyoku."""
        feature = np.asarray(grp_feature, dtype=np.float64)
        seq = np.concatenate((np.rint(feature[:, 3 + player_id] * 1e4), [final_scores[player_id]]))
        return seq[1:] - seq[:-1]

    def calc_points_reward(self, player_id: int, grp_feature, final_scores) -> np.ndarray:
        """``(K,)`` float64 ``'points'`` reward in pts units: ``calc_delta_points`` times ``points_scale(pts)``."""
        return self.calc_delta_points(player_id, grp_feature, final_scores) * self.points_scale

    def kyoku_rewards(self, player_id: int, grp_feature, rank_by_player, final_scores) -> np.ndarray:
        """``(K,)`` float64 reward of each kyoku for ``player_id`` by ``self.reward``, from a ``Grp``'s
        ``feature (K, 7)``, ``rank_by_player (4,)`` and ``final_scores (4,)``."""
        if self.reward == "points":
            return self.calc_points_reward(player_id, grp_feature, final_scores)
        return self.calc_delta_pt(player_id, grp_feature, rank_by_player)

    def counterfactual_deltas(self, player_id: int, grp_feature, rank_by_player, final_scores, at_kyoku,
                              records) -> np.ndarray:
        """``(M,)`` float64 V(branch's outcome) - V(real outcome) in pts of ``M`` counterfactual branches, V by
        ``self.reward`` as ``kyoku_rewards`` values the state after a kyoku. The game as ``kyoku_rewards`` takes it;
        ``at_kyoku (M,)``: each decision's kyoku; ``records``: M ``('next', [kyoku_index, honba, kyotaku, s0..s3])``
        or ``('final', [s0..s3])``, as ``mortal.play.arena`` writes them."""
        at_kyoku = np.asarray(at_kyoku, dtype=np.int64)
        m = len(records)
        if m == 0:
            return np.zeros(0, dtype=np.float64)
        feature = np.asarray(grp_feature, dtype=np.float64)
        real_scores = np.concatenate((np.rint(feature[:, 3:] * 1e4), [np.asarray(final_scores, np.float64)]))
        if self.reward == "points":
            branch = np.array([float(v[3 + player_id] if kind == "next" else v[player_id]) for kind, v in records])
            return (branch - real_scores[at_kyoku + 1, player_id]) * self.points_scale
        pts = self.pts.numpy()
        exp_pts = (self.calc_rank_prob(player_id, feature, rank_by_player) @ self.pts).numpy()
        out = np.empty(m, dtype=np.float64)
        seqs, where = [], []
        for j, ((kind, v), k) in enumerate(zip(records, at_kyoku)):
            if kind == "final":
                out[j] = pts[ranks_of(v)[player_id]]
                continue
            row = np.array([[v[0], v[1], v[2], *(s / 10000 for s in v[3:7])]], dtype=np.float64)
            seqs.append(torch.as_tensor(np.concatenate((feature[:k + 1], row))))
            where.append(j)
        if seqs:
            with torch.inference_mode():
                matrix = self.grp.calc_matrix(self.grp(seqs))  # (n, 4, 4): P(seat p at rank r)
            out[where] = (matrix[:, player_id].to(torch.float64) @ self.pts).numpy()
        return out - exp_pts[at_kyoku + 1]
