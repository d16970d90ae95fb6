"""Checked reads of mjai event fields for the version 4 encoder: a field that must be present, a tile name
(or a list of them) turned into a tile id 0-37, with the masked tile ``'?'`` refused where the tile must be
known. Every error is a ValueError whose message names the event type and the field.
"""

from mortal.features.tile import tile_id


def field(event: dict, kind, key: str):
    """``event[key]``; ValueError ``"<kind> event: missing field 'key'"`` when absent."""
    if key not in event:
        raise ValueError(f"{kind} event: missing field {key!r}")
    return event[key]


def field_tile(event: dict, kind, key: str, known: bool) -> int:
    """Tile id 0-37 of ``event[key]``; ``known``: the masked tile ``'?'`` is refused too. ValueError naming the
    event kind and the field (missing, or not a tile name)."""
    return check_tile(field(event, kind, key), kind, key, known)


def check_tiles(names, kind, key: str, known: bool) -> list:
    """Tile ids of the list ``names`` (the field ``key`` of a ``kind`` event); ValueError naming both when it is
    not a list or holds a bad name (``check_tile``)."""
    if not isinstance(names, list):
        raise ValueError(f"{kind} event: field {key!r}: expected a list of tile names, got {type(names).__name__}")
    return [check_tile(n, kind, key, known) for n in names]


def check_tile(name, kind, key: str, known: bool) -> int:
    """Tile id 0-37 (``mortal.features.tile.tile_id``; 37 is ``'?'``) of the tile name ``name``, the field
    ``key`` of a ``kind`` event; ValueError naming both for a name that is not an mjai tile, or for ``'?'``
    when ``known``."""
    try:
        tid = tile_id(name)
    except ValueError as e:
        raise ValueError(f"{kind} event: field {key!r}: {e}") from None
    if known and tid == 37:
        raise ValueError(f"{kind} event: field {key!r}: the masked tile '?' where the tile must be known")
    return tid


def field_tiles(event: dict, kind, key: str, known: bool) -> list:
    """Tile ids of the list ``event[key]``; ValueError as ``field`` and ``check_tiles``."""
    return check_tiles(field(event, kind, key), kind, key, known)
