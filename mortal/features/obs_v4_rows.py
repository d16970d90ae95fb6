"""The version-4 observation array (1012x34) row by row, as Mortal's ``obs_repr.rs``: rows 0-888 the
re-packed v3 rows (``ROW_TABLE``, the core's ``repack_v3``), 889-1011 the single-player block (``SP_*``)."""

from __future__ import annotations

OBS_CHANNELS_V3 = 934
OBS_CHANNELS_V4 = 1012

# (name, v4 start, v3 start or None, rows) for rows 1-23, in the order of Mortal's ``obs_repr.rs``; the core's
# ``repack_v3`` copies the same blocks (tests/test_obs_v4.py checks it against this table).
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
SP_EV = SP_START                       # 2 rows: the best EV (or the fallback value) /1e5 and /3e4
SP_REQUIRED = SP_START + 2             # 68 rows (3n+2: per discard, +34 if it lowers the shanten) / row +69 (3n+1)
SP_BEST = SP_START + 70                # 1 row (3n+2), then 1 empty row
SP_TABLE = SP_START + 72               # 3 x 17 rows: tenpai, win, EV by turn
