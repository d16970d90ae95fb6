"""Test oracle: the Python half of the version-4 single-player path as it was before the rows moved into the
compiled core (``mortal.features.sp._core.sp_rows``): the candidate type, Mortal's ranking of candidates, the
calculator's context and thin wrappers of the core's ``sp_calc``, ``shanten`` and ``agari`` bindings.

``tests/sp_oracle/v4_rows.py`` builds a decision's rows 889-1011 from these the old way; the tests check the core's
rows against them bit for bit. See ``tests/sp_oracle/search.py`` for the search itself in pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from mortal.features.sp.calc import require_core

SHANTEN_THRES = 3
MAX_TSUMOS_LEFT = 17
_FIVE = (4, 13, 22)

# Mortal's tile.rs discard priorities (higher = discarded first on ties).
DISCARD_PRIORITIES = (
    6, 5, 4, 3, 2, 3, 4, 5, 6,
    6, 5, 4, 3, 2, 3, 4, 5, 6,
    6, 5, 4, 3, 2, 3, 4, 5, 6,
    7, 7, 7, 7, 7, 7, 7,
    1, 1, 1,
    0,
)


def deaka(t: int) -> int:
    return _FIVE[t - 34] if 34 <= t <= 36 else t


def _shift_tile(t: int, step: int) -> int:
    """The tile ``step`` places after ``t`` (deaka'd) in the dora order: 1-9 of a suit, E S W N, P F C, each cyclic."""
    t = deaka(t)
    if t < 27:
        return t // 9 * 9 + (t % 9 + step) % 9
    if t < 31:
        return 27 + (t - 27 + step) % 4
    return 31 + (t - 31 + step) % 3


def next_tile(t: int) -> int:
    """Dora from its indicator (deaka'd)."""
    return _shift_tile(t, 1)


def cmp_discard_priority(a: int, b: int) -> int:
    """>0 if ``a`` is preferred over ``b`` as a discard (Mortal ``cmp_discard_priority``)."""
    pa, pb = DISCARD_PRIORITIES[a], DISCARD_PRIORITIES[b]
    if pa != pb:
        return 1 if pa > pb else -1
    return (b > a) - (b < a)


@dataclass
class Candidate:
    """One row of the SP table.

    ``tile``: discard (0-36; 37 for the 3n+1 "draw" candidate); ``tenpai_probs``,
    ``win_probs``, ``exp_values``: per turn offset (length = tsumos left; empty
    on the simple path); ``required_tiles``: list of ``(tile 0-33, count left)``.
    """
    tile: int
    tenpai_probs: list = field(default_factory=list)
    win_probs: list = field(default_factory=list)
    exp_values: list = field(default_factory=list)
    required_tiles: list = field(default_factory=list)
    shanten_down: bool = False

    @property
    def num_required_tiles(self) -> int:
        """Tiles left that lower the shanten (computed once: candidates are not mutated)."""
        n = self.__dict__.get("_num_required")
        if n is None:
            n = self.__dict__["_num_required"] = sum(c for _, c in self.required_tiles)
        return n


_COLUMNS = (lambda c: c.exp_values[0], lambda c: c.win_probs[0], lambda c: c.tenpai_probs[0],
            lambda c: not c.shanten_down, lambda c: c.num_required_tiles)


def _cmp(l: Candidate, r: Candidate, by: int) -> int:
    # columns from ``by`` on: 0 EV, 1 win prob, 2 tenpai prob, 3 not-shanten-down, 4 required count; then priority
    if l.tile == r.tile:
        return 0
    for column in _COLUMNS[by:]:  # read lazily: a candidate sorted from column 3 has no EVs
        a, b = column(l), column(r)
        if a != b:
            return 1 if a > b else -1
    return cmp_discard_priority(l.tile, r.tile)


def _sort_key(c: Candidate, by_ev: bool) -> tuple:
    """Ascending key equal to descending ``_cmp`` (by EV when ``by_ev``, else from column 3).

    ``_cmp`` orders distinct tiles totally (the last column, discard priority,
    then the lower id, never ties), so a stable sort on this key gives the
    order Mortal's sort gives.
    """
    tail = (c.shanten_down, -c.num_required_tiles, -DISCARD_PRIORITIES[c.tile], c.tile)
    if by_ev:
        return (-c.exp_values[0], -c.win_probs[0], -c.tenpai_probs[0]) + tail
    return tail


def sort_candidates(cands: list, by_ev: bool) -> list:
    """``cands`` best first: by EV, win and tenpai probability when ``by_ev`` (the
    full search), else by (not shanten-down, required-tile count, discard priority)."""
    return sorted(cands, key=lambda c: _sort_key(c, by_ev))


def best_by_required(cands: list) -> Candidate:
    """Candidate ranking highest by (not shanten-down, required-tile count, discard priority)."""
    best = cands[0]
    for c in cands[1:]:
        if _cmp(c, best, 3) >= 0:  # Rust max_by keeps the last maximum
            best = c
    return best


class SPCalculator:
    """Fixed context of one SP calculation (Mortal ``SPCalculator`` fields).

    ``chis``/``pons``/``minkans``/``ankans``: deaka'd tile ids of own calls (chi =
    lowest tile); ``bakaze``/``jikaze``: 27-30; ``num_doras_in_fuuro``: doras in
    calls incl. ankan; ``dora_indicators``: ids; ``prefer_riichi``: assume riichi
    when menzen; ``calc_double_riichi``/``calc_haitei``: add those han.
    """

    def __init__(self, *, tehai_len_div3, chis, pons, minkans, ankans, bakaze, jikaze,
                 is_menzen, num_doras_in_fuuro, dora_indicators, calc_double_riichi,
                 calc_haitei, prefer_riichi):
        self.len_div3 = tehai_len_div3
        self.chis = tuple(chis)
        self.pons = tuple(pons)
        self.minkans = tuple(minkans)
        self.ankans = tuple(ankans)
        self.bakaze = bakaze
        self.jikaze = jikaze
        self.is_menzen = is_menzen
        self.num_doras_in_fuuro = num_doras_in_fuuro
        self.dora_indicators = tuple(deaka(t) for t in dora_indicators)
        self.doras = tuple(next_tile(t) for t in self.dora_indicators)
        self.calc_double_riichi = calc_double_riichi
        self.calc_haitei = calc_haitei
        self.prefer_riichi = prefer_riichi

    def calc(self, tehai, akas_in_hand, tiles_seen, akas_seen, can_discard: bool,
             tsumos_left: int, cur_shanten: int) -> list:
        """Sorted candidates, best first (see ``Candidate``), from the compiled core.

        ``tehai``: 34 counts (3n+2 if ``can_discard`` else 3n+1); ``akas_in_hand``,
        ``akas_seen``: 3 bools (m, p, s); ``tiles_seen``: 34 counts visible to the
        player (own hand included). Raises ValueError unless ``cur_shanten >= 0`` and
        ``1 <= tsumos_left <= 17`` (and for any field the core refuses, naming it),
        ``SPCoreMissing`` when the core is not built.
        """
        if cur_shanten < 0:
            raise ValueError("can't calculate an agari hand")
        if not 1 <= tsumos_left <= MAX_TSUMOS_LEFT:
            raise ValueError(f"tsumos_left must be 1-17, got {tsumos_left}")
        raw = require_core().sp_calc(*self.core_args(tehai, akas_in_hand, tiles_seen, akas_seen, can_discard,
                                                     tsumos_left, cur_shanten))
        return sort_candidates(_candidates(raw), cur_shanten <= SHANTEN_THRES)

    def core_args(self, tehai, akas_in_hand, tiles_seen, akas_seen, can_discard: bool, tsumos_left: int,
                  cur_shanten: int) -> tuple:
        """The argument tuple of ``_core.sp_calc`` for ``calc``'s arguments (see ``calc_batch``)."""
        return (self.len_div3, bytes(self.chis), bytes(self.pons), bytes(self.minkans), bytes(self.ankans),
                self.bakaze, self.jikaze, self.is_menzen, self.num_doras_in_fuuro,
                bytes(self.dora_indicators), self.calc_double_riichi, self.calc_haitei, self.prefer_riichi,
                bytes(tehai), _bits(akas_in_hand), bytes(tiles_seen), _bits(akas_seen), bool(can_discard),
                tsumos_left, cur_shanten)


def _candidates(raw) -> list:
    return [Candidate(tile, list(tp), list(wp), list(ev), list(req), sd) for tile, tp, wp, ev, req, sd in raw]


def _bits(flags) -> int:
    """3 bools (m, p, s) as a bit mask."""
    return sum(1 << i for i, f in enumerate(flags) if f)


def calc_all(tehai, len_div3: int) -> int:
    """Least shanten over standard, seven pairs and (fully concealed) thirteen orphans, with the four-copies limit
    (Mortal's ``algo/shanten.rs``).

    ``tehai``: 34 counts (0-4) of the concealed tiles; ``len_div3``: melds still to be formed from them (4 minus
    calls, 0-4). Works for 3n+1 and 3n+2 hands; -1 = complete. ValueError on a count outside 0-4.
    """
    return require_core().shanten(bytes(tehai), len_div3)


class Hand(NamedTuple):
    """Fixed context of an agari evaluation (Mortal's ``AgariCalculator`` fields); tiles are deaka'd ids 0-33."""
    tehai: tuple         # concealed 34 counts incl. the winning tile (3n+2)
    is_menzen: bool
    chis: tuple          # lowest tile of each chi
    pons: tuple
    minkans: tuple
    ankans: tuple
    bakaze: int          # 27-30
    jikaze: int
    winning_tile: int
    is_ron: bool


class Yaku(NamedTuple):
    """Result of scoring: ``yakuman`` > 0 means a yakuman hand (han/fu unused)."""
    yakuman: int
    han: int
    fu: int


def agari(h: Hand, additional_hans: int, doras: int) -> Yaku | None:
    """Yaku of the winning hand ``h`` (Mortal's ``algo/agari.rs``, Tenhou rule) with situational
    ``additional_hans`` (riichi, menzen tsumo, haitei, ...) and ``doras`` added, or None.

    None iff the hand has no yaku and ``additional_hans`` is 0 (or it is not a winning shape). A yaku-less win
    through ``additional_hans`` takes the best fu over all divisions; fu is 0 when han >= 5. ValueError on a hand the
    core refuses (a count above 4, a chi that cannot start at its tile).
    """
    y = require_core().agari(bytes(h.tehai), bool(h.is_menzen), bytes(h.chis), bytes(h.pons), bytes(h.minkans),
                             bytes(h.ankans), h.bakaze, h.jikaze, h.winning_tile, bool(h.is_ron),
                             int(additional_hans), int(doras))
    return None if y is None else Yaku(*y)
