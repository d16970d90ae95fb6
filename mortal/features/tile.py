"""Tile ids and mjai tile names, as Mortal's ``tile.rs``: 0-8 1m-9m, 9-17 1p-9p, 18-26 1s-9s, 27-33
E S W N P F C, 34-36 red 5m/5p/5s, 37 ``?`` (masked)."""

from __future__ import annotations

TILE_NAMES: tuple[str, ...] = (
    *(f"{n}m" for n in range(1, 10)),
    *(f"{n}p" for n in range(1, 10)),
    *(f"{n}s" for n in range(1, 10)),
    "E", "S", "W", "N", "P", "F", "C",
    "5mr", "5pr", "5sr",
    "?",
)
TILE_IDS: dict[str, int] = {name: i for i, name in enumerate(TILE_NAMES)}

_DEAKA = {34: 4, 35: 13, 36: 22}  # red five id -> plain five id
_AKAIZE = {v: k for k, v in _DEAKA.items()}


def tile_id(name: str) -> int:
    """mjai tile name (``'5mr'``, ``'E'``, ``'?'``) -> id 0-37; ValueError for another name."""
    try:
        return TILE_IDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"not an mjai tile name: {name!r}") from None


def tile_name(tid: int) -> str:
    """Id 0-37 -> mjai tile name. Raises ValueError outside 0-37."""
    if not 0 <= tid < len(TILE_NAMES):
        raise ValueError(f"tile id out of range 0-37: {tid}")
    return TILE_NAMES[tid]


def deaka(tid: int) -> int:
    """Red five id (34-36) -> plain five id (4/13/22); any other id unchanged."""
    return _DEAKA.get(tid, tid)


def akaize(tid: int) -> int:
    """Plain five id (4/13/22) -> red five id (34-36); any other id unchanged."""
    return _AKAIZE.get(tid, tid)


def is_aka(tid: int) -> bool:
    """True for the red fives 34-36."""
    return tid in _DEAKA


def chi_type(pai: int, consumed: tuple[int, int] | list[int]) -> int:
    """Chi shape as Mortal's ``chi_type.rs``: 0 low, 1 mid, 2 high (where the called tile sits in the run)."""
    p = deaka(pai)
    a, b = sorted(deaka(t) for t in consumed)
    if p < a:
        return 0
    if p < b:
        return 1
    return 2
