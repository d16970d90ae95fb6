"""Test oracle: yaku, fu and han of a winning hand, as Mortal's ``algo/agari.rs`` (Tenhou rule), in pure Python.

The compiled core (``mortal.features.sp._core.agari``, reached through ``mortal.features.sp.calc.agari``) is what the
project runs; ``tests/test_sp_core.py`` checks it against ``agari`` here on generated hands.

Mortal looks the concealed part up in a table of hand divisions (pair + pungs +
chows, or seven pairs) and scores every division, keeping the best. Here the
divisions are enumerated directly and memoised; the per-division scoring follows
Mortal's rules, including its particular choices:

* a double-wind pair is worth 4 fu; dora count only when the hand has a yaku;
* ``additional_hans`` (riichi, menzen tsumo, haitei, ...) can make a yaku-less
  hand win; its fu is then the best fu over all divisions (pinfu not assumed);
* iipeikou / ittsuu / ryanpeikou / chuuren are flags of the concealed part
  (iipeikou, ryanpeikou and chuuren only for a 14-tile concealed hand), iipeikou
  with an ankan is checked separately, and an ittsuu completed with a chi/pon
  elsewhere counts 1 han;
* several yakuman stack; there is no double yakuman for any single one.

Tiles are deaka'd ids 0-33; ``tehai`` is a sequence of 34 counts that already
contains the winning tile (3n+2 tiles).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from sp_oracle.core_py import Hand, Yaku
from sp_oracle.shanten import calc_kokushi

_P, _F, _C = 31, 32, 33
_YAOKYUU = frozenset((0, 8, 9, 17, 18, 26, 27, 28, 29, 30, 31, 32, 33))


class Div(NamedTuple):
    """One division of the concealed tiles."""
    pair: int
    kotsu: tuple        # pung tiles
    shuntsu: tuple      # first tile of each chow
    chitoi: bool
    chuuren: bool
    ittsuu: bool
    ryanpeikou: bool
    ipeikou: bool
    chitoi_pairs: tuple  # the seven pair tiles (chitoi only)


def _melds(counts: list, start: int, kotsu: list, shuntsu: list, out: list) -> None:
    """Append every pung/chow split of ``counts`` (no pair) to ``out``."""
    i = start
    while i < 34 and counts[i] == 0:
        i += 1
    if i == 34:
        out.append((tuple(kotsu), tuple(shuntsu)))
        return
    if counts[i] >= 3:
        counts[i] -= 3
        kotsu.append(i)
        _melds(counts, i, kotsu, shuntsu, out)
        kotsu.pop()
        counts[i] += 3
    if i < 27 and i % 9 <= 6 and counts[i + 1] and counts[i + 2]:
        counts[i] -= 1
        counts[i + 1] -= 1
        counts[i + 2] -= 1
        shuntsu.append(i)
        _melds(counts, i, kotsu, shuntsu, out)
        shuntsu.pop()
        counts[i] += 1
        counts[i + 1] += 1
        counts[i + 2] += 1


def _listed(kotsu: tuple, shuntsu: tuple) -> bool:
    """Whether Mortal's division table lists this split.

    The table omits a pung directly below three identical chows (666 789x3);
    the same tiles are also split as 678x3 999 and as four pungs.
    """
    for k in kotsu:
        if k < 27 and k % 9 < 8 and shuntsu.count(k + 1) >= 3:
            return False
    return True


def _is_chuuren(counts) -> bool:
    for suit in range(3):
        part = counts[suit * 9:suit * 9 + 9]
        if sum(part) != 14:
            continue
        if part[0] >= 3 and part[8] >= 3 and all(c >= 1 for c in part[1:8]):
            return True
    return False


@lru_cache(maxsize=1 << 16)
def divisions(tehai: tuple) -> tuple:
    """All divisions of the concealed 3n+2 tiles ``tehai`` (34 counts); empty if not a winning shape."""
    counts = list(tehai)
    total = sum(counts)
    out = []
    full = total == 14
    chuuren = full and _is_chuuren(counts)
    for p in range(34):
        if counts[p] < 2:
            continue
        counts[p] -= 2
        found: list = []
        _melds(counts, 0, [], [], found)
        counts[p] += 2
        # a pung and a chow from the same rank can be taken in either order
        for kotsu, shuntsu in dict.fromkeys((tuple(sorted(k)), tuple(sorted(c))) for k, c in found):
            if not _listed(kotsu, shuntsu):
                continue
            ittsuu = any(s % 9 == 0 and s + 3 in shuntsu and s + 6 in shuntsu for s in shuntsu)
            ryan = ipei = False
            if full and len(shuntsu) >= 2:
                dup = 0
                seen = {}
                for s in shuntsu:
                    seen[s] = seen.get(s, 0) + 1
                for n in seen.values():
                    dup += n // 2
                ryan = dup >= 2
                ipei = dup == 1
            out.append(Div(p, kotsu, shuntsu, False, chuuren, ittsuu, ryan, ipei, ()))
    # seven pairs, unless the same tiles make ryanpeikou (which scores higher)
    if full and not any(d.ryanpeikou for d in out):
        pairs = tuple(i for i in range(34) if counts[i] == 2)
        if len(pairs) == 7:
            out.append(Div(pairs[0], (), (), True, False, False, False, False, pairs))
    return tuple(out)


def _winning_tile_makes_minkou(h: Hand, d: Div) -> bool:
    w = h.winning_tile
    if not h.is_ron or w not in d.kotsu:
        return False
    if w >= 27:
        return True
    kind, num = divmod(w, 9)
    low = kind * 9 + max(num - 2, 0)
    high = kind * 9 + min(num, 6)
    return not any(low <= s <= high for s in d.shuntsu)


def _calc_fu(h: Hand, d: Div, minkou: bool, has_pinfu: bool) -> int:
    if d.chitoi:
        return 25
    fu = 20
    for t in d.kotsu:
        is_min = minkou and t == h.winning_tile
        yao = t in _YAOKYUU
        fu += (8 if yao else 4) if not is_min else (4 if yao else 2)
    for t in h.pons:
        fu += 4 if t in _YAOKYUU else 2
    for t in h.ankans:
        fu += 32 if t in _YAOKYUU else 16
    for t in h.minkans:
        fu += 16 if t in _YAOKYUU else 8
    if d.pair in (_P, _F, _C):
        fu += 2
    else:
        if d.pair == h.bakaze:
            fu += 2
        if d.pair == h.jikaze:
            fu += 2
    if fu == 20:
        if not h.is_menzen:
            return 30
        if has_pinfu:
            return 30 if h.is_ron else 20
        return 40 if h.is_ron else 30
    if not h.is_ron:
        fu += 2
    elif h.is_menzen:
        fu += 10
    if not minkou:
        w = h.winning_tile
        if d.pair == w:
            fu += 2
        elif any(s + 1 == w or (s % 9 == 0 and s + 2 == w) or (s % 9 == 6 and s == w)
                 for s in d.shuntsu):
            fu += 2
    return ((fu - 1) // 10 + 1) * 10


class _Facts(NamedTuple):
    """What several yaku checks of one division read."""
    minkou: bool        # the winning tile (ron) completes a pung: an open one for fu and sanankou
    has_pinfu: bool
    all_kotsu: tuple    # pungs of the division and the calls (pon, minkan, ankan)
    all_shuntsu: tuple  # chows of the division and the calls (chi)
    tanyao: bool
    toitoi: bool


def _facts(h: Hand, d: Div) -> _Facts:
    w = h.winning_tile
    pair = d.pair
    has_pinfu = (len(d.shuntsu) == 4 and pair not in (_P, _F, _C) and pair != h.bakaze
                 and pair != h.jikaze
                 and any((s % 9 + 1 <= 6 and s == w) or (s % 9 + 1 >= 2 and s + 2 == w)
                         for s in d.shuntsu))
    all_kotsu = d.kotsu + h.pons + h.minkans + h.ankans
    all_shuntsu = d.shuntsu + h.chis
    if d.chitoi:
        tanyao = all(t < 27 and 0 < t % 9 < 8 for t in d.chitoi_pairs)
    else:
        tanyao = (all(0 < s % 9 < 6 for s in all_shuntsu)
                  and all(k < 27 and 0 < k % 9 < 8 for k in all_kotsu + (pair,)))
    toitoi = not d.chitoi and not d.shuntsu and not h.chis
    return _Facts(_winning_tile_makes_minkou(h, d), has_pinfu, all_kotsu, all_shuntsu, tanyao, toitoi)


# Each check yields ``(han, yakuman)`` per yaku it finds, in Mortal's order (``any_only`` stops at the first).

def _shape_yaku(h: Hand, d: Div, f: _Facts):
    """Pinfu, chiitoitsu, ryanpeikou, chuuren poutou."""
    if f.has_pinfu:
        yield 1, 0
    if d.chitoi:
        yield 2, 0
    if d.ryanpeikou:
        yield 3, 0
    if d.chuuren:
        yield 0, 1


def _tanyao_toitoi(h: Hand, d: Div, f: _Facts):
    if f.tanyao:
        yield 1, 0
    if f.toitoi:
        yield 2, 0


def _one_suit(h: Hand, d: Div, f: _Facts):
    """Honitsu / chinitsu / tsuuiisou: suit of every meld (and pair)."""
    kinds = set()
    has_jihai = False
    for t in (d.chitoi_pairs if d.chitoi else f.all_kotsu + f.all_shuntsu + (d.pair,)):
        if t >= 27:
            has_jihai = True
        else:
            kinds.add(t // 9)
    if not kinds:
        yield 0, 1
    elif len(kinds) == 1:
        yield (2 if has_jihai else 5) + (1 if h.is_menzen else 0), 0


def _sequences(h: Hand, d: Div, f: _Facts):
    """Iipeikou, ittsuu, sanshoku doujun / doukou (no chiitoitsu)."""
    if d.chitoi:
        return
    if d.ipeikou:
        yield 1, 0
    elif h.ankans and h.is_menzen and len(d.shuntsu) >= 2:
        if len(set(d.shuntsu)) < len(d.shuntsu):
            yield 1, 0

    if h.is_menzen and d.ittsuu:
        yield 2, 0
    elif not h.chis and d.ittsuu:
        yield 1, 0
    elif len(d.shuntsu) + len(h.chis) >= 3:
        marks = [0, 0, 0]
        for s in f.all_shuntsu:
            kind, num = divmod(s, 9)
            if num == 0:
                marks[kind] |= 1
            elif num == 3:
                marks[kind] |= 2
            elif num == 6:
                marks[kind] |= 4
        if 7 in marks:
            yield 1, 0

    s_counter = [0] * 9
    for s in f.all_shuntsu:
        s_counter[s % 9] |= 1 << (s // 9)
    if 7 in s_counter:
        yield (2 if h.is_menzen else 1), 0
    else:
        k_counter = [0] * 9
        for k in f.all_kotsu:
            if k < 27:
                k_counter[k % 9] |= 1 << (k // 9)
        if 7 in k_counter:
            yield 2, 0


def _triplets(h: Hand, d: Div, f: _Facts):
    """Sanankou / suuankou, sankantsu / suukantsu, ryuuiisou (no chiitoitsu)."""
    if d.chitoi:
        return
    ankous = len(h.ankans) + len(d.kotsu) - (1 if f.minkou else 0)
    kans = len(h.ankans) + len(h.minkans)
    for count in (ankous, kans):  # 4: suuankou / suukantsu (yakuman); 3: sanankou / sankantsu (2 han)
        if count == 4:
            yield 0, 1
        elif count == 3:
            yield 2, 0

    green = (19, 20, 21, 23, 25, _F)
    if all(k in green for k in f.all_kotsu + (d.pair,)) and all(s == 19 for s in f.all_shuntsu):
        yield 0, 1


def _honors(h: Hand, d: Div, f: _Facts):
    """Yakuhai, shousangen / daisangen, shousuushii / daisuushii (no chiitoitsu, no tanyao)."""
    if d.chitoi or f.tanyao:
        return
    jihai = [False] * 7
    for k in f.all_kotsu:
        if k >= 27:
            jihai[k - 27] = True
    if jihai[h.bakaze - 27]:
        yield 1, 0
    if jihai[h.jikaze - 27]:
        yield 1, 0
    sangen = sum(jihai[4:7])
    if sangen:
        yield sangen, 0
        if sangen == 3:
            yield 0, 1
        elif sangen == 2 and d.pair in (_P, _F, _C):
            yield 2, 0
    winds = sum(jihai[0:4])
    if winds == 4 or (winds == 3 and 27 <= d.pair <= 30):
        yield 0, 1


def _terminals(h: Hand, d: Div, f: _Facts):
    """Honroutou / chinroutou, chanta / junchan (no tanyao)."""
    if f.tanyao:
        return
    has_jihai = False
    all_yao = True
    for k in (d.chitoi_pairs if d.chitoi else f.all_kotsu + (d.pair,)):
        if k >= 27:
            has_jihai = True
        elif k % 9 not in (0, 8):
            all_yao = False
            break
    if all_yao:
        if d.chitoi or f.toitoi:
            yield (2, 0) if has_jihai else (0, 1)
        elif all(s % 9 in (0, 6) for s in f.all_shuntsu):
            yield (1 if has_jihai else 2) + (1 if h.is_menzen else 0), 0


_YAKU_CHECKS = (_shape_yaku, _tanyao_toitoi, _one_suit, _sequences, _triplets, _honors, _terminals)


def _score_div(h: Hand, d: Div, any_only: bool):
    """Yaku of one division -> ``Yaku`` or None (no yaku). ``any_only``: stop at the first yaku."""
    f = _facts(h, d)
    han = 0
    yakuman = 0
    for check in _YAKU_CHECKS:
        for more_han, more_yakuman in check(h, d, f):
            han += more_han
            yakuman += more_yakuman
            if any_only:
                return _yaku_of(h, d, f, han, yakuman, any_only)
    return _yaku_of(h, d, f, han, yakuman, any_only)


def _yaku_of(h: Hand, d: Div, f: _Facts, han: int, yakuman: int, any_only: bool):
    """The ``Yaku`` of the han and yakuman counted (fu only when it matters), None without either."""
    if yakuman:
        return Yaku(yakuman, 0, 0)
    if han:
        fu = 0 if any_only or han >= 5 else _calc_fu(h, d, f.minkou, f.has_pinfu)
        return Yaku(0, han, fu)
    return None


def _kokushi(h: Hand) -> bool:
    return h.is_menzen and calc_kokushi(h.tehai) == -1


def _better(a: Yaku, b) -> bool:
    if b is None:
        return True
    if a.yakuman or b.yakuman:
        return a.yakuman > b.yakuman
    return (a.han, a.fu) > (b.han, b.fu)


def search_yakus(h: Hand):
    """Best ``Yaku`` over all divisions ignoring situational han, or None (no yaku / not a win)."""
    if _kokushi(h):
        return Yaku(1, 0, 0)
    best = None
    for d in divisions(h.tehai):
        y = _score_div(h, d, False)
        if y is not None and _better(y, best):
            best = y
    return best


def agari(h: Hand, additional_hans: int, doras: int):
    """Final ``Yaku`` with situational ``additional_hans`` and ``doras`` added, or None.

    None iff the hand has no yaku and ``additional_hans`` is 0 (or it is not a
    winning shape). A yaku-less win through ``additional_hans`` takes the best
    fu over all divisions; fu is 0 when han >= 5.
    """
    y = search_yakus(h)
    if y is not None:
        if y.yakuman:
            return y
        return Yaku(0, y.han + additional_hans + doras, y.fu)
    if additional_hans == 0:
        return None
    if additional_hans + doras >= 5:
        return Yaku(0, additional_hans + doras, 0)
    divs = divisions(h.tehai)
    if not divs:
        return None
    fu = max(_calc_fu(h, d, _winning_tile_makes_minkou(h, d), False) for d in divs)
    return Yaku(0, additional_hans + doras, fu)
