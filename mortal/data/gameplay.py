"""mjai log -> per-seat training samples, as Mortal's ``libriichi/src/dataset/gameplay.rs``; unlike Mortal, a
label its mask forbids rejects the log, logs must end with ``end_game``, and there are no oracle observations."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import numpy as np
from mjai.mlibriichi.state import PlayerState

from mortal.features.action import HORA, KAN, PASS, RIICHI, RYUKYOKU, event_to_label, kan_select_label
from mortal.features.mjai import is_int
from mortal.data.grp import Grp
from mortal.data.mjai_log import (DEFAULT_MAX_LOG_BYTES, BadLogError, LoadedLog, is_points, parse_log, read_log,
                                  skip_message)
from mortal.features.obs import check_version
from mortal.features.obs_v4 import DeferredSP, DeferredSPError, V4Encoder
from mortal.features.packed_obs import NotPackableError, packer, row_bytes, unpack

logger = logging.getLogger('mortal.gameplay')  # the name before the package split (log format)

_SKIPPED_AS_NEXT = ("reach_accepted", "dora")
_OWN_ACTIONS = frozenset({"dahai", "reach", "chi", "pon", "daiminkan", "kakan", "ankan", "hora"})
_MAX_SKIP_RECORDS = 1000
# Reactions whose logged event may carry the arena's ``meta.counterfactual`` (mortal.play.counterfactual._Branch).
_CF_TYPES = frozenset({"dahai", "reach", "chi", "pon", "daiminkan", "kakan", "ankan"})
_cf_warned = False  # a counterfactual record that is not legal was logged once
_V4_BATCH = 128  # v4 decisions searched per batch: enough to keep the threads busy, the arrays small


def _is_fatal(exc: BaseException) -> bool:
    # pyo3's PanicException derives from BaseException: a bad log, unlike these
    return isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError))


@dataclass
class Gameplay:
    """Samples of one seat in one game (N rows); ``take`` returns a field and releases it (Mortal's ``take_*``):
    ``packed_obs`` ``(N, row_bytes)`` uint8, ``actions`` int64, ``masks`` ``(N, 46)`` bool, ``at_kyoku`` uint8,
    ``dones``/``apply_gamma`` bool, ``event_idx`` int32, ``cf_actions`` int64 (-1: no counterfactual record)."""

    packed_obs: np.ndarray
    actions: np.ndarray
    masks: np.ndarray
    at_kyoku: np.ndarray
    dones: np.ndarray
    apply_gamma: np.ndarray
    event_idx: np.ndarray
    grp: Grp = field(default_factory=Grp)
    player_id: int = 0
    version: int = 3
    cf_actions: np.ndarray | None = None
    cf_records: list | None = None

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def obs(self) -> np.ndarray | None:
        """``(N, C, 34)`` float32 unpacked from ``packed_obs`` (a new array each access; None once taken)."""
        return None if self.packed_obs is None else unpack(self.packed_obs, self.version)

    def take(self, name: str):
        """Field ``name`` (e.g. ``"actions"``), released."""
        value = getattr(self, name)
        setattr(self, name, None)
        return value

    def take_obs(self) -> np.ndarray:
        """``obs`` (``(N, C, 34)`` float32), releasing the packed rows."""
        return unpack(self.take("packed_obs"), self.version) if self.packed_obs is not None else None


class _SeatRecorder:
    """Accumulates samples for one seat while its ``PlayerState`` replays the log."""

    def __init__(self, version: int, seat: int):
        self.version = version
        self.seat = seat
        self.deferred = DeferredSP() if version == 4 else None
        self.row_bytes = row_bytes(version)
        self.pack = packer(version)
        self.packed = np.empty((256, self.row_bytes), dtype=np.uint8)  # a hanchan seat's decisions; grown by doubling
        self.masks, self.actions = [], []
        self.at_kyoku, self.apply_gamma = [], []
        self.event_idx = []
        self.cf_actions, self.cf_records = [], []
        self.cf_ignored = 0  # counterfactual records of the log not legal for their sample

    def add(self, state, at_kan_select: bool, label: int, kyoku_idx: int, log: LoadedLog, cur_idx: int,
            next_idx: int, v4: V4Encoder | None = None, cf: tuple | None = None):
        # ``v4``: the seat's V4Encoder iff version 4; its searches wait in ``self.deferred`` until ``flush``.
        n = len(self.actions)
        if n == len(self.packed):
            grown = np.empty((2 * n, self.row_bytes), dtype=np.uint8)
            grown[:n] = self.packed
            self.packed = grown
        pending = False
        if v4 is not None:
            try:
                obs, mask, pending = self.deferred.encode(v4, state, at_kan_select, (n, cur_idx))
            except ValueError as e:  # e.g. more copies of a tile seen than exist
                self.flush(log)  # an earlier decision's error comes first, as when each was encoded at once
                raise BadLogError(log.source, f"v4 encoder of seat {state.player_id}: {e}",
                                  log.line_numbers[cur_idx]) from None
        else:
            obs, mask = state.encode_obs(self.version, at_kan_select)
        if not pending:
            self._pack(obs, n, log, cur_idx)
        if not mask[label]:
            self.flush(log)
            raise BadLogError(
                log.source,
                f"illegal move for seat {state.player_id}: {log.events[next_idx]['type']} "
                f"(label {label}{', kan select' if at_kan_select else ''}) is not legal here",
                log.line_numbers[next_idx],
            )
        self.masks.append(mask)
        self.actions.append(label)
        self.at_kyoku.append(kyoku_idx)
        self.apply_gamma.append(label <= RIICHI)
        self.event_idx.append(cur_idx)
        if cf is not None and not (cf[0] != label and mask[cf[0]]):
            self.cf_ignored += 1
            cf = None
        self.cf_actions.append(-1 if cf is None else cf[0])
        self.cf_records.append(None if cf is None else cf[1])

    def _pack(self, obs, n: int, log: LoadedLog, cur_idx: int, pending_first: bool = True) -> None:
        try:
            # packed right away: the float32 array (about 127 KB) is freed while still in cache
            self.pack(obs, self.packed, n)
        except NotPackableError as e:
            if pending_first:  # decisions still pending are earlier: their error would have come first
                self.flush(log)
            self.deferred = None  # the log is rejected: what is still pending is dropped
            raise BadLogError(log.source, f"seat {self.seat}: {e}", log.line_numbers[cur_idx]) from None

    def flush(self, log: LoadedLog, background: bool = False) -> None:
        """Run the pending v4 searches and pack them (``background``: as ``DeferredSP.flush``); ``BadLogError``."""
        if self.deferred is None:
            return
        try:
            done = self.deferred.flush(background)
        except DeferredSPError as e:
            self.deferred = None  # the log is rejected: what is still pending is dropped
            raise BadLogError(log.source, f"v4 encoder of seat {self.seat}: {e}",
                              log.line_numbers[e.tag[1]]) from None
        for obs, (n, cur_idx) in done:  # in decision order, all earlier than anything still pending
            self._pack(obs, n, log, cur_idx, pending_first=False)

    def finish(self, grp: Grp) -> Gameplay:
        n = len(self.actions)
        at_kyoku = np.asarray(self.at_kyoku, dtype=np.uint8)
        dones = np.ones(n, dtype=np.bool_)
        if n > 1:
            dones[:-1] = at_kyoku[1:] > at_kyoku[:-1]
        return Gameplay(
            packed_obs=self.packed[:n].copy() if 2 * n < len(self.packed) else self.packed[:n],
            actions=np.asarray(self.actions, dtype=np.int64),
            masks=np.stack(self.masks) if n else np.zeros((0, 46), np.bool_), at_kyoku=at_kyoku, dones=dones,
            apply_gamma=np.asarray(self.apply_gamma, dtype=np.bool_), event_idx=np.asarray(self.event_idx, np.int32),
            cf_actions=np.asarray(self.cf_actions, dtype=np.int64), cf_records=self.cf_records, grp=grp,
            player_id=self.seat, version=self.version)


_MASKED = "?"
_TILE_FIELDS = ("pai", "dora_marker")
_TILE_LIST_FIELDS = ("consumed",)


def _check_unmasked(log: LoadedLog, seat: int) -> None:
    """``BadLogError`` if ``seat``'s replay would meet a masked ``'?'`` (the Rust state would panic)."""
    for ev, no in zip(log.events, log.line_numbers):
        typ = ev["type"]
        if typ == "start_kyoku":
            hand = ev["tehais"][seat]  # parse_log checked that there are 4
            if isinstance(hand, list) and _MASKED in hand:
                raise BadLogError(log.source, f"start_kyoku tehais of seat {seat} hold masked tiles '?' (a log "
                                              f"from another player's view?); training needs full hands", no)
        elif typ == "tsumo" and ev["actor"] != seat:
            continue  # another seat's masked draw is normal in a player's view
        for key in _TILE_FIELDS:
            if ev.get(key) == _MASKED:
                raise BadLogError(log.source, f"{typ} field {key!r} is a masked tile '?' (seat {seat} needs "
                                              f"to know it)", no)
        for key in _TILE_LIST_FIELDS:
            v = ev.get(key)
            if isinstance(v, list) and _MASKED in v:
                raise BadLogError(log.source, f"{typ} field {key!r} holds a masked tile '?'", no)


def _label(cur_cans, events, i, nxt_idx, seat):
    """(label, kan_select_label) for a decision after ``events[i]``, or (None, None) (Mortal's window rules; a kan
    always with its kan-select sample, as Mortal's ``always_include_kan_select``)."""
    nxt = events[nxt_idx]
    typ = nxt["type"]
    if typ in ("dahai", "reach") or (typ in ("chi", "pon") and nxt["actor"] == seat):
        return event_to_label(nxt), None
    if typ in ("kakan", "ankan") or (typ == "daiminkan" and nxt["actor"] == seat):
        return KAN, kan_select_label(nxt)
    if typ == "ryukyoku" and cur_cans.can_ryukyoku:
        return RYUKYOKU, None
    # Agari or pass. Only wnd[1..4] is scanned for this seat's hora, as Mortal.
    has_any_ron = events[i + 1]["type"] == "hora"
    if has_any_ron:
        for ev in events[i + 1:i + 4]:
            if ev["type"] == "end_kyoku":
                break
            if ev["type"] == "hora" and ev["actor"] == seat:
                return HORA, None
    # Pass only if declined: a chi chance then a plain tsumo, or a pon/kan/ron chance no ron cut short.
    if (cur_cans.can_chi and typ == "tsumo") or (
        (cur_cans.can_pon or cur_cans.can_daiminkan or cur_cans.can_ron_agari) and not has_any_ron
    ):
        return PASS, None
    return None, None


def _counterfactual(ev: dict, seat: int, kept: list, passed: bool):
    """``(action, ('next'|'final', values))`` of ``seat``'s counterfactual record on ``ev``, else None (bad: counted
    in ``kept[0]``). A pass is recorded on the event it answered as ``"pass": {"actor": seat, "meta": ...}``
    (``mortal.play.log_writer.kyoku_lines``), any other decision on its own event."""
    rec = ev.get("pass") if passed else ev
    if not isinstance(rec, dict) or rec.get("actor") != seat or not (passed or ev["type"] in _CF_TYPES):
        return None
    meta = rec.get("meta")
    cf = meta.get("counterfactual") if isinstance(meta, dict) else None
    if cf is None:
        return None
    if isinstance(cf, dict) and is_int(cf.get("action")) and 0 <= cf["action"] < 46:
        for kind, size in (("next", 7), ("final", 4)):
            values = cf.get(kind)
            if (isinstance(values, list) and len(values) == size and all(is_points(v) for v in values)
                    and (kind == "final" or 0 <= values[0] < 12)):
                return cf["action"], (kind, values)
    kept[0] += 1
    return None


def _is_multi_ron(nxt: dict, seat: int, ron_cans, winners: set) -> bool:
    """Whether ``nxt``, a later ``hora`` by ``seat``, is a legal extra multi-ron winner (by ``ron_cans``)."""
    return (nxt["type"] == "hora" and ron_cans is not None and ron_cans.can_ron_agari
            and nxt.get("target") != seat and seat not in winners)


# The loader's ``augmented`` option: the manzu/pinzu swap (Mortal's ``Event::augment``).
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


class GameplayLoader:
    """Turns mjai logs into ``Gameplay`` samples (Mortal's ``GameplayLoader``), no oracle observations."""

    def __init__(self, version: int, *, player_names=None, augmented: bool = False,
                 max_log_bytes: int | None = DEFAULT_MAX_LOG_BYTES):
        self.version = check_version(version)
        self._names = frozenset(player_names or ())
        self.augmented = bool(augmented)
        self.max_log_bytes = max_log_bytes
        self.skipped = 0
        self.skipped_files: list[tuple[str, str]] = []
        self.cf_ignored = 0  # counterfactual records ignored (see _count_bad_counterfactuals)

    def load_log(self, raw: str, source: str = "<log>") -> list[Gameplay]:
        """One ``Gameplay`` per kept seat of one game (mjai JSON lines); ``BadLogError`` for a bad log."""
        return self.load_parsed(parse_log(raw, source))

    def load_parsed(self, log: LoadedLog) -> list[Gameplay]:
        """``load_log`` of a log ``parse_log`` returned."""
        if self.augmented:  # new JSON lines are written for the swapped events
            events = [augment_event(ev) for ev in log.events]
            log = LoadedLog(events, [json.dumps(ev, separators=(",", ":")) for ev in events], log.line_numbers,
                            log.source)
        grp = Grp.load_events(log.events, log.source)
        names = log.events[0].get("names") or [""] * 4
        seats = [i for i, n in enumerate(names) if n in self._names] if self._names else list(range(4))
        if any('"?"' in line for line in log.lines):  # cheap test on the JSON text first: full logs have none
            for seat in seats:
                _check_unmasked(log, seat)
        # What every seat's walk reads of the event windows, found once per log.
        types = [ev["type"] for ev in log.events]
        n = max(len(types) - 3, 0)
        nxt_of = [i + 2 if types[i + 1] in _SKIPPED_AS_NEXT else i + 1 for i in range(n)]
        # the seat acting in the next event when that is an own action after an event that is not skipped, else -1
        own_actor = [log.events[j]["actor"] if types[j] in _OWN_ACTIONS and types[i] not in _SKIPPED_AS_NEXT else -1
                     for i, j in enumerate(nxt_of)]
        return [self._load_seat(log, grp, seat, (types, nxt_of, own_actor)) for seat in seats]

    def _load_seat(self, log: LoadedLog, grp: Grp, seat: int, windows: tuple) -> Gameplay:
        state = PlayerState(seat)
        enc = V4Encoder(seat) if self.version == 4 else None
        rec = _SeatRecorder(self.version, seat)
        try:
            self._walk_seat(log, seat, windows, state, enc, rec)
        except BadLogError:
            rec.flush(log)  # a pending decision's error, earlier in the log, is reported instead
            raise
        rec.flush(log)
        return rec.finish(grp)

    def _walk_seat(self, log: LoadedLog, seat: int, windows: tuple, state, enc, rec: _SeatRecorder) -> None:
        global _cf_warned
        events, lines = log.events, log.lines
        types, nxt_of, own_actor = windows
        kyoku_idx = 0
        ron_cans, winners = None, set()
        has_cf = any('"counterfactual"' in line for line in lines)  # cheap test first: most logs have none
        bad_cf = [0]
        for i, nxt_idx in enumerate(nxt_of):
            cur_type = types[i]
            if cur_type == "end_kyoku":
                kyoku_idx += 1
            try:
                cans = state.update(lines[i])
            except BaseException as e:  # noqa: BLE001 - pyo3 errors incl. PanicException
                if _is_fatal(e):
                    raise
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise BadLogError(log.source, f"{cur_type} rejected by PlayerState of seat {seat}: {reason}",
                                  log.line_numbers[i]) from None
            if enc is not None:
                try:
                    enc.update_parsed(events[i])
                except (KeyError, ValueError, TypeError) as e:  # a field the state did not need
                    raise BadLogError(log.source, f"{cur_type} rejected by the v4 encoder of seat {seat}: "
                                      f"{type(e).__name__}: {e}", log.line_numbers[i]) from None
            if cur_type == "hora":
                winners.add(events[i]["actor"])
            elif cur_type not in _SKIPPED_AS_NEXT:
                # The state a multi-ron is judged on: every hora of a run answers this
                # discard or kan (a kan's ``dora`` may come in between).
                ron_cans = cans
                if winners:
                    winners.clear()
            if not cans.can_act:
                if (own_actor[i] == seat
                        and not (cur_type == "hora" and _is_multi_ron(events[nxt_idx], seat, ron_cans, winners))):
                    raise BadLogError(log.source, f"illegal move: seat {seat} cannot {types[nxt_idx]} here",
                                      log.line_numbers[nxt_idx])
                continue
            try:
                label, kan = _label(cans, events, i, nxt_idx, seat)
            except (ValueError, KeyError, TypeError) as e:  # a bad tile name or a missing field of the next event
                raise BadLogError(log.source, f"{types[nxt_idx]} cannot be labelled for seat {seat}: "
                                  f"{type(e).__name__}: {e}", log.line_numbers[nxt_idx]) from None
            if label is None:
                continue
            cf = None
            if has_cf:
                passed = label == PASS
                cf = _counterfactual(events[i] if passed else events[nxt_idx], seat, bad_cf, passed)
            rec.add(state, False, label, kyoku_idx, log, i, nxt_idx, enc, cf)
            if kan is not None:
                rec.add(state, True, kan, kyoku_idx, log, i, nxt_idx, enc)
            if enc is not None and len(rec.deferred) >= _V4_BATCH:
                rec.flush(log, background=True)  # searched while the walk goes on
        n = bad_cf[0] + rec.cf_ignored  # counted in cf_ignored; the first is logged once per process
        self.cf_ignored += n
        if n and not _cf_warned:
            _cf_warned = True
            logger.warning("%s: %d counterfactual record(s) of seat %d ignored (malformed, or the action is not "
                           "legal or is the one taken); logged once", log.source, n, seat)

    def load_log_file(self, path) -> list[Gameplay]:
        """``load_log`` of a gzip or plain file; raises ``BadLogError`` or ``OSError``."""
        return self.load_parsed(read_log(path, self.max_log_bytes))

    def load_gz_log_files(self, paths) -> list[list[Gameplay]]:
        """``load_log_file`` over ``paths``; a bad file yields ``[]``, a warning, and counts in ``skipped``."""
        out = []
        for path in paths:
            try:
                out.append(self.load_log_file(path))
            except BaseException as e:  # noqa: BLE001 - a KeyError, a pyo3 panic: also that file's fault
                if _is_fatal(e):
                    raise
                message = skip_message(path, e)
                logger.warning("%s", message)
                self.skipped += 1
                if len(self.skipped_files) < _MAX_SKIP_RECORDS:
                    self.skipped_files.append((str(path), message))
                out.append([])
        return out
