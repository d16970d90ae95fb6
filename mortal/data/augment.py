"""Manzu/pinzu swap of mjai events and logs (Mortal's ``Event::augment``), the loader's ``augmented`` option."""

from __future__ import annotations

import json

from mortal.data.mjai_log import LoadedLog


def _swap_mp(name: str) -> str:
    # 1m<->1p ... 9m<->9p, 5mr<->5pr; souzu, honors and '?' unchanged.
    if len(name) >= 2 and name[1] in "mp":
        return name[0] + ("p" if name[1] == "m" else "m") + name[2:]
    return name


def augment_event(ev: dict) -> dict:
    """Copy of ``ev`` with manzu and pinzu swapped in every tile field (Mortal's ``Event::augment``)."""
    out = dict(ev)
    for key in ("pai", "dora_marker"):
        if isinstance(out.get(key), str):
            out[key] = _swap_mp(out[key])
    for key in ("consumed", "ura_markers"):
        if isinstance(out.get(key), list):
            out[key] = [_swap_mp(t) for t in out[key]]
    if isinstance(out.get("tehais"), list):
        out["tehais"] = [[_swap_mp(t) for t in hand] for hand in out["tehais"]]
    meta = out.get("meta")
    cf = meta.get("counterfactual") if isinstance(meta, dict) else None
    if isinstance(cf, dict) and isinstance(cf.get("action"), int):  # the arena's branch action, an index 0-45
        out["meta"] = {**meta, "counterfactual": {**cf, "action": _swap_mp_index(cf["action"])}}
    return out


def _swap_mp_index(index: int) -> int:
    # action index with manzu and pinzu swapped: 0-8 <-> 9-17, 5mr (34) <-> 5pr (35); others unchanged
    if 0 <= index < 18:
        return index + 9 if index < 9 else index - 9
    return {34: 35, 35: 34}.get(index, index)


def augment_log(log: LoadedLog) -> LoadedLog:
    """``augment_event`` over a whole parsed log (new JSON lines are written)."""
    events = [augment_event(ev) for ev in log.events]
    return LoadedLog(events, [json.dumps(ev, separators=(",", ":")) for ev in events],
                     log.line_numbers, log.source)
