"""Per-seat batch agents for the arena (Mortal engines and mjai bots): one ``Decision`` per ``Scene``."""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from mortal.features.action import HORA, KAN, event_to_label, reaction_from_index
from mortal.features.obs import check_version, encode as _encode
from mortal.features.obs_v4 import encode_batch as encode_v4_batch
from mortal.features.tile import TILE_NAMES

logger = logging.getLogger('mortal.agent')  # the name before the package split (log format)

# PlayerState.bakaze is a tile id: E=27, S=28, W=29.
_BAKAZE_S, _BAKAZE_W = 28, 29
# lowest finite float: Mortal's agari guard puts this on q[43] before argmax
_LOWEST = float(np.finfo(np.float32).min)


class IllegalReaction(ValueError):
    """An agent chose an action its seat cannot take; ``game``/``seat`` say where."""

    def __init__(self, game: int, seat: int, message: str):
        super().__init__(message)
        self.game = game
        self.seat = seat


@dataclass(slots=True)
class Scene:
    """One pending decision of one seat in one game: ``events`` (masked mjai JSON since its previous scene),
    ``best_win_scores`` (agari guard), ``v4`` (the seat's ``V4Encoder`` or None), ``speculative``/``adopted``."""

    game: int
    seat: int
    state: Any
    events: list = field(default_factory=list)
    best_win_scores: Callable[[], Sequence[int]] | None = None
    v4: Any = None
    speculative: bool = False
    adopted: bool = False


@dataclass(slots=True)
class Decision:
    """An agent's answer to a ``Scene``: an mjai reaction dict and Mortal's ``meta`` (None without evaluation)."""

    reaction: dict
    meta: dict | None = None


def abs_scores(state) -> list[int]:
    """Absolute-seat scores (4 ints) from a ``PlayerState`` (whose ``scores`` start at itself)."""
    rel = state.scores
    pid = state.player_id
    return [rel[(s - pid) % 4] for s in range(4)]


def rank_of(scores: Sequence[int], seat: int) -> int:
    """0-based rank of ``seat``; ties go to the lower seat index (Mortal's rankings.rs)."""
    mine = scores[seat]
    return sum(1 for s, v in enumerate(scores) if v > mine or (v == mine and s < seat))


def is_all_last(state) -> bool:
    """S4 or any West kyoku (Mortal's ``is_all_last``, update.rs)."""
    return (state.bakaze == _BAKAZE_S and state.kyoku == 3) or state.bakaze == _BAKAZE_W


def rule_based_agari(state, best_win_scores: Callable[[], Sequence[int]] | None) -> bool:
    """Whether a rule-based player takes the hora now: False for an all-last win leaving it 4th, or no hora."""
    cans = state.last_cans
    if not cans.can_agari:
        return False
    seat = state.player_id
    scores = abs_scores(state)
    if not is_all_last(state) or state.is_oya or rank_of(scores, seat) < 3:
        return True
    if state.bakaze == _BAKAZE_W:
        if state.kyoku < 3:  # West but not W4: the game goes on anyway
            return True
    elif all(s < 30000 for s in scores):  # S4 and a West extension is still possible
        return True
    if best_win_scores is None:
        return True
    exp = list(best_win_scores())
    return all(s < 30000 for s in exp) or rank_of(exp, seat) < 3


_BIT = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))  # bit i of a mask word


def batch_meta_parts(q_values, masks) -> tuple[list, list]:
    """Mortal's ``q_values`` and ``mask_bits`` meta of N rows of A <= 64: ``(legal_q, bits)``, the legal
    Q values (floats, index order) and an int with bit j set iff action j is legal."""
    if len(masks) == 0:
        return [], []
    m = np.asarray(masks, dtype=bool)
    q = np.asarray(q_values, dtype=np.float64)
    flat = q[m].tolist()  # row-major: each row's legal values in index order
    ends = np.cumsum(m.sum(1)).tolist()
    bits = (m * _BIT[:m.shape[1]]).sum(1, dtype=np.uint64).tolist()
    return [flat[start:end] for start, end in zip([0, *ends], ends)], bits


def _quick_eval_cans(cans) -> bool:
    """Whether quick eval may apply to a seat with these ``last_cans``: a discard and no other own-turn choice."""
    return cans.can_discard and not (cans.can_riichi or cans.can_tsumo_agari or cans.can_ankan or cans.can_kakan
                                     or cans.can_ryukyoku)


def _quick_eval_batch(scenes, masks) -> list:
    """Per scene, its only legal discard when quick eval applies, else None. ``masks``: the scenes' (46,) bool
    masks (version 4: the version-3 mask, before any search, as Mortal; None for a scene quick eval skips)."""
    masks = [np.zeros(46, bool) if m is None else m for m in masks]
    out = [None] * len(scenes)
    if not scenes:
        return out
    discards = np.array(masks)[:, :37]  # np.array: 3x faster than np.stack on small rows
    for i in np.flatnonzero(discards.sum(1) == 1).tolist():  # the flags are read only for these
        if _quick_eval_cans(scenes[i].state.last_cans):
            out[i] = int(discards[i].argmax())
    return out


def _reaction(state, index: int, kan_select: int | None = None) -> dict:
    """``reaction_from_index`` of an index its mask allows; a discard built directly (the mask holds what
    ``reaction_from_index`` checks again: the tile in hand, kuikae, riichi's drawn tile)."""
    if index > 36:
        return reaction_from_index(state, index, kan_select=kan_select)
    pai = TILE_NAMES[index]
    return {"type": "dahai", "actor": state.player_id, "pai": pai, "tsumogiri": state.last_self_tsumo() == pai}


def _array_call(engine):
    """The engine's ``react_arrays`` when its class's ``react_batch`` is marked as its lists
    (``react_batch.lists_of_arrays``: the same answer, numpy arrays instead of lists); else ``react_batch``. A wrapper
    or subclass that defines its own ``react_batch`` is called through it."""
    if getattr(getattr(type(engine), "react_batch", None), "lists_of_arrays", False):
        return engine.react_arrays
    return engine.react_batch


class MortalBatchAgent:
    """Batch agent over a ``MortalEngine``-like object: at most one ``react_batch`` call per ``react``.
    ValueError for an oracle engine, ``UnsupportedVersionError`` for a version outside 1-4."""

    stateless = True

    def __init__(self, engine):
        if getattr(engine, "is_oracle", False):
            raise ValueError(f"engine {engine.name!r}: oracle engines are not supported in the arena")
        self.engine = engine
        self.name = engine.name
        self.version = check_version(engine.version)
        self.quick_eval = bool(getattr(engine, "enable_quick_eval", True))
        self.agari_guard = bool(getattr(engine, "enable_rule_based_agari_guard", False))
        self.decisions = 0  # scenes answered, quick eval included (bench/arena_floor.py's count per decision)

    def _encode_rows(self, rows) -> tuple[list, list]:
        """Observations and masks of ``rows``; version 4 encodes them in one batch (searches together)."""
        if self.version == 4:
            done = encode_v4_batch([(sc.v4, sc.state, kan) for sc, kan, _, _ in rows],
                                   v3s=[None if obs is None else (obs, mask) for _, _, obs, mask in rows])
        else:
            done = [(obs, mask) if obs is not None else sc.state.encode_obs(self.version, kan)
                    for sc, kan, obs, mask in rows]
        return [o for o, _ in done], [m for _, m in done]

    def react(self, scenes: Sequence[Scene]) -> list[Decision]:
        """Decide all ``scenes``; see the class docstring."""
        out: list[Decision | None] = [None] * len(scenes)
        self.decisions += len(scenes)
        # versions 1-3: every scene's main row now (quick eval reads its mask); version 4 searches in batch, and
        # quick eval's version-3 row of a scene it looks at goes into that batch rather than being encoded again
        if self.version != 4:
            first = [sc.state.encode_obs(self.version, False) for sc in scenes]
        elif self.quick_eval:
            first = [sc.state.encode_obs(3, False) if _quick_eval_cans(sc.state.last_cans) else (None, None)
                     for sc in scenes]
        else:
            first = [(None, None)] * len(scenes)
        only = _quick_eval_batch(scenes, [m for _, m in first]) if self.quick_eval else [None] * len(scenes)
        rows = []  # (scene, at_kan_select, obs or None, mask or None), in react_batch order
        plan = []  # (scene index, main row, kan-select row or None)
        for i, sc in enumerate(scenes):
            if only[i] is not None:
                out[i] = Decision(_reaction(sc.state, only[i]))
                continue
            main_row = len(rows)
            rows.append((sc, False) + first[i])
            cans = sc.state.last_cans
            kan_row = None
            if cans.can_ankan or cans.can_kakan:
                n_cand = len(sc.state.ankan_candidates()) + len(sc.state.kakan_candidates())
                if not self.quick_eval or n_cand > 1:
                    kan_row = len(rows)
                    rows.append((sc, True, None, None))
            plan.append((i, main_row, kan_row))
        if not plan:
            return out  # type: ignore[return-value]
        obs_list, masks = self._encode_rows(rows)
        n = len(masks)
        t0 = time.perf_counter_ns()
        actions, q_values, masks_used, is_greedy = _array_call(self.engine)(obs_list, masks, None)
        eval_ns = time.perf_counter_ns() - t0
        if len(actions) != n:
            raise RuntimeError(f"engine {self.name!r} returned {len(actions)} actions for {n} rows")
        q = np.asarray(q_values, dtype=np.float64)
        legal_q, bits = batch_meta_parts(q, masks_used)
        actions = np.asarray(actions, dtype=np.int64).tolist()
        is_greedy = np.asarray(is_greedy, dtype=bool).tolist()
        for i, main_row, kan_row in plan:
            t1 = time.perf_counter_ns()
            sc = scenes[i]
            st = sc.state
            action = actions[main_row]
            if action == HORA and self.agari_guard and not rule_based_agari(st, sc.best_win_scores):
                q_alt = q[main_row].copy()
                q_alt[HORA] = _LOWEST
                action = int(np.argmax(q_alt))
            kan_select = None
            if kan_row is not None and action == KAN:
                kan_select = actions[kan_row]
                if not 0 <= kan_select < 34 or not masks[kan_row][kan_select]:
                    raise IllegalReaction(sc.game, sc.seat, f"engine {self.name!r} chose kan tile {kan_select}, "
                                          "not a kan candidate")
            if not 0 <= action < len(masks[main_row]) or not masks[main_row][action]:
                raise IllegalReaction(sc.game, sc.seat, f"engine {self.name!r} chose illegal action {action}")
            reaction = _reaction(st, action, kan_select)
            shanten, furiten = int(st.shanten), bool(st.at_furiten)
            meta = {"q_values": legal_q[main_row], "mask_bits": bits[main_row],
                    "is_greedy": is_greedy[main_row], "shanten": shanten, "at_furiten": furiten,
                    "batch_size": n}
            if kan_row is not None:
                meta["kan_select"] = {"q_values": legal_q[kan_row], "mask_bits": bits[kan_row],
                                      "is_greedy": is_greedy[kan_row], "shanten": shanten,
                                      "at_furiten": furiten}
            meta["eval_time_ns"] = eval_ns + (time.perf_counter_ns() - t1)
            out[i] = Decision(reaction, meta)
        return out  # type: ignore[return-value]

    def end_game(self, game: int, seat: int) -> None:
        """Nothing is kept per game."""


def first_legal(state, mask) -> dict:
    """The reaction of the lowest legal action index in ``mask`` (46,) bool."""
    return reaction_from_index(state, int(np.flatnonzero(mask)[0]))


def legal_reaction(state, mask, reaction: dict) -> bool:
    """Whether ``reaction`` is legal under the mask and ``PlayerState.validate_reaction`` (which misses kuikae)."""
    if not isinstance(reaction, dict):
        return False
    ty = reaction.get("type")
    if ty != "none" and ty != "ryukyoku" and reaction.get("actor") != state.player_id:
        return False
    try:
        label = event_to_label(reaction)
    except ValueError:
        return False
    if label is None or not mask[label]:
        return False
    try:
        state.validate_reaction(json.dumps(reaction))
    except Exception:  # invalid tiles/targets; RuntimeError from Rust
        return False
    return True


IMPROVING_TILES_CACHE = 8192  # hands; one deal's four rotations see ~1,300 distinct ones (~2 KB each)


def cache_improving_tiles() -> None:
    """Memoize ``mjai.bot.base.find_improving_tiles`` per process (~85% of a RulebaseBot's time; the
    rotations of a duplicate deal repeat hands). Returns copies. Idempotent."""
    import mjai.bot.base as base
    original = base.find_improving_tiles
    if getattr(original, 'cached_original', None) is not None:
        return
    cached = functools.lru_cache(IMPROVING_TILES_CACHE)(lambda tehai: tuple((d, tuple(t)) for d, t in original(tehai)))

    def find_improving_tiles(tehai: str) -> list:
        return [(d, list(t)) for d, t in cached(tehai)]

    find_improving_tiles.cached_original = original
    find_improving_tiles.cache_info = cached.cache_info
    base.find_improving_tiles = find_improving_tiles


class MjaiBotAgent:
    """Batch agent over mjai bots, one per (game, seat); an illegal reaction becomes the first legal action."""

    def __init__(self, factory: Callable[[int], Any] | None = None, name: str = "rulebase"):
        from loguru import logger as mjai_logger
        if factory is None:
            from mjai.bot.rulebase import RulebaseBot as factory  # noqa: N813
        mjai_logger.disable("mjai")
        cache_improving_tiles()
        self.factory = factory
        self.name = name
        self.bots: dict[tuple[int, int], Any] = {}
        self.substitutions = 0

    def react(self, scenes: Sequence[Scene]) -> list[Decision]:
        """Ask each scene's bot; see the class docstring."""
        out = []
        for sc in scenes:
            key = (sc.game, sc.seat)
            bot = self.bots.get(key)
            if bot is None:
                bot = self.bots[key] = self.factory(sc.seat)
            raw = bot.react("[" + ",".join(sc.events) + "]")
            try:
                reaction = json.loads(raw)
            except (TypeError, ValueError):
                reaction = None
            _, mask = _encode(sc.state, 1, False)
            if not legal_reaction(sc.state, mask, reaction):
                self.substitutions += 1
                logger.debug("game %d seat %d: illegal bot reaction %s replaced", sc.game, sc.seat, raw)
                reaction = first_legal(sc.state, mask)
            out.append(Decision(reaction))
        return out

    def end_game(self, game: int, seat: int) -> None:
        """Drop the bot of a finished game."""
        self.bots.pop((game, seat), None)


def needs_v4_encoder(agent) -> bool:
    """Whether ``agent`` encodes observation version 4 (its scenes then need ``v4`` encoders)."""
    return getattr(agent, "version", None) == 4


def make_agent(x):
    """An arena agent from ``x``: an agent as is, an engine wrapped in ``MortalBatchAgent``; TypeError if neither."""
    if hasattr(x, "react") and hasattr(x, "end_game"):
        return x
    if hasattr(x, "react_batch"):
        return MortalBatchAgent(x)
    raise TypeError(f"not an engine (react_batch) or arena agent (react/end_game): {x!r}")
