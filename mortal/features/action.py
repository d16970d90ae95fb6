"""The 46-way action space (Mortal's ``consts.rs``): index <-> mjai reaction, mjai event -> label. 0-36
discard (the kan tile 0-33 at kan select), 37 riichi, 38-40 chi, 41 pon, 42 kan, 43 hora, 44 ryukyoku, 45 pass."""

from __future__ import annotations

from mortal.features.tile import akaize, chi_type, deaka, is_aka, tile_id, tile_name

ACTION_SPACE = 46
RIICHI = 37
CHI_LOW = 38
CHI_MID = 39
CHI_HIGH = 40
PON = 41
KAN = 42
HORA = 43
RYUKYOKU = 44
PASS = 45

# Event types that are one seat's decision, and their fixed labels.
_FIXED_LABELS = {"reach": RIICHI, "pon": PON, "daiminkan": KAN, "kakan": KAN, "ankan": KAN, "hora": HORA,
                 "ryukyoku": RYUKYOKU, "none": PASS}
_SUIT_OF_FIVE = {4: 0, 13: 1, 22: 2}  # plain five id -> index in akas_in_hand


def action_kind(index: int) -> str:
    """'discard', 'riichi', 'chi', 'pon', 'kan', 'hora', 'ryukyoku' or 'pass'; ValueError outside 0-45."""
    if not 0 <= index < ACTION_SPACE:
        raise ValueError(f"action index must be within 0-{ACTION_SPACE - 1}, got {index}")
    if index < RIICHI:
        return "discard"
    if CHI_LOW <= index <= CHI_HIGH:
        return "chi"
    return {RIICHI: "riichi", PON: "pon", KAN: "kan", HORA: "hora", RYUKYOKU: "ryukyoku", PASS: "pass"}[index]


def _holds_aka(state, plain_five: int) -> bool:
    """Whether the seat holds the red five of ``plain_five``'s suit (4/13/22)."""
    suit = _SUIT_OF_FIVE.get(plain_five)
    return suit is not None and bool(state.akas_in_hand[suit])


def _fail(state, index: int, why: str) -> ValueError:
    return ValueError(f"action index {index} is not legal here ({why}); state:\n{state.brief_info()}")


def _tile_opt(name: str | None) -> int | None:
    return None if name is None else tile_id(name)


def _last_kawa(state, index: int) -> int:
    tile = _tile_opt(state.last_kawa_tile())
    if tile is None:
        raise _fail(state, index, "no discard to call")
    return tile


def _dahai(state, index: int, actor: int) -> dict:
    cans = state.last_cans
    if not cans.can_discard:
        raise _fail(state, index, "cannot discard now")
    plain = deaka(index)
    held = state.tehai[plain]
    aka = _holds_aka(state, plain)
    # A red id needs the red five; a plain five id needs a plain copy besides it.
    if not (aka if is_aka(index) else held - aka > 0):
        raise _fail(state, index, f"{tile_name(index)} is not in hand")
    if state.forbidden_tiles[plain]:
        raise _fail(state, index, f"{tile_name(index)} is forbidden (kuikae)")
    tsumo = _tile_opt(state.last_self_tsumo())
    if state.self_riichi_accepted and tsumo != index:
        raise _fail(state, index, "in riichi only the drawn tile may be discarded")
    # Exact, red-sensitive comparison, as Mortal's agent.
    return {"type": "dahai", "actor": actor, "pai": tile_name(index), "tsumogiri": tsumo == index}


def _chi(state, index: int, actor: int) -> dict:
    cans = state.last_cans
    kind = index - CHI_LOW
    if not (cans.can_chi_low, cans.can_chi_mid, cans.can_chi_high)[kind]:
        raise _fail(state, index, f"cannot chi {('low', 'mid', 'high')[kind]}")
    pai = _last_kawa(state, index)
    p = deaka(pai)
    consumed = [p + d for d in ((1, 2), (-1, 1), (-2, -1))[kind]]  # relative to the called tile
    # The held red five goes into the run; a called red five has no other five beside it (Mortal).
    if not is_aka(pai):
        consumed = [akaize(t) if _holds_aka(state, t) else t for t in consumed]
    return {"type": "chi", "actor": actor, "target": cans.target_actor,
            "pai": tile_name(pai), "consumed": [tile_name(t) for t in consumed]}


def _pon(state, index: int, actor: int) -> dict:
    cans = state.last_cans
    if not cans.can_pon:
        raise _fail(state, index, "cannot pon")
    pai = _last_kawa(state, index)
    p = deaka(pai)
    if not is_aka(pai) and _holds_aka(state, p):
        consumed = [akaize(p), p]
    else:
        consumed = [p, p]
    return {"type": "pon", "actor": actor, "target": cans.target_actor,
            "pai": tile_name(pai), "consumed": [tile_name(t) for t in consumed]}


def _kan(state, index: int, actor: int, kan_select: int | None) -> dict:
    cans = state.last_cans
    if not (cans.can_daiminkan or cans.can_ankan or cans.can_kakan):
        raise _fail(state, index, "cannot kan")
    ankans = [tile_id(t) for t in state.ankan_candidates()]
    kakans = [tile_id(t) for t in state.kakan_candidates()]

    if cans.can_daiminkan:
        pai = _last_kawa(state, index)
        # Mortal never runs a kan-select pass for daiminkan (the tile is forced): only that tile is accepted.
        if kan_select is not None and kan_select != deaka(pai):
            raise _fail(state, index, f"kan_select {kan_select} is not the daiminkan tile")
        p = deaka(pai)
        # A called plain five means the red one must be among the three held.
        consumed = [p, p, p] if is_aka(pai) else [akaize(p), p, p]
        return {"type": "daiminkan", "actor": actor, "target": cans.target_actor,
                "pai": tile_name(pai), "consumed": [tile_name(t) for t in consumed]}

    if kan_select is not None:
        tile = deaka(int(kan_select))
        if tile not in ankans and tile not in kakans:
            raise _fail(state, index, f"kan_select {kan_select} is not a kan candidate")
    elif cans.can_ankan and ankans:
        tile = ankans[0]
    elif kakans:
        tile = kakans[0]
    else:
        raise _fail(state, index, "no kan candidate")

    if cans.can_ankan and tile in ankans:
        # All four copies: the red one (if the kind has one) is among them.
        consumed = [akaize(tile), tile, tile, tile]
        return {"type": "ankan", "actor": actor, "consumed": [tile_name(t) for t in consumed]}
    if not cans.can_kakan:
        raise _fail(state, index, f"cannot kakan {tile_name(tile)}")
    if _holds_aka(state, tile):
        pai, consumed = akaize(tile), [tile, tile, tile]
    else:
        pai, consumed = tile, [akaize(tile), tile, tile]
    return {"type": "kakan", "actor": actor, "pai": tile_name(pai),
            "consumed": [tile_name(t) for t in consumed]}


def reaction_from_index(state, index: int, *, kan_select: int | None = None) -> dict:
    """The mjai reaction dict for action ``index`` in ``state``, as Mortal's agent builds it (red fives spent
    whenever held; ``kan_select``: the kan tile 0-33, None: Mortal's default). ValueError (naming the index, with
    ``state.brief_info()``) for an index out of range or not legal by the state's flags and tiles."""
    index = int(index)
    if not 0 <= index < ACTION_SPACE:
        raise ValueError(f"action index {index} outside 0-{ACTION_SPACE - 1}")
    actor = state.player_id
    cans = state.last_cans
    if index <= 36:
        return _dahai(state, index, actor)
    if index == RIICHI:
        if not cans.can_riichi:
            raise _fail(state, index, "cannot riichi")
        return {"type": "reach", "actor": actor}
    if index in (CHI_LOW, CHI_MID, CHI_HIGH):
        return _chi(state, index, actor)
    if index == PON:
        return _pon(state, index, actor)
    if index == KAN:
        return _kan(state, index, actor, kan_select)
    if index == HORA:
        if not cans.can_agari:
            raise _fail(state, index, "cannot hora")
        return {"type": "hora", "actor": actor, "target": cans.target_actor}
    if index == RYUKYOKU:
        if not cans.can_ryukyoku:
            raise _fail(state, index, "cannot ryukyoku")
        return {"type": "ryukyoku"}
    # PASS. Mortal emits "none" unchecked; a pass on one's own turn would stall the board.
    if not cans.can_pass:
        raise _fail(state, index, "nothing to pass on (own turn)")
    return {"type": "none"}


def _field(event: dict, key: str):
    try:
        return event[key]
    except KeyError:
        raise ValueError(f"{event.get('type')!r} event without {key!r}: {event!r}") from None


def event_to_label(event: dict) -> int | None:
    """Label 0-45 of one mjai decision event, None for other types; ValueError for a missing or bad tile."""
    ty = event.get("type")
    if ty == "dahai":
        return tile_id(_field(event, "pai"))
    if ty == "chi":
        consumed = [tile_id(t) for t in _field(event, "consumed")]
        if len(consumed) != 2:
            raise ValueError(f"chi consumes 2 tiles, got {consumed!r}: {event!r}")
        return CHI_LOW + chi_type(tile_id(_field(event, "pai")), consumed)
    return _FIXED_LABELS.get(ty)


def kan_select_label(event: dict) -> int:
    """Kan-select label 0-33 of a kan event; ValueError for another event or a bad tile."""
    ty = event.get("type")
    if ty in ("daiminkan", "kakan"):
        return deaka(tile_id(_field(event, "pai")))
    if ty == "ankan":
        consumed = _field(event, "consumed")
        if not consumed:
            raise ValueError(f"ankan without consumed tiles: {event!r}")
        return deaka(tile_id(consumed[0]))
    raise ValueError(f"not a kan event: {event!r}")

