"""Points of a win from fu and han, as Mortal's ``algo/point.rs`` (Tenhou rule, no kiriage mangan)."""

from __future__ import annotations

from typing import NamedTuple


class Point(NamedTuple):
    """Payments in points. ``tsumo_oya`` is 0 when the winner is the oya."""
    ron: int
    tsumo_ko: int
    tsumo_oya: int

    def tsumo_total(self, is_oya: bool) -> int:
        """Total a tsumo win collects (without honba)."""
        return self.tsumo_ko * 3 if is_oya else self.tsumo_ko * 2 + self.tsumo_oya


def _ceil100(v: int) -> int:
    return (v + 99) // 100 * 100


def point(is_oya: bool, fu: int, han: int) -> Point:
    """Payments for ``han`` han ``fu`` fu (``fu`` may be 0 when han >= 5).

    Base points: fu * 2^(2+han) capped at 2000 (mangan), 3000 for 6-7 han,
    4000 for 8-10, 6000 for 11-12 and 8000 (counted yakuman) from 13 han.
    """
    if han >= 13:
        base = 8000
    elif han >= 11:
        base = 6000
    elif han >= 8:
        base = 4000
    elif han >= 6:
        base = 3000
    elif han >= 5:
        base = 2000
    else:
        base = min(fu * 2 ** (2 + han), 2000)
    if is_oya:
        return Point(_ceil100(base * 6), _ceil100(base * 2), 0)
    return Point(_ceil100(base * 4), _ceil100(base), _ceil100(base * 2))


def yakuman_point(is_oya: bool, count: int) -> Point:
    """Payments for ``count`` yakuman."""
    if is_oya:
        return Point(48000 * count, 16000 * count, 0)
    return Point(32000 * count, 8000 * count, 16000 * count)


def yaku_point(is_oya: bool, yaku) -> Point:
    """Payments for an ``agari.Yaku`` result."""
    if yaku.yakuman:
        return yakuman_point(is_oya, yaku.yakuman)
    return point(is_oya, yaku.fu, yaku.han)
