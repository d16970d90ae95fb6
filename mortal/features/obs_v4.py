"""Observation version 4 (1012x34), as Mortal's ``state/obs_repr.rs`` with ``version = 4``.

``mjai.mlibriichi`` encodes versions 1-3 only. Version 4 is built here from
two parts:

* rows 0-888: the v3 array of ``PlayerState.encode_obs(3, at_kan_select)``
  re-packed (scores get a clamp(s,0,30000)/30000 row instead of 9 RBF rows;
  honba/kyotaku become min(n,10)/10; doras owned/unseen keep only their
  rescale row). The action mask is v3's, which equals v4's.
* rows 889-1011: the single-player (SP) block from ``mortal.features.sp.calc``.

The SP block needs per-kyoku facts that ``PlayerState`` does not expose (dora
indicators, red fives seen, tiles left, own call tiles, double riichi,
ippatsu, rinshan, chankan), so ``V4Encoder`` tracks them from the same mjai
event stream. Usage, per seat::

    state = PlayerState(seat); enc = V4Encoder(seat)
    for event in events:          # every event, in order, both objects
        state.update(json.dumps(event)); enc.update(event)
        obs, mask = enc.encode(state, at_kan_select=False)   # when deciding

Version 4 needs the compiled single-player core (``mortal.features.sp._core``, built by
``scripts/setup.sh``): ``V4Encoder`` raises ``SPCoreMissing`` without it. Cost: bench/obs_v4.py.

The parts: ``mortal.features.obs_v4_rows`` (the array's rows, the v3 re-pack, the SP rows),
``mortal.features.obs_v4_kyoku`` (the facts tracked from the events) and ``mortal.features.obs_v4_search`` (one
decision's search); here the encoder that joins them and the batching of the searches, at once (``encode_batch``)
or later (``DeferredSP``, the loader's path). The names of the parts are read from here.
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np

# the parts' names are also this module's API (tests, the loader, the agents and the packer read them from here)
from mortal.features.obs_v4_kyoku import MAX_DORA_INDICATORS, KyokuFacts  # noqa: F401
from mortal.features.obs_v4_rows import (OBS_CHANNELS_V3, OBS_CHANNELS_V4, MAX_NUM_TURNS, ROW_TABLE,  # noqa: F401
                                         SP_BEST, SP_EV, SP_REQUIRED, SP_START, SP_TABLE, fill_sp_tables, repack_v3)
from mortal.features.obs_v4_search import SinglePlayerSearch
from mortal.features.sp.calc import SHANTEN_THRES, calc_batch, require_core, sort_candidates
from mortal.features.sp.calc import _candidates as sp_candidates

logger = logging.getLogger('mortal.obs_v4')  # the name before the package split (log format)


#: Threads ``encode_batch`` runs single-player searches on by default (compiled core
#: only; the searches release the interpreter lock); None: min(8, CPU count). Entry
#: points set it at start-up from ``MORTAL_SP_THREADS`` (``mortal.entry.start``): set
#: that lower when several clients share a machine.
SP_THREADS = None


class V4Encoder(KyokuFacts, SinglePlayerSearch):
    """Per-seat v4 observation encoder; feed it every mjai event the seat's ``PlayerState`` gets.

    The facts of the kyoku come from ``KyokuFacts`` (``update``, ``update_parsed``), the single-player search of a
    decision from ``SinglePlayerSearch``.

    Args:
        player_id: absolute seat 0-3.

    Raises:
        ValueError: a bad seat. ``mortal.features.sp.calc.SPCoreMissing``: the compiled core is not built.
    """

    def __init__(self, player_id: int):
        if type(player_id) is not int or not 0 <= player_id <= 3:
            raise ValueError(f"player_id must be 0-3, got {player_id!r}")
        require_core()
        self.player_id = player_id
        self._reset()

    def encode(self, state, at_kan_select: bool = False) -> tuple:
        """``(obs (1012, 34) float32, mask (46,) bool)`` for ``state`` (a ``PlayerState``).

        The single-player rows are computed once per decision: a second call
        before the next ``update`` (the kan-select pass) reuses them.
        Raises ValueError if ``state`` belongs to another seat.
        """
        return encode_batch([(self, state, at_kan_select)], threads=1)[0]


def sp_threads() -> int:
    """Default thread count of ``encode_batch``: ``SP_THREADS`` if set, else min(8, CPU count)."""
    if SP_THREADS is not None:
        return SP_THREADS
    return max(1, min(8, os.cpu_count() or 1))


def prepare_sp(pairs, threads: int | None = None) -> None:
    """Compute the single-player rows of each ``(encoder, state)`` decision and keep them
    in the encoder (``encode`` and ``encode_batch`` then reuse them until its next ``update``).

    Decisions already prepared are skipped; the others are searched together on the
    compiled core on up to ``threads`` threads (default ``sp_threads()``). Safe to run in a background thread while
    other encoders are used elsewhere (the search releases the interpreter lock).

    Raises:
        ValueError: an encoder is None or belongs to another seat than its state.
    """
    pending, jobs = {}, []
    for enc, state in pairs:
        if enc is None:
            raise ValueError("feature version 4 needs the seat's V4Encoder (fed every event the PlayerState got)")
        if state.player_id != enc.player_id:
            raise ValueError(f"state is seat {state.player_id}, encoder is seat {enc.player_id}")
        cache = enc._sp_cache
        if (cache is not None and cache[0] == enc.events_seen) or id(enc) in pending:
            continue
        ctx = enc._context(state)
        job = enc._sp_job(state, ctx)
        pending[id(enc)] = (enc, state, ctx, job)
        if job is not None:
            jobs.append(job)
    if not pending:
        return
    results = calc_batch([(calc, args) for calc, args, _ in jobs],
                         sp_threads() if threads is None else threads) if jobs else []
    by_job = {id(job): tables for job, tables in zip(jobs, results)}
    scratch = np.zeros((OBS_CHANNELS_V4, 34), dtype=np.float32)
    for enc, state, ctx, job in pending.values():
        tables = None if job is None else V4Encoder._finish_tables(job, by_job[id(job)])
        scratch[SP_START:] = 0.0
        enc._fill_sp(state, ctx, tables, scratch)
        enc._sp_cache = (enc.events_seen, scratch[SP_START:].copy())


def encode_batch(items, threads: int | None = None) -> list:
    """Encode many decisions at once; the single-player searches run together.

    ``items``: sequence of ``(encoder, state, at_kan_select)`` (a ``V4Encoder``,
    its seat's ``PlayerState``). Returns ``[(obs (1012, 34) float32, mask (46,) bool)]``
    in order. The searches run as ``prepare_sp`` runs them; a decision met twice
    (main and kan-select pass) or already prepared is not searched again.

    Raises:
        ValueError: an encoder is None or belongs to another seat than its state.
    """
    prepare_sp([(enc, state) for enc, state, _ in items], threads)
    out = []
    for enc, state, at_kan_select in items:
        v3, mask = state.encode_obs(3, bool(at_kan_select))
        obs = np.empty((OBS_CHANNELS_V4, 34), dtype=np.float32)
        obs[:SP_START] = 0.0
        repack_v3(v3, state.scores, state.honba, state.kyotaku, obs)
        obs[SP_START:] = enc._sp_cache[1]
        out.append((obs, mask))
    return out


class DeferredSPError(ValueError):
    """A pending search of ``DeferredSP.flush`` rejected its hand; ``tag`` is its decision's tag."""

    def __init__(self, message: str, tag):
        super().__init__(message)
        self.tag = tag


class DeferredSP:
    """Version-4 encoding whose single-player searches are run later, many together (the loader's path).

    ``encode`` returns each decision's observation at once with rows 0-888 final; where a search is
    needed its rows 889-1011 are left zero and filled by the next ``flush``, which runs the pending
    searches in one core call on up to ``threads`` threads (default ``sp_threads()``), at once or in a
    background thread (``flush(background=True)``; the search releases the interpreter lock).
    The arrays are bit for bit those of ``V4Encoder.encode``.

    Args:
        threads: search threads of ``flush``; None: ``sp_threads()`` at flush time.
    """

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self._jobs = []      # (calculator, core args, sort by EV, last tsumo or None, can_discard)
        self._pending = []   # (obs, index in _jobs, tag)
        self._last = None    # (encoder id, events_seen, job index): the kan-select pass shares the search
        self._inflight = None  # (thread, result box) of a background flush

    def __len__(self) -> int:
        """Decisions waiting for ``flush``."""
        return len(self._pending)

    def encode(self, enc: V4Encoder, state, at_kan_select: bool, tag=None) -> tuple:
        """``(obs (1012, 34) float32, mask (46,) bool, pending)`` of one decision of ``enc``'s seat.

        ``pending`` True: rows 889-1011 of ``obs`` are filled by the next ``flush`` (which returns
        ``tag`` with it); do not use ``obs`` before. Raises ValueError as ``V4Encoder.encode``
        (wrong seat, an impossible hand), before any search.
        """
        if enc is None:
            raise ValueError("feature version 4 needs the seat's V4Encoder (fed every event the PlayerState got)")
        if state.player_id != enc.player_id:
            raise ValueError(f"state is seat {state.player_id}, encoder is seat {enc.player_id}")
        v3, mask = state.encode_obs(3, bool(at_kan_select))
        obs = np.zeros((OBS_CHANNELS_V4, 34), dtype=np.float32)
        repack_v3(v3, state.scores, state.honba, state.kyotaku, obs)
        cache = enc._sp_cache
        if cache is not None and cache[0] == enc.events_seen:
            obs[SP_START:] = cache[1]
            return obs, mask, False
        last = self._last
        if last is not None and last[0] == id(enc) and last[1] == enc.events_seen:
            self._pending.append((obs, last[2], tag))
            return obs, mask, True
        ctx = enc._context(state)
        job = enc._sp_job(state, ctx)
        if job is None:
            enc._fill_sp(state, ctx, None, obs)
            enc._sp_cache = (enc.events_seen, obs[SP_START:].copy())
            return obs, mask, False
        calc, args, last_tsumo = job
        # checked now, so a bad hand is reported at its own decision
        self._jobs.append((calc, calc.core_args(*args), args[6] <= SHANTEN_THRES, last_tsumo,
                           state.last_cans.can_discard))
        self._last = (id(enc), enc.events_seen, len(self._jobs) - 1)
        self._pending.append((obs, len(self._jobs) - 1, tag))
        return obs, mask, True

    def flush(self, background: bool = False) -> list:
        """Run the pending searches and fill their rows; returns ``[(obs, tag)]`` of the decisions
        finished, in ``encode`` order.

        ``background=False``: every decision encoded so far is finished (nothing is pending after).
        ``background=True``: the pending searches start in a background thread (they release the
        interpreter lock, so encoding goes on meanwhile) and only the batch started by the
        previous background flush is returned (waited for). Raises ``DeferredSPError`` (a
        ``ValueError`` naming the bad decision's tag) if the core rejects a hand; an error of a
        background batch is raised by the next flush, which then drops what is pending.
        """
        out = self._wait()
        jobs, pending = self._jobs, self._pending
        self._jobs, self._pending, self._last = [], [], None
        if not pending:
            return out
        threads = int(sp_threads() if self.threads is None else self.threads)
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
        thread, box = self._inflight
        self._inflight = None
        thread.join()
        if "error" in box:
            self._jobs, self._pending, self._last = [], [], None
            raise box["error"]
        return box["out"]


def _run_deferred(jobs, pending, threads: int) -> list:
    """The searches of ``DeferredSP`` ``jobs`` in one core call; fills the rows of ``pending``, returns
    ``[(obs, tag)]``."""
    core = require_core()
    try:
        raw = core.sp_calc_batch([j[1] for j in jobs], threads)
    except ValueError:
        # name the decision of the first bad hand, as a search at its own decision would have
        for k, j in enumerate(jobs):
            try:
                core.sp_calc_batch([j[1]], 1)
            except ValueError as e:
                tag = next(t for _, kk, t in pending if kk == k)
                raise DeferredSPError(str(e), tag) from None
        raise
    rows = []
    scratch = np.zeros((OBS_CHANNELS_V4, 34), dtype=np.float32)
    for (_, _, by_ev, last_tsumo, can_discard), r in zip(jobs, raw):
        tables = sort_candidates(sp_candidates(r), by_ev)
        if last_tsumo is not None:  # accepted riichi: the one candidate is the drawn tile
            tables[0].tile = last_tsumo
        scratch[SP_START:] = 0.0
        fill_sp_tables(tables, can_discard, scratch)
        rows.append(scratch[SP_START:].copy())
    out = []
    for obs, k, tag in pending:
        obs[SP_START:] = rows[k]
        out.append((obs, tag))
    return out
