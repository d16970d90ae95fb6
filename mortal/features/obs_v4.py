"""Observation version 4 (1012x34), as Mortal's ``state/obs_repr.rs``: rows 0-888 the re-packed v3 array
(``ROW_TABLE``, the core's ``repack_v3``), 889-1011 the single-player block from the compiled core (``SP_*``).
Feed a seat's ``V4Encoder`` every event its ``PlayerState`` gets, in order."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

from mortal.features.obs_v4_kyoku import MAX_DORA_INDICATORS, KyokuFacts  # noqa: F401 (API of this module)
from mortal.features.sp.calc import require_core
from mortal.features.tile import TILE_IDS

OBS_CHANNELS_V4 = 1012
# (name, v4 start, v3 start or None, rows) for rows 1-23, in the order of Mortal's ``obs_repr.rs``; the core's
# ``repack_v3`` copies the same blocks (tests/test_obs_v4.py checks it against this table).
ROW_TABLE = (
    ("tehai", 0, 0, 4),
    ("akas_in_hand", 4, 4, 3),
    ("scores", 7, None, 8),           # per player: v3 row 7+10p, then clamp/3e4
    ("rank", 15, 47, 4),
    ("kyoku", 19, 51, 4),
    ("honba_kyotaku", 23, None, 2),
    ("bakaze_jikaze", 25, 59, 2),
    ("grand_kyoku", 27, 61, 1),
    ("dora_indicators", 28, 62, 7),
    ("kawa_and_tiles_left", 35, 69, 683),  # own kawa 96+1, opponents 585, tiles_left 1
    ("doras_owned", 718, None, 4),    # v3 rows 752, 755, 758, 761
    ("doras_unseen", 722, 764, 1),
    ("rest_v3", 723, 768, 166),       # kawa overview .. action rows (v3 768-933)
)
SP_START = 889
SP_EV = SP_START                       # 2 rows: the best EV (or the fallback value) /1e5 and /3e4
SP_REQUIRED = SP_START + 2             # 68 rows (3n+2: per discard, +34 if it lowers the shanten) / row +69 (3n+1)
SP_BEST = SP_START + 70                # 1 row (3n+2), then 1 empty row
SP_TABLE = SP_START + 72               # 3 x 17 rows: tenpai, win, EV by turn
SP_ROWS = OBS_CHANNELS_V4 - SP_START  # 123

#: Default single-player search threads; None: min(8, CPU count). ``entry.start`` sets it from MORTAL_SP_THREADS.
SP_THREADS = None


class V4Encoder(KyokuFacts):
    """Per-seat v4 encoder: feed it every mjai event the seat's ``PlayerState`` gets; ``SPCoreMissing`` without core."""

    def __init__(self, player_id: int):
        if type(player_id) is not int or not 0 <= player_id <= 3:
            raise ValueError(f"player_id must be 0-3, got {player_id!r}")
        require_core()
        self.player_id = player_id
        self._reset()

    def encode(self, state, at_kan_select: bool = False) -> tuple:
        """``(obs (1012, 34) float32, mask (46,) bool)`` for ``state``; the SP rows are reused until the next
        ``update`` (the kan-select pass). ValueError for another seat's state or a hand the core refuses."""
        return encode_batch([(self, state, at_kan_select)], threads=1)[0]

    def _facts(self, state) -> tuple:
        """The decision tuple ``_core.sp_rows`` reads."""
        cans = state.last_cans
        akas, seen = state.akas_in_hand, self.akas_seen
        flags = (cans.can_discard | state.self_riichi_accepted << 1 | state.can_w_riichi << 2
                 | cans.can_ron_agari << 3 | cans.can_tsumo_agari << 4 | state.is_oya << 5 | self.is_w_riichi << 6
                 | self.at_ippatsu << 7 | self.at_rinshan << 8 | self.pending_kakan << 9)
        tsumo, kawa = state.last_self_tsumo(), state.last_kawa_tile()
        return (bytes(state.tehai), akas[0] | akas[1] << 1 | akas[2] << 2, bytes(state.chis), bytes(state.pons),
                bytes(state.minkans), bytes(state.ankans), state.bakaze, state.jikaze, bytes(state.tiles_seen),
                seen[0] | seen[1] << 1 | seen[2] << 2, bytes(self.dora_indicators), bytes(self.own_fuuro_tiles),
                self.tiles_left, flags, (cans.target_actor - self.player_id) % 4,
                -1 if tsumo is None else TILE_IDS[tsumo], -1 if kawa is None else TILE_IDS[kawa], state.scores[0])


def sp_threads() -> int:
    """Default thread count of ``encode_batch``: ``SP_THREADS`` if set, else min(8, CPU count)."""
    return SP_THREADS if SP_THREADS is not None else max(1, min(8, os.cpu_count() or 1))


def _checked(enc, state) -> None:
    if enc is None:
        raise ValueError("feature version 4 needs the seat's V4Encoder (fed every event the PlayerState got)")
    if state.player_id != enc.player_id:
        raise ValueError(f"state is seat {state.player_id}, encoder is seat {enc.player_id}")


def sp_rows(facts: list, threads: int, read_only: bool = False) -> np.ndarray:
    """``(len(facts), 123, 34)`` float32 rows 889-1011 of ``V4Encoder._facts`` tuples, searched together on
    ``threads`` threads; ValueError (naming the field) for a refused hand, before any search."""
    rows = np.empty((len(facts), SP_ROWS, 34), dtype=np.float32)
    require_core().sp_rows(facts, rows, int(threads))
    rows.flags.writeable = not read_only
    return rows


#: Rows (read-only views) of the last searches by their facts, which alone decide them: the arena replays decisions.
_RECENT: OrderedDict = OrderedDict()
RECENT_SEARCHES = 256


def prepare_sp(pairs, threads: int | None = None) -> None:
    """Search together the SP rows of each ``(encoder, state)`` not yet prepared nor recently searched; ValueError."""
    pending = {}
    for enc, state in pairs:
        _checked(enc, state)
        cache = enc._sp_cache
        if (cache is None or cache[0] != enc.events_seen) and id(enc) not in pending:
            pending[id(enc)] = (enc, enc._facts(state))
    found = {f: _RECENT.pop(f, None) for _, f in pending.values()}
    if todo := [f for f, r in found.items() if r is None]:
        found.update(zip(todo, sp_rows(todo, sp_threads() if threads is None else threads, read_only=True)))
    _RECENT.update(found)
    while len(_RECENT) > RECENT_SEARCHES:
        _RECENT.popitem(last=False)
    for enc, f in pending.values():
        enc._sp_cache = (enc.events_seen, found[f])


def encode_batch(items, threads: int | None = None, v3s=None) -> list:
    """``[(obs (1012, 34) float32, mask (46,) bool)]`` of ``(encoder, state, at_kan_select)`` items; ``v3s``: per
    item None or the ``state.encode_obs(3, at_kan_select)`` pair already made (not made again). ValueError."""
    prepare_sp([(enc, state) for enc, state, _ in items], threads)
    out = [_v3_rows(state, kan, v3s and v3s[k]) for k, (_, state, kan) in enumerate(items)]
    for (obs, _), (enc, _, _) in zip(out, items):
        obs[SP_START:] = enc._sp_cache[1]
    return out


def _v3_rows(state, at_kan_select, v3=None) -> tuple:
    """``(obs (1012, 34) float32: rows 0-888 written, mask (46,) bool)``; ``v3``: ``state``'s v3 pair if made."""
    v3, mask = v3 or state.encode_obs(3, bool(at_kan_select))
    obs = np.empty((OBS_CHANNELS_V4, 34), dtype=np.float32)
    require_core().repack_v3(v3, state.scores, state.honba, state.kyotaku, obs)
    return obs, mask


class DeferredSPError(ValueError):
    """A pending search of ``DeferredSP.flush`` failed; ``tag`` is its decision's tag."""

    def __init__(self, message: str, tag):
        super().__init__(message)
        self.tag = tag


class DeferredSP:
    """Version-4 encoding whose SP searches run later, many together (the loader's path); ``encode`` returns
    rows 0-888 at once, the next ``flush`` fills rows 889-1011, bit-equal to ``V4Encoder.encode``."""

    def __init__(self):
        self._jobs = []      # facts of the decisions to search
        self._pending = []   # (obs, index in _jobs, tag)
        self._last = None    # (encoder id, events_seen, job index): the kan-select pass shares the search
        self._inflight = None  # (thread, result box) of a background flush

    def __len__(self) -> int:
        """Decisions waiting for ``flush``."""
        return len(self._pending)

    def encode(self, enc: V4Encoder, state, at_kan_select: bool, tag=None) -> tuple:
        """``(obs (1012, 34) float32, mask (46,) bool, pending)``; when ``pending`` do not read ``obs`` before the
        ``flush`` that returns ``tag``. Raises ValueError as ``V4Encoder.encode``, before any search."""
        _checked(enc, state)
        obs, mask = _v3_rows(state, at_kan_select)
        cache = enc._sp_cache
        if cache is not None and cache[0] == enc.events_seen:
            obs[SP_START:] = cache[1]
            return obs, mask, False
        last = self._last
        if last is not None and last[0] == id(enc) and last[1] == enc.events_seen:
            self._pending.append((obs, last[2], tag))
            return obs, mask, True
        facts = enc._facts(state)
        # checked now, so a bad hand is reported at its own decision; a decision without a search is written now
        if not require_core().sp_rows([facts], obs[SP_START:], 1, True)[0]:
            enc._sp_cache = (enc.events_seen, obs[SP_START:].copy())
            return obs, mask, False
        self._jobs.append(facts)
        self._last = (id(enc), enc.events_seen, len(self._jobs) - 1)
        self._pending.append((obs, len(self._jobs) - 1, tag))
        return obs, mask, True

    def flush(self, background: bool = False) -> list:
        """Run the pending searches; returns ``[(obs, tag)]`` finished, in ``encode`` order (``background``:
        start them in a thread and return the previous background batch). ``DeferredSPError`` names a failed tag."""
        out = self._wait()
        jobs, pending = self._jobs, self._pending
        self._jobs, self._pending, self._last = [], [], None
        if not pending:
            return out
        threads = sp_threads()
        if not background:
            return out + _run_deferred(jobs, pending, threads)
        box = {}

        def run():
            try:
                box["out"] = _run_deferred(jobs, pending, threads)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = e

        thread = threading.Thread(target=run, name="v4-sp-search", daemon=True)
        thread.start()
        self._inflight = (thread, box)
        return out

    def _wait(self) -> list:
        if self._inflight is None:
            return []
        (thread, box), self._inflight = self._inflight, None
        thread.join()
        if "error" in box:
            self._jobs, self._pending, self._last = [], [], None
            raise box["error"]
        return box["out"]


def _run_deferred(jobs, pending, threads: int) -> list:
    """Run ``jobs`` in one core call, fill the rows of ``pending``; returns ``[(obs, tag)]``."""
    try:
        rows = sp_rows(jobs, threads)
    except ValueError as e:  # checked at encode: only a search that failed ends here
        raise DeferredSPError(str(e), pending[0][2]) from None
    for obs, k, _ in pending:
        obs[SP_START:] = rows[k]
    return [(obs, tag) for obs, _, tag in pending]
