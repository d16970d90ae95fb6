"""Per-kyoku facts the v4 single-player block needs and ``PlayerState`` does not expose, from mjai events."""

from __future__ import annotations

import functools
import json

from mortal.features.mjai import ACTOR_EVENTS, check_tiles, field, field_tile, is_seat

_ACTOR_TYPES = ACTOR_EVENTS - {"hora"}  # the events whose actor the encoder reads
MAX_DORA_INDICATORS = 5  # the first plus one per kan, at most 4 kans (Tenhou rule)


def _check_event(event) -> dict:
    """``event`` checked as ``mjai_log`` checks every event (the tiles: ``update_parsed``); raises as ``update``."""
    if not isinstance(event, dict):
        raise TypeError(f"an mjai event must be a JSON object, got {type(event).__name__}")
    kind = event.get("type")
    if kind in _ACTOR_TYPES:
        actor = field(event, kind, "actor")
        if not is_seat(actor):
            raise ValueError(f"{kind} event: field 'actor': expected a seat 0-3, got {actor!r}")
    elif kind == "start_kyoku":
        hands = field(event, kind, "tehais")
        if not isinstance(hands, list) or len(hands) != 4:
            raise ValueError(f"{kind} event: field 'tehais': expected 4 lists of tile names")
    return event


@functools.lru_cache(maxsize=4096)
def _parsed(line) -> dict:
    """``_check_event`` of a JSON line; cached (read, never changed): the four seats get the same lines, most recur."""
    return _check_event(json.loads(line))


class KyokuFacts:
    """The facts of the current kyoku as seat ``player_id`` saw them, and ``events_seen`` (the SP cache key)."""

    def _reset(self):
        self.events_seen = getattr(self, "events_seen", 0)
        self._sp_cache = None             # (events_seen, SP rows) of the last encode
        self.dora_indicators: list = []   # ids 0-36 as revealed
        self.akas_seen = [False, False, False]
        self.tiles_left = 70
        self.own_fuuro_tiles: list = []   # ids 0-36 of own chi/pon/kan tiles (ankan incl.)
        self.can_w_riichi = True
        self.is_w_riichi = False
        self.at_ippatsu = False
        self.at_rinshan = False
        self.pending_kakan = False        # last event was another player's kakan

    def _witness(self, *tids: int):
        for tid in tids:
            if 34 <= tid <= 36:
                self.akas_seen[tid - 34] = True

    def update(self, event) -> None:
        """Track one mjai event, checked before any change: TypeError (no object), ValueError (names the field)."""
        self.update_parsed(_parsed(event) if isinstance(event, (str, bytes)) else _check_event(event))

    def update_parsed(self, event: dict) -> None:
        """``update`` for an event ``mjai_log.parse_log`` accepted: only the tile fields are checked."""
        kind = event.get("type")  # update passes on events of any type (those unknown are ignored)
        mine = kind in _ACTOR_TYPES and event["actor"] == self.player_id
        pai, tiles = self._read_tiles(event, kind, mine)  # first: nothing below may fail half way
        self.events_seen += 1
        if self.pending_kakan:  # Mortal drops ippatsu at the event after a kakan (chankan chance over)
            self.pending_kakan = self.at_ippatsu = False
        self._apply(kind, mine, pai, tiles)

    def _read_tiles(self, event: dict, kind, mine: bool) -> tuple:
        """``(pai, tiles)`` of ``event``, checked (None where not read); ValueError as ``update``."""
        me = self.player_id
        pai = tiles = None
        if kind == "start_kyoku":
            pai = field_tile(event, kind, "dora_marker", known=True)
            tiles = check_tiles(event["tehais"][me], kind, f"tehais[{me}]", known=False)
        elif kind == "dora":
            pai = field_tile(event, kind, "dora_marker", known=True)
            if len(self.dora_indicators) >= MAX_DORA_INDICATORS:
                raise ValueError(f"dora event: more than {MAX_DORA_INDICATORS} dora indicators in one kyoku")
        elif (kind == "tsumo" and mine) or (kind == "dahai" and not mine) or kind == "kakan":
            pai = field_tile(event, kind, "pai", known=mine)
        elif kind in ("chi", "pon", "daiminkan", "ankan"):
            tiles = check_tiles(field(event, kind, "consumed"), kind, "consumed", known=mine)
            if mine and kind != "ankan":
                pai = field_tile(event, kind, "pai", known=True)
        return pai, tiles

    def _apply(self, kind, mine: bool, pai, tiles) -> None:
        """The facts after one event of type ``kind`` (``mine``: the seat's own), its tiles read by ``_read_tiles``."""
        if kind == "start_kyoku":
            self._reset()
            self.dora_indicators.append(pai)
            self._witness(pai, *tiles)
        elif kind == "tsumo":
            self.tiles_left -= 1
            if mine:
                self._witness(pai)
        elif kind == "dahai":
            if mine:
                self.at_rinshan = self.at_ippatsu = self.can_w_riichi = False
            else:
                self._witness(pai)
        elif kind in ("chi", "pon", "daiminkan"):
            if mine:
                self.own_fuuro_tiles += tiles + [pai]
                if kind == "daiminkan":
                    self.at_rinshan = True
            else:
                self._witness(*tiles)
                self.can_w_riichi = self.at_ippatsu = False
        elif kind == "kakan":
            if mine:
                self.own_fuuro_tiles.append(pai)
                self.at_rinshan = True
            else:
                self._witness(pai)
                self.pending_kakan = True
        elif kind == "ankan":
            self.can_w_riichi = self.at_ippatsu = False
            if mine:
                self.own_fuuro_tiles += tiles
                self.at_rinshan = True
            else:
                self._witness(*tiles)
        elif kind == "dora":
            self.dora_indicators.append(pai)
            self._witness(pai)
        elif kind == "reach" and mine:
            self.is_w_riichi = self.can_w_riichi
        elif kind == "reach_accepted" and mine:
            self.at_ippatsu = True
