"""Test oracle: shanten numbers with the four-copies limit, as Mortal's ``algo/shanten.rs``, in pure Python.

The compiled core (``mortal.features.sp._core.shanten``) is what the project runs; ``tests/test_sp_core.py`` checks
it against ``calc_all_py`` here on generated hands.

Mortal counts shanten as the least number of tiles that must be exchanged to
reach a complete target hand whose tile counts never exceed four, minus one
(tomohxx's table method). Here the per-suit part of that minimum is computed by
a small dynamic programme over the nine ranks and memoised per suit pattern, so
no precomputed 2-million-entry table is needed. Results are identical by
definition; ``tests/test_obs_v4.py`` checks known values from Mortal's tests against both.

Note: ``mjai.mlibriichi.tools.calc_shanten`` uses a different algorithm that
ignores the four-copies limit (``1111m333p222s444z`` gives 0 there, 1 here).

Hands are ``list``/``tuple`` of 34 ints (tile counts by deaka'd id).
"""

from __future__ import annotations

from functools import lru_cache

INF = 99
_YAOKYUU = (0, 8, 9, 17, 18, 26, 27, 28, 29, 30, 31, 32, 33)


@lru_cache(maxsize=None)
def _suit_costs(counts: tuple) -> tuple:
    """Cost vector of one numbered suit (9 counts).

    Entry ``m`` (0-4): least tiles to add so that the suit holds exactly ``m``
    melds and nothing else is needed; entry ``5 + m``: ``m`` melds plus a pair.
    """
    # state: (chows started one rank ago, chows started two ranks ago, melds, pair) -> cost
    states = {(0, 0, 0, 0): 0}
    for i, have in enumerate(counts):
        nxt: dict = {}
        can_chow = i <= 6
        for (b, a, m, pr), cost in states.items():
            base = a + b
            for c in range(0, (4 - m) + 1 if can_chow else 1):
                for k in (0, 1):
                    if m + c + k > 4:
                        continue
                    for q in ((0, 1) if not pr else (0,)):
                        need = base + c + 3 * k + 2 * q
                        if need > 4:
                            continue
                        add = need - have if need > have else 0
                        key = (c, b, m + c + k, pr | q)
                        v = cost + add
                        if v < nxt.get(key, INF):
                            nxt[key] = v
        states = nxt
    out = [INF] * 10
    for (b, a, m, pr), cost in states.items():
        if a or b:
            continue  # unfinished chows past rank 9
        j = 5 * pr + m
        if cost < out[j]:
            out[j] = cost
    return tuple(out)


@lru_cache(maxsize=None)
def _honor_costs(counts: tuple) -> tuple:
    """Cost vector of the honours (7 counts); each honour makes a pung or a pair only."""
    out = [0] + [INF] * 9
    for have in counts:
        pung = 3 - have if have < 3 else 0
        pair = 2 - have if have < 2 else 0
        new = list(out)
        for j in range(10):
            if out[j] >= INF:
                continue
            m, pr = j % 5, j // 5
            if m < 4:
                t = j + 1
                new[t] = min(new[t], out[j] + pung)
            if not pr:
                t = j + 5
                new[t] = min(new[t], out[j] + pair)
        out = new
    return tuple(out)


def _combine(lhs, rhs, len_div3):
    out = [INF] * 10
    for i in range(len_div3 + 1):
        li, lpi = lhs[i], lhs[5 + i]
        for j in range(len_div3 + 1 - i):
            ri, rpi = rhs[j], rhs[5 + j]
            s = i + j
            v = li + ri
            if v < out[s]:
                out[s] = v
            v = min(li + rpi, lpi + ri)
            if v < out[5 + s]:
                out[5 + s] = v
    return out


def calc_normal(tehai, len_div3: int) -> int:
    """Standard-form shanten of ``tehai`` needing ``len_div3`` melds plus a pair (-1 = complete)."""
    t = tuple(tehai)
    v = _suit_costs(t[0:9])
    v = _combine(v, _suit_costs(t[9:18]), len_div3)
    v = _combine(v, _suit_costs(t[18:27]), len_div3)
    v = _combine(v, _honor_costs(t[27:34]), len_div3)
    return v[5 + len_div3] - 1


def calc_chitoi(tehai) -> int:
    """Seven-pairs shanten (distinct pairs required)."""
    pairs = kinds = 0
    for c in tehai:
        if c:
            kinds += 1
            if c >= 2:
                pairs += 1
    return 7 - pairs + max(0, 7 - kinds) - 1


def calc_kokushi(tehai) -> int:
    """Thirteen-orphans shanten."""
    kinds = pairs = 0
    for i in _YAOKYUU:
        c = tehai[i]
        if c:
            kinds += 1
            if c >= 2:
                pairs += 1
    return 14 - kinds - (1 if pairs else 0) - 1


@lru_cache(maxsize=1 << 18)
def _calc_all_cached(t: tuple, len_div3: int) -> int:
    s = calc_normal(t, len_div3)
    if s <= 0 or len_div3 < 4:
        return s
    s = min(s, calc_chitoi(t))
    if s > 0:
        return min(s, calc_kokushi(t))
    return s


def calc_all_py(tehai, len_div3: int) -> int:
    """Least shanten over standard, seven pairs and (fully concealed) thirteen orphans.

    ``tehai``: 34 counts (0-4) of the concealed tiles; ``len_div3``: melds still to be formed from them (4 minus
    calls, 0-4). Works for 3n+1 and 3n+2 hands; -1 = complete.
    """
    return _calc_all_cached(tuple(tehai), len_div3)
