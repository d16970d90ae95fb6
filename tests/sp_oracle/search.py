"""Test oracle: the single-player search of ``sp_oracle.core_py.SPCalculator.calc`` in pure Python.

The compiled core (``mortal.features.sp._core.sp_calc``) is what the project runs; ``tests/test_sp_core.py`` checks it
against ``calc`` here on every decision of two real games, and ``tests/test_obs_v4.py`` checks both against values
computed by hand. About 1000x slower than the core: a 3-shanten hand can take seconds.

Arithmetic is float64 (Mortal uses f32), so values agree with Mortal to ~1e-6 relative.
"""

from __future__ import annotations

from sp_oracle.core_py import (_FIVE, MAX_TSUMOS_LEFT, SHANTEN_THRES, Candidate, Hand, SPCalculator,
                               cmp_discard_priority, deaka, sort_candidates)
from sp_oracle.point import point as calc_point, yaku_point
from sp_oracle.agari import agari
from sp_oracle.shanten import calc_all_py as calc_all

UNKNOWN = 37

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

def _make_candidate(tile, tenpai, win, ev, required, shanten_down) -> Candidate:
    return Candidate(
        tile,
        [min(max(p, 0.0), 1.0) for p in tenpai],
        [min(max(p, 0.0), 1.0) for p in win],
        [max(v, 0.0) for v in ev],
        required,
        shanten_down,
    )




def prev_tile(t: int) -> int:
    """Indicator of dora ``t`` (deaka'd): the tile before it in the dora order, each group cyclic."""
    t = deaka(t)
    if t < 27:
        return t // 9 * 9 + (t % 9 - 1) % 9
    if t < 31:
        return 27 + (t - 27 - 1) % 4
    return 31 + (t - 31 - 1) % 3


def calc(sup: SPCalculator, tehai, akas_in_hand, tiles_seen, akas_seen, can_discard: bool, tsumos_left: int,
         cur_shanten: int) -> list:
    """``sup.calc(...)`` (same arguments, same sorted candidates) computed here in Python."""
    if cur_shanten < 0:
        raise ValueError("can't calculate an agari hand")
    if not 1 <= tsumos_left <= MAX_TSUMOS_LEFT:
        raise ValueError(f"tsumos_left must be 1-17, got {tsumos_left}")
    run = _Run(sup, tehai, akas_in_hand, tiles_seen, akas_seen, tsumos_left)
    if cur_shanten <= SHANTEN_THRES:
        cands = run.analyze_discard(cur_shanten) if can_discard else run.analyze_draw(cur_shanten)
    else:
        cands = run.analyze_discard_simple(cur_shanten) if can_discard else run.analyze_draw_simple()
    return sort_candidates(cands, cur_shanten <= SHANTEN_THRES)


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
