"""Single-player (SP) expected-value calculator, as Mortal's ``algo/sp`` with the settings v4 uses.

Mortal ports nekobean's mahjong-cpp single-player calculator: for a hand at
``shanten <= 3`` it searches every draw/discard sequence over the remaining
``tsumos_left`` own draws, assuming nobody else wins and discards never return
to the wall, and returns per candidate (discard at 3n+2, or the single "draw"
candidate at 3n+1) the probability of being tenpai / having won and the
expected tsumo value by each turn (index 0 = the whole remaining game). Above 3
shanten only the required tiles are listed ("simple" path).

Settings fixed by Mortal's ``single_player_tables`` (``agent_helper.rs``): no
tegawari, no shanten-down search, rank by EV, results sorted best first.
Arithmetic is float64 here (Mortal uses f32), so values agree to ~1e-6 relative.

Tiles: ids 0-33, red fives 34-36 (``mortal.features.tile``), 37 = unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mortal.features.sp.agari import Hand, agari
from mortal.features.sp.point import point as calc_point, yaku_point
from mortal.features.sp.shanten import calc_all

try:  # the compiled twin of this module (mortal/features/sp/csrc), built by scripts/setup.sh
    from mortal.features.sp import _core
except ImportError:  # pragma: no cover - exercised only on an unbuilt checkout
    _core = None

HAVE_CORE = _core is not None

SHANTEN_THRES = 3
MAX_TSUMOS_LEFT = 17
UNKNOWN = 37
_AKA = (34, 35, 36)
_FIVE = (4, 13, 22)

# Probability that 0..12 uradora hit when there are 2..5 dora indicators
# (row k-1 for k indicators; row 0 unused here), a statistical table that
# nekobean's calculator and Mortal ship (data/uradora_prob_table.txt).
URADORA_PROB_TABLE = (
    (0.639485, 0.327801, 0.0327134, 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.),
    (0.406736, 0.42281, 0.147966, 0.021674, 0.0008142, 0., 0., 0., 0., 0., 0., 0., 0.),
    (0.257516, 0.406819, 0.246851, 0.0757724, 0.0122266, 0.0008004, 1.43e-5, 0., 0., 0., 0., 0., 0.),
    (0.162199, 0.346513, 0.301539, 0.142396, 0.0401276, 0.0066491, 0.0005575, 1.85e-5, 0., 0., 0., 0., 0.),
    (0.101768, 0.275319, 0.313742, 0.20189, 0.081774, 0.0215394, 0.0035918, 0.0003607, 1.52e-5, 3e-7, 0., 0., 0.),
)

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


def prev_tile(t: int) -> int:
    """Indicator of dora ``t`` (deaka'd)."""
    return _shift_tile(t, -1)


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


def _make_candidate(tile, tenpai, win, ev, required, shanten_down) -> Candidate:
    return Candidate(
        tile,
        [min(max(p, 0.0), 1.0) for p in tenpai],
        [min(max(p, 0.0), 1.0) for p in win],
        [max(v, 0.0) for v in ev],
        required,
        shanten_down,
    )


def _cmp(l: Candidate, r: Candidate, by: int) -> int:
    # by: 0 EV, 1 win prob, 2 tenpai prob, 3 not-shanten-down, 4 required count, 5 priority
    if l.tile == r.tile:
        return 0
    if by == 0:
        a, b = l.exp_values[0], r.exp_values[0]
        if a != b:
            return 1 if a > b else -1
        by = 1
    if by == 1:
        a, b = l.win_probs[0], r.win_probs[0]
        if a != b:
            return 1 if a > b else -1
        by = 2
    if by == 2:
        a, b = l.tenpai_probs[0], r.tenpai_probs[0]
        if a != b:
            return 1 if a > b else -1
        by = 3
    if by == 3:
        if l.shanten_down != r.shanten_down:
            return -1 if l.shanten_down else 1
        by = 4
    if by == 4:
        a, b = l.num_required_tiles, r.num_required_tiles
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
             tsumos_left: int, cur_shanten: int, backend: str | None = None) -> list:
        """Sorted candidates, best first.

        ``tehai``: 34 counts (3n+2 if ``can_discard`` else 3n+1); ``akas_in_hand``,
        ``akas_seen``: 3 bools (m, p, s); ``tiles_seen``: 34 counts visible to the
        player (own hand included). ``backend``: ``'core'`` (compiled, the default
        when built), ``'python'`` (this module; the reference, ~1000x slower).
        Raises ValueError unless ``cur_shanten >= 0`` and ``1 <= tsumos_left <= 17``,
        and for ``backend='core'`` when the extension is not built.
        """
        if cur_shanten < 0:
            raise ValueError("can't calculate an agari hand")
        if not 1 <= tsumos_left <= MAX_TSUMOS_LEFT:
            raise ValueError(f"tsumos_left must be 1-17, got {tsumos_left}")
        if backend is None:
            backend = "core" if HAVE_CORE else "python"
        if backend == "core":
            cands = self._calc_core(tehai, akas_in_hand, tiles_seen, akas_seen, can_discard,
                                    tsumos_left, cur_shanten)
        elif backend == "python":
            run = _Run(self, tehai, akas_in_hand, tiles_seen, akas_seen, tsumos_left)
            if cur_shanten <= SHANTEN_THRES:
                cands = run.analyze_discard(cur_shanten) if can_discard else run.analyze_draw(cur_shanten)
            else:
                cands = run.analyze_discard_simple(cur_shanten) if can_discard else run.analyze_draw_simple()
        else:
            raise ValueError(f"backend must be 'core' or 'python', got {backend!r}")
        return sort_candidates(cands, cur_shanten <= SHANTEN_THRES)

    def core_args(self, tehai, akas_in_hand, tiles_seen, akas_seen, can_discard: bool, tsumos_left: int,
                  cur_shanten: int) -> tuple:
        """The argument tuple of ``_core.sp_calc`` for ``calc``'s arguments (see ``calc_batch``)."""
        return (self.len_div3, bytes(self.chis), bytes(self.pons), bytes(self.minkans), bytes(self.ankans),
                self.bakaze, self.jikaze, self.is_menzen, self.num_doras_in_fuuro,
                bytes(self.dora_indicators), self.calc_double_riichi, self.calc_haitei, self.prefer_riichi,
                bytes(tehai), _bits(akas_in_hand), bytes(tiles_seen), _bits(akas_seen), bool(can_discard),
                tsumos_left, cur_shanten)

    def _calc_core(self, *args) -> list:
        return _candidates(_require_core().sp_calc(*self.core_args(*args)))


def _require_core():
    if _core is None:
        raise ValueError("the compiled SP core (mortal.features.sp._core) is not built; run bash scripts/setup.sh")
    return _core


def _candidates(raw) -> list:
    return [Candidate(tile, list(tp), list(wp), list(ev), list(req), sd) for tile, tp, wp, ev, req, sd in raw]


def calc_batch(jobs, threads: int = 1) -> list:
    """``SPCalculator.calc`` of many hands at once on the compiled core, on up to ``threads`` threads.

    ``jobs``: sequence of ``(calculator, (tehai, akas_in_hand, tiles_seen, akas_seen,
    can_discard, tsumos_left, cur_shanten))``. Returns one sorted candidate list
    per job, in order. Every job is checked before any search starts (ValueError
    names the bad field); raises ValueError when the core is not built.
    """
    raw = _require_core().sp_calc_batch([calc.core_args(*args) for calc, args in jobs], int(threads))
    out = []
    for (_, args), r in zip(jobs, raw):
        out.append(sort_candidates(_candidates(r), args[6] <= SHANTEN_THRES))
    return out


def _bits(flags) -> int:
    """3 bools (m, p, s) as a bit mask."""
    return sum(1 << i for i, f in enumerate(flags) if f)


class _Run:
    """Mutable search state of one ``SPCalculator.calc`` call."""

    def __init__(self, sup: SPCalculator, tehai, akas_in_hand, tiles_seen, akas_seen, max_tsumo):
        self.sup = sup
        self.tehai = list(tehai)
        self.akas_hand = list(akas_in_hand)
        self.wall = [4 - c for c in tiles_seen]
        self.akas_wall = [not b for b in akas_seen]
        self.T = max_tsumo
        n_left = sum(self.wall)
        self.n_left = n_left
        T = max_tsumo
        self.tsumo_prob = [[(i + 1) / (n_left - j) for j in range(T)] for i in range(4)]
        # not_tsumo[i][j]: no required tile (i of them left) drawn in the first j draws
        self.not_tsumo = []
        for i in range(n_left + 1):
            row = [0.0] * T
            row[0] = 1.0
            for j in range(min(T - 1, n_left - i)):
                row[j + 1] = row[j] * (n_left - i - j) / (n_left - j)
            self.not_tsumo.append(row)
        self.draw_cache = [dict() for _ in range(SHANTEN_THRES + 1)]
        self.discard_cache = [dict() for _ in range(SHANTEN_THRES + 1)]

    # -- hand and wall moves -------------------------------------------------
    def _key(self):
        return (tuple(self.tehai), tuple(self.wall), tuple(self.akas_hand), tuple(self.akas_wall))

    def discard(self, t):
        self.tehai[deaka(t)] -= 1
        if t >= 34:
            self.akas_hand[t - 34] = False

    def undo_discard(self, t):
        self.tehai[deaka(t)] += 1
        if t >= 34:
            self.akas_hand[t - 34] = True

    def deal(self, t):
        self.wall[deaka(t)] -= 1
        if t >= 34:
            self.akas_wall[t - 34] = False
        self.undo_discard(t)

    def undo_deal(self, t):
        self.discard(t)
        self.wall[deaka(t)] += 1
        if t >= 34:
            self.akas_wall[t - 34] = True

    # -- tile lists ----------------------------------------------------------
    def discard_tiles(self, shanten):
        out = []
        tehai = self.tehai
        ld = self.sup.len_div3
        for tid in range(34):
            n = tehai[tid]
            if not n:
                continue
            tehai[tid] = n - 1
            diff = calc_all(tehai, ld) - shanten
            tehai[tid] = n
            tile = tid
            if n == 1 and tid in _FIVE and self.akas_hand[_FIVE.index(tid)]:
                tile = 34 + _FIVE.index(tid)
            out.append((tile, diff))
        return out

    def draw_tiles(self, shanten):
        out = []
        tehai = self.tehai
        ld = self.sup.len_div3
        for tid in range(34):
            count = self.wall[tid]
            if not count:
                continue
            tehai[tid] += 1
            diff = calc_all(tehai, ld) - shanten
            tehai[tid] -= 1
            if tid in _FIVE and self.akas_wall[_FIVE.index(tid)]:
                if count >= 2:
                    out.append((tid, count - 1, diff))
                out.append((34 + _FIVE.index(tid), 1, diff))
            else:
                out.append((tid, count, diff))
        return out

    def required_tiles(self):
        tehai = self.tehai
        ld = self.sup.len_div3
        shanten = calc_all(tehai, ld)
        out = []
        for tid in range(34):
            count = self.wall[tid]
            if not count:
                continue
            tehai[tid] += 1
            after = calc_all(tehai, ld)
            tehai[tid] -= 1
            if after < shanten:
                out.append((tid, count))
        return out

    # -- analysis entry points ----------------------------------------------
    def analyze_discard(self, shanten):
        cands = []
        for tile, diff in self.discard_tiles(shanten):
            if diff != 0:
                continue  # no shanten-down search (Mortal's v4 setting)
            self.discard(tile)
            required = self.required_tiles()
            tenpai, win, ev = self.draw(shanten)
            self.undo_discard(tile)
            if shanten == 0:
                tenpai = [1.0] * self.T
            cands.append(_make_candidate(tile, tenpai, win, ev, required, False))
        return cands

    def analyze_draw(self, shanten):
        required = self.required_tiles()
        tenpai, win, ev = self.draw(shanten)
        if shanten == 0:
            tenpai = [1.0] * self.T
        return [_make_candidate(UNKNOWN, tenpai, win, ev, required, False)]

    def analyze_discard_simple(self, shanten):
        cands = []
        for tile, diff in self.discard_tiles(shanten):
            self.discard(tile)
            required = self.required_tiles()
            self.undo_discard(tile)
            cands.append(Candidate(tile, required_tiles=required, shanten_down=diff == 1))
        return cands

    def analyze_draw_simple(self):
        return [Candidate(UNKNOWN, required_tiles=self.required_tiles())]

    # -- recursion -----------------------------------------------------------
    def _memo(self, cache, compute, shanten):
        """``compute(shanten)`` of the current state, once per state (memoised in ``cache``)."""
        key = self._key()
        got = cache.get(key)
        if got is None:
            got = cache[key] = compute(shanten)
        return got

    def draw(self, shanten):
        return self._memo(self.draw_cache[shanten], self._draw_slow, shanten)

    def _draw_slow(self, shanten):
        T = self.T
        tenpai = [0.0] * T
        win = [0.0] * T
        ev = [0.0] * T
        draws = self.draw_tiles(shanten)
        sum_required = sum(c for _, c, d in draws if d == -1)
        not_tsumo = self.not_tsumo[sum_required]
        sup = self.sup
        assume_riichi = sup.is_menzen and sup.prefer_riichi
        for tile, count, diff in draws:
            if diff != -1:
                continue
            self.deal(tile)
            scores = nxt = None
            if shanten > 0:
                nxt = self.discard_step(shanten - 1)
            else:
                scores = _tsumo_scores(self.sup, self.tehai, self.wall, self.akas_hand, tile)
                if scores is None:
                    self.undo_deal(tile)
                    continue
            self.undo_deal(tile)
            tp = self.tsumo_prob[count - 1]
            for i in range(T):
                m = not_tsumo[i]
                if m == 0.0:
                    break
                for j in range(i, T):
                    n = not_tsumo[j]
                    if n == 0.0:
                        break
                    prob = tp[j] * n / m
                    if scores is not None:
                        han_plus = ((assume_riichi and sup.calc_double_riichi and i == 0)
                                    + (assume_riichi and j == i)
                                    + (sup.calc_haitei and j == T - 1))
                        win[i] += prob
                        ev[i] += prob * scores[han_plus]
                    else:
                        if shanten == 1:
                            tenpai[i] += prob
                        if j < T - 1:
                            if shanten > 1:
                                tenpai[i] += prob * nxt[0][j + 1]
                            win[i] += prob * nxt[1][j + 1]
                            ev[i] += prob * nxt[2][j + 1]
        return (tenpai, win, ev)

    def discard_step(self, shanten):
        return self._memo(self.discard_cache[shanten], self._discard_slow, shanten)

    def _discard_slow(self, shanten):
        T = self.T
        neg = -3.4028234663852886e38  # f32::MIN
        best_t = [neg] * T
        best_w = [neg] * T
        best_e = [neg] * T
        best_tile = [UNKNOWN] * T
        best_val = [-(2 ** 31)] * T
        for tile, diff in self.discard_tiles(shanten):
            if diff != 0:
                continue
            self.discard(tile)
            t, w, e = self.draw(shanten)
            self.undo_discard(tile)
            for i in range(T):
                # EVs equal to the point count as ties (Mortal truncates to i32)
                v = int(e[i])
                if v > best_val[i] or (v == best_val[i] and cmp_discard_priority(tile, best_tile[i]) > 0):
                    best_t[i] = t[i]
                    best_w[i] = w[i]
                    best_e[i] = e[i]
                    best_val[i] = v
                    best_tile[i] = tile
        return (best_t, best_w, best_e)


def _tsumo_scores(sup, tehai, wall, akas_hand, win_tile):
    """Tsumo values of ``tehai`` (34 counts, the winning tile included) with +0..+3 extra han (double riichi,
    ippatsu, haitei), ura expected over ``wall`` (34 counts); None = no yaku. ``sup``: the ``SPCalculator``."""
    hand = Hand(tuple(tehai), sup.is_menzen, sup.chis, sup.pons, sup.minkans, sup.ankans,
                sup.bakaze, sup.jikaze, deaka(win_tile), False)
    is_oya = sup.jikaze == 27
    if sup.is_menzen:
        additional = 2 if sup.prefer_riichi else 1
    else:
        additional = 0
    num_doras = (sum(tehai[d] for d in sup.doras) + sum(akas_hand)
                 + sup.num_doras_in_fuuro)
    y = agari(hand, additional, num_doras)
    if y is None:
        return None
    if y.yakuman:
        v = float(yaku_point(is_oya, y).tsumo_total(is_oya))
        return [v, v, v, v]
    fu, han = y.fu, y.han
    assume_riichi = sup.is_menzen and sup.prefer_riichi
    n_ind = len(sup.dora_indicators)
    if not (assume_riichi and n_ind >= 1):
        return [float(calc_point(is_oya, fu, han + i).tsumo_total(is_oya)) for i in range(4)]
    ura = _ura_probs(tehai, wall) if n_ind == 1 else URADORA_PROB_TABLE[n_ind - 1]
    scores = [0.0] * 4
    for i in range(4):
        s = 0.0
        for j, p in enumerate(ura):
            if p == 0.0:
                continue
            s += calc_point(is_oya, fu, han + i + j).tsumo_total(is_oya) * p
        scores[i] = s
    return scores


def _ura_probs(tehai, wall) -> list:
    """Probabilities of 0..4 uradora under one indicator drawn from ``wall``: a tile of ``tehai`` held c times is
    c uradora when the indicator is its previous tile."""
    n_indicators = [0] * 5
    sum_ind = 0
    for tid in range(34):
        c = tehai[tid]
        if not c:
            continue
        k = wall[prev_tile(tid)]
        n_indicators[c] += k
        sum_ind += k
    n_left = sum(wall)
    return [(n_left - sum_ind) / n_left] + [n_indicators[i] / n_left for i in range(1, 5)]
