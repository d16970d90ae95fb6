"""Per-kyoku rewards from the GRP model, as Mortal's ``mortal/reward_calculator.py``.

reward[k] = E[pt | state after kyoku k] - E[pt | state before kyoku k], where
E[pt] before kyoku k uses the GRP rank-probability matrix of the prefix of
rows 0..k and the state after the last kyoku is the actual final rank (one-hot).
``pts`` is ``[env] pts`` (points for ranks 1-4).
"""

from __future__ import annotations

import numpy as np
import torch

from mortal.model.checkpoint import CheckpointError, load_checkpoint, one_line, require_entries

__all__ = ["RewardCalculator", "load_grp"]


def load_grp(state_file, network: dict | None = None, device="cpu"):
    """A ``mortal.model.networks.GRP`` in eval mode with weights from a ``train_grp`` checkpoint.

    ``network`` is ``[grp.network]`` (``hidden_size``, ``num_layers``). The file holds
    ``{model, optimizer, steps, timestamp}``; only ``model`` is used. Loaded with
    ``weights_only=True`` (no code executed).

    Raises:
        FileNotFoundError: no such file.
        mortal.model.checkpoint.CheckpointError: not a weights-only torch file, no ``model`` entry, or weights whose
            shapes do not fit ``network`` (the message names the file, the ``[grp.network]`` sizes and torch's
            shape report).
    """
    from mortal.model.networks import GRP

    network = dict(network or {})
    grp = GRP(**network)
    state = require_entries(load_checkpoint(state_file), ("model",), state_file, kind="GRP checkpoint")
    try:
        grp.load_state_dict(state["model"])
    except (RuntimeError, TypeError, AttributeError) as e:
        raise CheckpointError(state_file, f"GRP weights do not fit [grp.network] {network or 'defaults'}: "
                                          f"{one_line(e)}") from None
    return grp.to(device).eval()


class RewardCalculator:
    """Kyoku rewards for one seat of one game.

    Args:
        grp: a ``mortal.model.networks.GRP`` (float64); put in eval mode on ``device``.
        pts: points by final rank, e.g. ``[6, 4, 2, 0]``; default ``[3, 1, -1, -3]`` as Mortal.
        device: torch device for the GRP forward pass.
        uniform_init: replace the E1 prediction with a uniform 1/4 (Mortal's option).
    """

    def __init__(self, grp=None, pts=None, device="cpu", *, uniform_init: bool = False):
        if grp is None:
            raise ValueError("RewardCalculator needs a GRP model (see mortal.data.reward.load_grp)")
        self.device = torch.device(device)
        self.grp = grp.to(self.device).eval()
        self.uniform_init = uniform_init
        pts = list(pts) if pts is not None else [3, 1, -1, -3]
        if len(pts) != 4:
            raise ValueError(f"pts must have 4 entries (ranks 1-4), got {pts!r}")
        self.pts = torch.tensor(pts, dtype=torch.float64, device=self.device)

    def calc_grp(self, grp_feature: np.ndarray) -> torch.Tensor:
        """``grp_feature (K, 7)`` float64 -> ``(K, 4, 4)`` float64 P(seat p at rank r) for prefixes 1..K."""
        feature = torch.as_tensor(np.asarray(grp_feature, dtype=np.float64), device=self.device)
        seqs = [feature[:k + 1] for k in range(feature.shape[0])]
        with torch.inference_mode():
            logits = self.grp(seqs)
            return self.grp.calc_matrix(logits)

    def calc_rank_prob(self, player_id: int, grp_feature, rank_by_player) -> torch.Tensor:
        """``(K+1, 4)`` float64: rank distribution of ``player_id`` before each kyoku, then the actual final rank."""
        matrix = self.calc_grp(grp_feature)
        final = torch.zeros((1, 4), dtype=torch.float64, device=matrix.device)
        final[0, int(rank_by_player[player_id])] = 1.0
        rank_prob = torch.cat((matrix[:, player_id].to(torch.float64), final))
        if self.uniform_init:
            rank_prob[0, :] = 0.25
        return rank_prob

    def calc_delta_pt(self, player_id: int, grp_feature, rank_by_player) -> np.ndarray:
        """``(K,)`` float64 reward of each kyoku in pts units for ``player_id`` (0-3)."""
        exp_pts = self.calc_rank_prob(player_id, grp_feature, rank_by_player).to(self.pts.device) @ self.pts
        return (exp_pts[1:] - exp_pts[:-1]).cpu().numpy()

    def calc_delta_points(self, player_id: int, grp_feature, final_scores) -> np.ndarray:
        """``(K,)`` float64 raw score change (points) of ``player_id`` in each kyoku."""
        feature = np.asarray(grp_feature, dtype=np.float64)
        seq = np.concatenate((np.rint(feature[:, 3 + player_id] * 1e4), [final_scores[player_id]]))
        return seq[1:] - seq[:-1]
