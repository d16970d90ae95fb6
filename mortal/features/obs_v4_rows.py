"""The version-4 observation array (1012x34), row by row, as Mortal's ``state/obs_repr.rs`` with ``version = 4``.

Rows 0-888 are the v3 rows of ``PlayerState.encode_obs(3, ...)`` re-packed (``ROW_TABLE``, ``repack_v3``: scores
get a clamp(s,0,30000)/30000 row instead of 9 RBF rows; honba/kyotaku become min(n,10)/10; doras owned/unseen keep
only their rescale row); rows 889-1011 are the single-player (SP) block (``SP_*``), written from the sorted
candidates of ``mortal.features.sp.calc`` by ``fill_sp_tables``, or from the fallback value by ``encode_ev``.
Pure functions of their inputs; ``mortal.features.obs_v4`` re-exports the names.
"""

from __future__ import annotations

import numpy as np

from mortal.features.sp.calc import MAX_TSUMOS_LEFT, best_by_required, deaka

OBS_CHANNELS_V3 = 934
OBS_CHANNELS_V4 = 1012
MAX_NUM_TURNS = MAX_TSUMOS_LEFT  # 17

# (name, v4 start, v3 start or None, rows) for rows 1-23, in the order of Mortal's ``obs_repr.rs``.
ROW_TABLE = (
    ("tehai", 0, 0, 4),
    ("akas_in_hand", 4, 4, 3),
    ("scores", 7, None, 8),           # per player: v3 row 7+10p, then clamp/3e4
    ("rank", 15, 47, 4),
    ("kyoku", 19, 51, 4),
    ("honba_kyotaku", 23, None, 2),
    ("bakaze_jikaze", 25, 59, 2),
    ("grand_kyoku", 27, 61, 1),
    ("dora_indicators", 28, 62, 7),
    ("kawa_and_tiles_left", 35, 69, 683),  # own kawa 96+1, opponents 585, tiles_left 1
    ("doras_owned", 718, None, 4),    # v3 rows 752, 755, 758, 761
    ("doras_unseen", 722, 764, 1),
    ("rest_v3", 723, 768, 166),       # kawa overview .. action rows (v3 768-933)
)
SP_START = 889
SP_EV = SP_START                       # 2 rows
SP_REQUIRED = SP_START + 2             # 68 rows (3n+2) / row +69 (3n+1)
SP_BEST = SP_START + 70                # 1 row (3n+2), then 1 empty row
SP_TABLE = SP_START + 72               # 3 x 17 rows: tenpai, win, EV


def fill_sp_tables(tables, can_discard: bool, obs) -> None:
    """Rows 889-1011 of ``obs`` (assumed zero) from the sorted, non-empty SP ``tables``."""
    max_ev = tables[0].exp_values[0] if tables[0].exp_values else 0.0
    encode_ev(obs, max_ev)
    if can_discard:
        for c in tables:
            row = SP_REQUIRED + (34 if c.shanten_down else 0) + deaka(c.tile)
            for r, _ in c.required_tiles:
                obs[row, r] = 1.0
        obs[SP_BEST, deaka(best_by_required(tables).tile)] = 1.0
    else:
        for r, _ in tables[0].required_tiles:
            obs[SP_REQUIRED + 69, r] = 1.0
    scale = 0.0 if max_ev < 1.0 else 1.0 / max_ev
    _encode_sp_table(obs, tables, can_discard, scale)


def repack_v3(v3: np.ndarray, scores, honba: int, kyotaku: int, out: np.ndarray) -> None:
    """Write v4 rows 0-888 into ``out`` (1012, 34) from a v3 array (934, 34) and getters.

    ``scores``: 4 ints, self first (``PlayerState.scores``).
    """
    if v3.shape != (OBS_CHANNELS_V3, 34):
        raise ValueError(f"expected a v3 observation (934, 34), got {v3.shape}")
    for name, start, src, n in ROW_TABLE:
        if src is not None:
            out[start:start + n] = v3[src:src + n]
    for p, s in enumerate(scores):
        out[7 + 2 * p] = v3[7 + 10 * p]
        out[8 + 2 * p] = min(max(s, 0), 30000) / 30000.0
    out[23] = min(honba, 10) / 10.0
    out[24] = min(kyotaku, 10) / 10.0
    for p in range(4):
        out[718 + p] = v3[752 + 3 * p]



def encode_ev(obs, value: float) -> None:
    """Rows 889-890 of ``obs``: the expected value (or the fallback value) in two scales."""
    obs[SP_EV] = min(max(value, 0.0), 100000.0) / 100000.0
    obs[SP_EV + 1] = min(max(value, 0.0), 30000.0) / 30000.0


def _encode_sp_table(obs, tables, can_discard: bool, scale: float) -> None:
    first = tables[0]
    if not first.tenpai_probs or not first.tenpai_probs[0] > 0.0:
        return  # probabilities not computed (shanten >= 4) or all zero
    cands = tables if can_discard else [first]
    for c in cands:
        col = deaka(c.tile) if can_discard else slice(None)
        tp = np.asarray(c.tenpai_probs)
        n = len(tp) if (tp > 0.0).all() else int(np.argmin(tp > 0.0))  # turns up to the first zero
        if n == 0:
            continue
        obs[SP_TABLE:SP_TABLE + n, col] = tp[:n, None] if not can_discard else tp[:n]
        wp = np.asarray(c.win_probs[:n])
        ev = np.minimum(np.asarray(c.exp_values[:n]) * scale, 1.0)
        rows = slice(SP_TABLE + MAX_NUM_TURNS, SP_TABLE + MAX_NUM_TURNS + n)
        obs[rows, col] = wp[:, None] if not can_discard else wp
        rows = slice(SP_TABLE + 2 * MAX_NUM_TURNS, SP_TABLE + 2 * MAX_NUM_TURNS + n)
        obs[rows, col] = ev[:, None] if not can_discard else ev
