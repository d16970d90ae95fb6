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

Cost: the SP search is pure Python; a 1-2 shanten hand takes ~0.1-2 s and a
3 shanten hand can take far longer (see bench/obs_v4.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np

from mortal.features.mjai import ACTOR_EVENTS, check_tile, check_tiles, field, field_tile, field_tiles, is_seat
from mortal.features.sp.agari import Hand, agari
from mortal.features.sp.calc import (HAVE_CORE, MAX_TSUMOS_LEFT, SHANTEN_THRES, SPCalculator, best_by_required,
                                     calc_batch, deaka, next_tile, sort_candidates)
from mortal.features.sp.calc import _candidates as sp_candidates, _require_core as _sp_core
from mortal.features.sp.point import yaku_point, yakuman_point
from mortal.features.sp.shanten import calc_all
from mortal.features.tile import tile_id

logger = logging.getLogger('mortal.obs_v4')  # the name before the package split (log format)

OBS_CHANNELS_V3 = 934
OBS_CHANNELS_V4 = 1012
MAX_NUM_TURNS = MAX_TSUMOS_LEFT  # 17

# (name, v4 start, v3 start or None, rows) for rows 1-23, in the order of Mortal's ``obs_repr.rs``.
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
SP_EV = SP_START                       # 2 rows
SP_REQUIRED = SP_START + 2             # 68 rows (3n+2) / row +69 (3n+1)
SP_BEST = SP_START + 70                # 1 row (3n+2), then 1 empty row
SP_TABLE = SP_START + 72               # 3 x 17 rows: tenpai, win, EV
_ACTOR_TYPES = ACTOR_EVENTS - {"hora"}  # the events whose actor the encoder reads
MAX_DORA_INDICATORS = 5  # the first plus one per kan, at most 4 kans (Tenhou rule)

#: Threads ``encode_batch`` runs single-player searches on by default (compiled core
#: only; the searches release the interpreter lock); None: min(8, CPU count). Entry
#: points set it at start-up from ``MORTAL_SP_THREADS`` (``mortal.entry.start``): set
#: that lower when several clients share a machine.
SP_THREADS = None

_warned_no_core = False


def _warn_if_no_core() -> None:
    global _warned_no_core
    if not HAVE_CORE and not _warned_no_core:
        _warned_no_core = True
        logger.warning("the compiled single-player core (mortal.features.sp._core) is not built: version 4 runs the "
                       "pure-Python single-player search, about 50x slower; run bash scripts/setup.sh (needs g++ and "
                       "the Python headers)")


def _tid(name: str) -> int:
    return tile_id(name)


class V4Encoder:
    """Per-seat v4 observation encoder; feed it every mjai event the seat's ``PlayerState`` gets.

    Args:
        player_id: absolute seat 0-3.
    """

    def __init__(self, player_id: int):
        if type(player_id) is not int or not 0 <= player_id <= 3:
            raise ValueError(f"player_id must be 0-3, got {player_id!r}")
        _warn_if_no_core()
        self.player_id = player_id
        self._reset()

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

    # -- event tracking ------------------------------------------------------
    def _witness(self, tid: int):
        if 34 <= tid <= 36:
            self.akas_seen[tid - 34] = True

    def update(self, event) -> None:
        """Track one mjai event (dict or JSON text), in the order ``PlayerState.update`` gets them.

        Unknown event types are ignored. Every field the encoder reads is checked
        before any state changes, so a rejected event leaves the encoder as it was.
        An event of a log ``mortal.data.mjai_log.parse_log`` accepted can go to ``update_parsed``,
        which leaves out the checks that reader made.

        Raises:
            TypeError: ``event`` is not a JSON object.
            ValueError: bad JSON text, a missing field, an ``actor`` that is not a seat
                0-3, a tile field that is not an mjai tile name (or is ``'?'`` where the
                tile must be known: dora markers and own call tiles), or a dora
                indicator beyond ``MAX_DORA_INDICATORS`` in one kyoku. Messages name
                the event type and the field.
        """
        if isinstance(event, (str, bytes)):
            event = json.loads(event)
        if not isinstance(event, dict):
            raise TypeError(f"an mjai event must be a JSON object, got {type(event).__name__}")
        # What mortal.data.mjai_log checks of every event (with this encoder's messages); update_parsed the rest.
        kind = event.get("type")
        if kind in _ACTOR_TYPES:
            actor = field(event, kind, "actor")
            if not is_seat(actor):
                raise ValueError(f"{kind} event: field 'actor': expected a seat 0-3, got {actor!r}")
        elif kind == "start_kyoku":
            hands = field(event, kind, "tehais")
            if not isinstance(hands, list) or len(hands) != 4:
                raise ValueError(f"{kind} event: field 'tehais': expected 4 lists of tile names")
        self.update_parsed(event)

    def update_parsed(self, event: dict) -> None:
        """``update`` for an event of a log ``mortal.data.mjai_log.parse_log`` accepted (the loader's path).

        The event is a dict whose ``actor`` is a seat where its type has one and whose
        ``start_kyoku`` has 4 ``tehais``: those are not checked again. The tile fields
        (which the reader does not read) are checked as in ``update``, before any state
        changes; raises ``ValueError`` as ``update`` does for them.
        """
        kind = event.get("type")  # update passes on events of any type (those unknown are ignored)
        me = self.player_id
        mine = kind in _ACTOR_TYPES and event["actor"] == me
        # parse the tile fields first: nothing below may fail half way
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
            tiles = field_tiles(event, kind, "consumed", known=mine)
            if mine and kind != "ankan":
                pai = field_tile(event, kind, "pai", known=True)

        self.events_seen += 1
        if self.pending_kakan:
            # Mortal drops ippatsu at the event after a kakan (chankan chance over).
            self.pending_kakan = False
            self.at_ippatsu = False
        if kind == "start_kyoku":
            self._reset()
            self.dora_indicators.append(pai)
            self._witness(pai)
            for t in tiles:
                self._witness(t)
        elif kind == "tsumo":
            self.tiles_left -= 1
            if mine:
                self._witness(pai)
        elif kind == "dahai":
            if mine:
                self.at_rinshan = False
                self.at_ippatsu = False
                self.can_w_riichi = False
            else:
                self._witness(pai)
        elif kind in ("chi", "pon", "daiminkan"):
            if mine:
                self.own_fuuro_tiles += tiles + [pai]
                if kind == "daiminkan":
                    self.at_rinshan = True
            else:
                for t in tiles:
                    self._witness(t)
                self.can_w_riichi = False
                self.at_ippatsu = False
        elif kind == "kakan":
            if mine:
                self.own_fuuro_tiles.append(pai)
                self.at_rinshan = True
            else:
                self._witness(pai)
                self.pending_kakan = True
        elif kind == "ankan":
            self.can_w_riichi = False
            self.at_ippatsu = False
            if mine:
                self.own_fuuro_tiles += tiles
                self.at_rinshan = True
            else:
                for t in tiles:
                    self._witness(t)
        elif kind == "dora":
            self.dora_indicators.append(pai)
            self._witness(pai)
        elif kind == "reach":
            if mine:
                self.is_w_riichi = self.can_w_riichi
        elif kind == "reach_accepted":
            if mine:
                self.at_ippatsu = True

    # -- encoding ------------------------------------------------------------
    def encode(self, state, at_kan_select: bool = False) -> tuple:
        """``(obs (1012, 34) float32, mask (46,) bool)`` for ``state`` (a ``PlayerState``).

        The single-player rows are computed once per decision: a second call
        before the next ``update`` (the kan-select pass) reuses them.
        Raises ValueError if ``state`` belongs to another seat.
        """
        return encode_batch([(self, state, at_kan_select)], threads=1)[0]

    def _context(self, state):
        """Facts shared by the SP block and the fallback value."""
        tehai = list(state.tehai)
        akas = list(state.akas_in_hand)
        chis, pons = list(state.chis), list(state.pons)
        minkans, ankans = list(state.minkans), list(state.ankans)
        is_menzen = not (chis or pons or minkans)
        factor = [0] * 34
        for ind in self.dora_indicators:
            factor[next_tile(ind)] += 1
        doras_owned = (sum(tehai[t] * factor[t] for t in range(34)) + sum(akas)
                       + sum(factor[deaka(t)] + (t >= 34) for t in self.own_fuuro_tiles))
        return tehai, akas, chis, pons, minkans, ankans, is_menzen, factor, doras_owned

    def _fill_sp(self, state, ctx, tables, obs) -> None:
        """Fill rows 889-1011 of ``obs`` (rows assumed zero) from the sorted ``tables`` (None: fallback)."""
        cans = state.last_cans
        if tables is None:
            value = self.min_tsumo_agari(state, ctx)
            _encode_ev(obs, value)
            return
        _fill_sp_tables(tables, cans.can_discard, obs)

    def single_player_tables(self, state, ctx=None):
        """Sorted SP candidates, or None where Mortal's ``single_player_tables`` fails.

        Fails (None) when fewer than 4 tiles are left, the hand is complete, or
        no own draw remains. Follows ``agent_helper.rs`` (tsumos left, haitei,
        prefer riichi at >= 1000 points, double riichi, accepted-riichi discard).
        """
        job = self._sp_job(state, self._context(state) if ctx is None else ctx)
        return None if job is None else self._finish_tables(job, job[0].calc(*job[1]))

    def _sp_job(self, state, ctx):
        """``(SPCalculator, calc args, last tsumo or None)`` for this decision, or None (no search)."""
        tehai, akas, chis, pons, minkans, ankans, is_menzen, factor, doras_owned = ctx
        tehai, akas = list(tehai), list(akas)
        cans = state.last_cans
        tiles_left = self.tiles_left
        if tiles_left < 4:
            return None
        len_div3 = 4 - len(chis) - len(pons) - len(minkans) - len(ankans)
        can_discard = cans.can_discard
        if can_discard:
            cur_shanten = calc_all(tehai, len_div3)
        else:
            cur_shanten = max(calc_all(tehai, len_div3), 0)
        if cur_shanten < 0:
            return None
        if can_discard:
            tsumos_left, haitei = tiles_left // 4, tiles_left % 4 == 0
        else:
            target = (cans.target_actor - self.player_id) % 4
            nxt = max(tiles_left - (4 - target), 0)
            tsumos_left, haitei = nxt // 4, nxt % 4 == 0
        if tsumos_left < 1:
            return None
        if is_menzen and not ankans:
            in_fuuro = 0
        else:
            in_tehai = sum(tehai[next_tile(i)] for i in self.dora_indicators)
            in_fuuro = doras_owned - in_tehai - sum(akas)
        riichi_discard = can_discard and state.self_riichi_accepted
        last_tsumo = None
        if riichi_discard:
            last_tsumo = _tid(state.last_self_tsumo())
            tehai[deaka(last_tsumo)] -= 1
            if last_tsumo >= 34:
                akas[last_tsumo - 34] = False
            can_discard = False
        calc = SPCalculator(
            tehai_len_div3=len_div3, chis=chis, pons=pons, minkans=minkans, ankans=ankans,
            bakaze=state.bakaze, jikaze=state.jikaze, is_menzen=is_menzen,
            num_doras_in_fuuro=in_fuuro, dora_indicators=self.dora_indicators,
            calc_double_riichi=cans.can_discard and state.can_w_riichi,
            calc_haitei=haitei, prefer_riichi=state.scores[0] >= 1000,
        )
        args = (tehai, akas, list(state.tiles_seen), self.akas_seen, can_discard,
                min(tsumos_left, MAX_TSUMOS_LEFT), cur_shanten)
        return calc, args, last_tsumo

    @staticmethod
    def _finish_tables(job, tables):
        if job[2] is not None:  # accepted riichi: the one candidate is the drawn tile
            tables[0].tile = job[2]
        return tables

    def min_tsumo_agari(self, state, ctx=None) -> float:
        """Tsumo total of winning now without uradora (Mortal ``agari_points(can_ron, [])``), else 0."""
        if ctx is None:
            ctx = self._context(state)
        tehai, akas, chis, pons, minkans, ankans, is_menzen, factor, doras_owned = ctx
        tehai = list(tehai)
        cans = state.last_cans
        is_ron = cans.can_ron_agari
        if not (is_ron or cans.can_tsumo_agari):
            return 0.0
        is_oya = state.is_oya
        if not is_ron and state.can_w_riichi:
            return float(yakuman_point(is_oya, 1).tsumo_total(is_oya))
        name = state.last_kawa_tile() if is_ron else state.last_self_tsumo()
        if name is None:
            return 0.0
        win = _tid(name)
        riichi = state.self_riichi_accepted
        chankan = self.pending_kakan and is_ron
        ippatsu = self.at_ippatsu and not (self.pending_kakan and not is_ron)
        last = self.tiles_left == 0
        if is_ron:
            extra = riichi + self.is_w_riichi + ippatsu + last + chankan
            tehai[deaka(win)] += 1
            doras_owned += factor[deaka(win)] + (win >= 34)
        else:
            extra = (riichi + self.is_w_riichi + ippatsu + is_menzen
                     + (last and not self.at_rinshan) + self.at_rinshan)
        hand = Hand(tuple(tehai), is_menzen, tuple(chis), tuple(pons), tuple(minkans),
                    tuple(ankans), state.bakaze, state.jikaze, deaka(win), is_ron)
        y = agari(hand, int(extra), doras_owned)
        if y is None:
            return 0.0
        return float(yaku_point(is_oya, y).tsumo_total(is_oya))


def sp_threads() -> int:
    """Default thread count of ``encode_batch``: ``SP_THREADS`` if set, else min(8, CPU count)."""
    if SP_THREADS is not None:
        return SP_THREADS
    return max(1, min(8, os.cpu_count() or 1))


def prepare_sp(pairs, threads: int | None = None) -> None:
    """Compute the single-player rows of each ``(encoder, state)`` decision and keep them
    in the encoder (``encode`` and ``encode_batch`` then reuse them until its next ``update``).

    Decisions already prepared are skipped; the others are searched together on the
    compiled core on up to ``threads`` threads (default ``sp_threads()``), or one by
    one in Python when it is not built. Safe to run in a background thread while
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
    if HAVE_CORE and jobs:
        results = calc_batch([(calc, args) for calc, args, _ in jobs], sp_threads() if threads is None else threads)
    else:
        results = [calc.calc(*args) for calc, args, _ in jobs]
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
    The arrays are bit for bit those of ``V4Encoder.encode``. Without the compiled core every
    search runs at once in Python (nothing is ever pending).

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
        if job is None or not HAVE_CORE:
            tables = None if job is None else V4Encoder._finish_tables(job, job[0].calc(*job[1]))
            enc._fill_sp(state, ctx, tables, obs)
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
    core = _sp_core()
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
        _fill_sp_tables(tables, can_discard, scratch)
        rows.append(scratch[SP_START:].copy())
    out = []
    for obs, k, tag in pending:
        obs[SP_START:] = rows[k]
        out.append((obs, tag))
    return out


def _fill_sp_tables(tables, can_discard: bool, obs) -> None:
    """Rows 889-1011 of ``obs`` (assumed zero) from the sorted, non-empty SP ``tables``."""
    max_ev = tables[0].exp_values[0] if tables[0].exp_values else 0.0
    _encode_ev(obs, max_ev)
    if can_discard:
        for c in tables:
            row = SP_REQUIRED + (34 if c.shanten_down else 0) + deaka(c.tile)
            for r, _ in c.required_tiles:
                obs[row, r] = 1.0
        obs[SP_BEST, deaka(best_by_required(tables).tile)] = 1.0
    else:
        for r, _ in tables[0].required_tiles:
            obs[SP_REQUIRED + 69, r] = 1.0
    scale = 0.0 if max_ev < 1.0 else 1.0 / max_ev
    _encode_sp_table(obs, tables, can_discard, scale)


def repack_v3(v3: np.ndarray, scores, honba: int, kyotaku: int, out: np.ndarray) -> None:
    """Write v4 rows 0-888 into ``out`` (1012, 34) from a v3 array (934, 34) and getters.

    ``scores``: 4 ints, self first (``PlayerState.scores``).
    """
    if v3.shape != (OBS_CHANNELS_V3, 34):
        raise ValueError(f"expected a v3 observation (934, 34), got {v3.shape}")
    for name, start, src, n in ROW_TABLE:
        if src is not None:
            out[start:start + n] = v3[src:src + n]
    for p, s in enumerate(scores):
        out[7 + 2 * p] = v3[7 + 10 * p]
        out[8 + 2 * p] = min(max(s, 0), 30000) / 30000.0
    out[23] = min(honba, 10) / 10.0
    out[24] = min(kyotaku, 10) / 10.0
    for p in range(4):
        out[718 + p] = v3[752 + 3 * p]


def _encode_ev(obs, value: float) -> None:
    obs[SP_EV] = min(max(value, 0.0), 100000.0) / 100000.0
    obs[SP_EV + 1] = min(max(value, 0.0), 30000.0) / 30000.0


def _encode_sp_table(obs, tables, can_discard: bool, scale: float) -> None:
    first = tables[0]
    if not first.tenpai_probs or not first.tenpai_probs[0] > 0.0:
        return  # probabilities not computed (shanten >= 4) or all zero
    cands = tables if can_discard else [first]
    for c in cands:
        col = deaka(c.tile) if can_discard else slice(None)
        tp = np.asarray(c.tenpai_probs)
        n = len(tp) if (tp > 0.0).all() else int(np.argmin(tp > 0.0))  # turns up to the first zero
        if n == 0:
            continue
        obs[SP_TABLE:SP_TABLE + n, col] = tp[:n, None] if not can_discard else tp[:n]
        wp = np.asarray(c.win_probs[:n])
        ev = np.minimum(np.asarray(c.exp_values[:n]) * scale, 1.0)
        rows = slice(SP_TABLE + MAX_NUM_TURNS, SP_TABLE + MAX_NUM_TURNS + n)
        obs[rows, col] = wp[:, None] if not can_discard else wp
        rows = slice(SP_TABLE + 2 * MAX_NUM_TURNS, SP_TABLE + 2 * MAX_NUM_TURNS + n)
        obs[rows, col] = ev[:, None] if not can_discard else ev
