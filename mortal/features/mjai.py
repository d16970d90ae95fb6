"""The mjai event vocabulary and the checked reads of event fields (ValueError names event type and field)."""

from __future__ import annotations

from mortal.features.tile import tile_id

#: Event types Mortal's mjai ``Event`` knows; anything else is rejected.
MJAI_EVENT_TYPES = frozenset({
    "none", "start_game", "start_kyoku", "tsumo", "dahai", "chi", "pon", "daiminkan", "kakan", "ankan",
    "dora", "reach", "reach_accepted", "hora", "ryukyoku", "end_kyoku", "end_game",
})

#: Event types whose ``actor`` (a seat 0-3) mjai requires; every reader checks it.
ACTOR_EVENTS = frozenset({"tsumo", "dahai", "chi", "pon", "daiminkan", "kakan", "ankan", "reach",
                          "reach_accepted", "hora"})


def is_int(v) -> bool:
    """Whether ``v`` is an integer; ``bool`` is not (``True`` is an int in Python, not a number in mjai)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_seat(v) -> bool:
    """Whether ``v`` is a seat: an integer 0-3 (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 3


def field(event: dict, kind, key: str):
    """``event[key]``; ValueError ``"<kind> event: missing field 'key'"`` when absent."""
    if key not in event:
        raise ValueError(f"{kind} event: missing field {key!r}")
    return event[key]


def field_tile(event: dict, kind, key: str, known: bool) -> int:
    """Tile id 0-37 of ``event[key]`` (``known``: ``'?'`` refused); ValueError naming kind and field."""
    return check_tile(field(event, kind, key), kind, key, known)


def check_tiles(names, kind, key: str, known: bool) -> list:
    """Tile ids of the list ``names``; ValueError naming ``kind`` and ``key`` for a non-list or a bad name."""
    if not isinstance(names, list):
        raise ValueError(f"{kind} event: field {key!r}: expected a list of tile names, got {type(names).__name__}")
    return [check_tile(n, kind, key, known) for n in names]


def check_tile(name, kind, key: str, known: bool) -> int:
    """Tile id 0-37 of ``name``; ValueError naming ``kind`` and ``key`` for a bad name (or ``'?'`` if ``known``)."""
    try:
        tid = tile_id(name)
    except ValueError as e:
        raise ValueError(f"{kind} event: field {key!r}: {e}") from None
    if known and tid == 37:
        raise ValueError(f"{kind} event: field {key!r}: the masked tile '?' where the tile must be known")
    return tid
