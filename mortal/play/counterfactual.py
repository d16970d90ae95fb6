"""Counterfactual branches: a real game's table cloned at one of the challenger's decisions, where it takes
another action, played out to the end of that kyoku (``OneVsThree``'s ``counterfactual_rate``, ``mortal.data``'s
paired target). ``fork`` makes one, ``_Branch`` plays it, ``counterfactual_action`` picks its action.
"""

from __future__ import annotations

import logging
import math
import random

from mjai.mlibriichi.state import PlayerState

from mortal.features.action import action_kind, event_to_label
from mortal.play.agent import reaction_from_index
from mortal.play.game import SPLITS, ArenaError, StatePanic, _feed, _Game
from mortal.play.kyoku_flow import final_scores, kyoku_result_from_events, next_kyoku
from mortal.play.log_writer import REACTION_TYPES, kyoku_results

logger = logging.getLogger('mortal.arena')  # the name before the package split (log format)


def kind_group(index: int) -> str:
    """The kind of Mortal's action ``index`` (``mortal.features.action.action_kind``) with chi and pon as one
    group, 'call': what 'other kind' means for a counterfactual branch (a pon's other kind is the pass, not a
    chi). Raises ValueError for an index outside 0-45."""
    kind = action_kind(index)
    return "call" if kind in ("chi", "pon") else kind


def counterfactual_action(meta: dict, taken: int, *, other_kind: bool = False) -> int | None:
    """The action a counterfactual branch forces: the legal action (Mortal index 0-45, legal in
    ``meta["mask_bits"]``) with the highest Q in ``meta["q_values"]`` (the legal actions' Q in index order,
    ``mortal.play.agent.batch_meta_parts``) other than ``taken``; with ``other_kind``, only among the actions of another
    kind group than ``taken`` (``kind_group``: the pass for a call, riichi for a discard, a discard for a riichi;
    never one discard for another, nor a chi for a pon). Ties to the lower index; None without one, or for a meta
    whose Q values are not finite numbers.
    """
    bits = meta.get("mask_bits")
    q = meta.get("q_values")
    if not isinstance(bits, int) or not isinstance(q, list):
        return None
    legal = [i for i in range(46) if bits >> i & 1]
    if len(legal) != len(q) or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in q):
        return None
    best = None
    for i, v in zip(legal, q):
        if i == taken or (other_kind and kind_group(i) == kind_group(taken)):
            continue
        if best is None or v > best[1]:
            best = (i, v)
    return None if best is None else best[0]


class _Branch(_Game):
    """A counterfactual branch of a real ``_Game``: a clone of its table on which the challenger took another
    action at one decision, played by the same agents to the end of that kyoku (in the arena's lock-step loop,
    batched with the real games). Each seat's ``PlayerState`` is rebuilt from the seat's events of the kyoku
    (``history``, as ``speculate``). When the kyoku ends, the outcome is written into the real decision's meta as
    ``meta["counterfactual"]``: ``{"action": a, "next": [kyoku_index, honba, kyotaku, s0, s1, s2, s3]}`` when the
    hanchan would go on, ``{"action": a, "final": [s0, s1, s2, s3]}`` (``final_scores``) when it would end.
    The branch writes no log and never branches itself."""

    def __init__(self, parent: _Game, seat: int, meta: dict, action: int, actions: dict):
        self.gid = -1  # given by the arena loop
        self.parent, self.seat, self.meta, self.action = parent, seat, meta, action
        self.nonce, self.key, self.split = parent.nonce, parent.key, parent.split
        self.agents, self.names = parent.agents, parent.names
        self.v4_seats = [False] * 4
        self.encoders = [None] * 4
        self.flow = parent.flow
        self.lines = []
        self.history = [list(h) for h in parent.history]
        self.states = []
        for s in range(4):
            st = PlayerState(s)
            for ev in self.history[s]:
                _feed(s, st, None, ev)
            self.states.append(st)
        self.spec = None
        self.done = self.cancelled = False
        self.failed = None
        self.scores = self.ranks = None
        self.substeps = parent.substeps
        self.meta_queue = [[] for _ in range(4)]
        self.guard, self.queues, self.waiting, self.decided, self.spec_decided = parent.guard, parent.queues, 0, {}, {}
        self.fork = None
        self.branches, self.new_branches = set(), []
        self.env = parent.env.clone()
        self.obs = self.env.step(actions)
        self.substeps += 1
        if self.env.done():
            self._end_kyoku()
        elif not self.obs:
            raise ArenaError(f"{self.label()}: a counterfactual branch's table stopped answering")

    def label(self, seat=None) -> str:
        return f"{super().label(seat)} (counterfactual branch)"

    def cancel(self) -> None:
        """Drop the branch: its decision was not executed; nothing is recorded."""
        self.cancelled = self.done = True
        self.meta.pop("counterfactual", None)
        self.obs = {}
        self.env = None
        self.parent.branches.discard(self)

    def _end_kyoku(self):
        f = self.flow
        self._catch_up()
        out = next_kyoku(f, kyoku_result_from_events(kyoku_results(self.history), f.oya, self.states[f.oya].shanten))
        if out.next is None:
            record = {"action": self.action, "final": final_scores(out.scores, out.kyotaku)}
        else:
            n = out.next
            record = {"action": self.action, "next": [n.kyoku_index, n.honba, n.kyotaku, *n.scores]}
        if not self.cancelled:
            self.meta["counterfactual"] = record
        self.done = True
        self.obs = {}
        self.env = None
        self.parent.branches.discard(self)


def fork(self: _Game, decisions: dict, actions: dict, *, rate: float, rng: random.Random, other_kind: bool = False):
    """Maybe fork a counterfactual branch at this step, before the table takes ``actions`` (see
    ``OneVsThree``'s ``counterfactual_rate``) of the game ``self``: with probability ``rate`` (drawn from
    ``rng``), when the challenger seat acts here by a logged reaction (``REACTION_TYPES``) without a kan-select
    evaluation and has another legal action (of another kind with ``other_kind``), a clone of the table takes the
    other seats' same actions and the challenger's best such action (``counterfactual_action``). Returns the ``_Branch`` (also in the game's
    ``branches`` and ``new_branches``) or None."""
    seat = SPLITS.index(self.split)
    dec = decisions.get(seat)
    if dec is None or dec.reaction.get("type") not in REACTION_TYPES or not isinstance(dec.meta, dict) \
            or "kan_select" in dec.meta:
        return None
    taken = event_to_label(dec.reaction)
    alt = counterfactual_action(dec.meta, taken, other_kind=other_kind)
    # the draw comes after the eligibility: the rate is that of the decisions that have an alternative
    if alt is None or rng.random() >= rate:
        return None
    try:
        reaction = reaction_from_index(self.states[seat], alt)
    except ValueError:
        return None
    act = self.obs[seat].select_action_from_mjai(reaction)
    if act is None:
        return None
    try:
        branch = _Branch(self, seat, dec.meta, alt, {**actions, seat: act})
    except StatePanic as e:
        # the branch's own step broke a state: no branch (the real game is unaffected)
        logger.warning("%s (counterfactual branch): %s; no branch forked", self.label(), e)
        return None
    if not branch.done:  # a branch whose kyoku ended at once has recorded already
        self.branches.add(branch)
    self.new_branches.append(branch)
    return branch
