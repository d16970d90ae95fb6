"""The mjai event vocabulary: the event types Mortal's mjai ``Event`` knows, those whose ``actor`` is a seat, and the
two value checks every reader of events applies (an integer that is not a bool, a seat 0-3).

It sits in the features package, below both the encoders (``mortal.features.obs_v4`` reads actors) and the log
reader (``mortal.data.mjai_log``, which re-exports these names), so that the encoders need nothing from ``data``.
Pure constants and predicates; no I/O.
"""

from __future__ import annotations

__all__ = ["ACTOR_EVENTS", "MJAI_EVENT_TYPES", "is_int", "is_seat"]

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
