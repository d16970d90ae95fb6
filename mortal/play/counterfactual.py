"""Counterfactual branches: a game's table cloned at one of the challenger's decisions, where it takes another
action, played out to the end of that kyoku. ``fork`` makes one, ``_Branch`` plays it."""

from __future__ import annotations

import json
import logging
import math
import random

from mjai.mlibriichi.state import PlayerState

from mortal.features.action import CHI_LOW, KAN, PASS, RIICHI, action_kind, event_to_label
from mortal.features.tile import deaka, tile_id
from mortal.play.agent import reaction_from_index
from mortal.play.game import SPLITS, ArenaError, StatePanic, _feed, _Game
from mortal.play.kyoku_flow import final_scores, kyoku_result_from_events, next_kyoku
from mortal.play.log_writer import REACTION_TYPES, kyoku_results

logger = logging.getLogger('mortal.arena')  # the name before the package split (log format)


def kind_group(index: int) -> str:
    """``action_kind(index)`` with chi and pon as one group, 'call' (a pon's other kind is the pass, not a chi).
    Raises ValueError for an index outside 0-45."""
    kind = action_kind(index)
    return "call" if kind in ("chi", "pon") else kind


def _legal_q(meta: dict) -> list | None:
    """``[(index, Q), ...]`` of a decision's meta (its legal actions in index order), or None when its mask bits
    and Q values disagree or a Q value is not a finite number."""
    bits = meta.get("mask_bits")
    q = meta.get("q_values")
    if not isinstance(bits, int) or not isinstance(q, list):
        return None
    legal = [i for i in range(46) if bits >> i & 1]
    if len(legal) != len(q) or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in q):
        return None
    return list(zip(legal, q))


def _best(pairs) -> int | None:
    """The index of the highest Q of ``(index, Q)`` pairs in index order (ties to the lower index), None if none."""
    best = max(pairs, key=lambda p: p[1], default=None)  # max keeps the first of equal keys
    return None if best is None else best[0]


def counterfactual_action(meta: dict, taken: int, *, other_kind: bool = False) -> int | None:
    """The legal action (index 0-45) of ``meta`` with the highest Q other than ``taken``; with ``other_kind``, only
    among those of another ``kind_group``. Ties to the lower index; None without one, or for a meta whose Q
    values are not finite numbers."""
    pairs = _legal_q(meta)
    if pairs is None:
        return None
    return _best((i, v) for i, v in pairs
                 if i != taken and not (other_kind and kind_group(i) == kind_group(taken)))


CONTESTED_KINDS = ("riichi->dama", "dama->riichi", "call->pass", "pass->call", "push->fold", "fold->push")


def contested_action(meta: dict, taken: int, safe: frozenset | None = None) -> tuple[str, int] | None:
    """The alternative of a contested decision: ``(kind, action)`` with ``kind`` one of ``CONTESTED_KINDS`` and
    ``action`` a legal index 0-45 of ``meta``, or None when the decision is not contested or has no alternative.

    * riichi legal (37): riichi taken -> the highest-Q discard (0-36), 'riichi->dama'; a discard taken -> riichi,
      'dama->riichi';
    * a call offered (the pass 45 and a chi, pon or daiminkan 38-42 legal): a call taken -> the pass,
      'call->pass'; the pass taken -> the highest-Q call, 'pass->call';
    * else a discard taken while an opponent's riichi is accepted (``safe``: the tile kinds 0-33 that are genbutsu
      against every such opponent, ``riichi_genbutsu``; None when there is none): an unsafe tile taken -> the
      highest-Q safe discard, 'push->fold'; a safe tile taken -> the highest-Q unsafe discard, 'fold->push'.

    Any other decision (an ordinary discard, a kan, a hora) is not contested."""
    pairs = _legal_q(meta)
    if pairs is None:
        return None
    legal = {i for i, _ in pairs}
    if RIICHI in legal:
        if taken == RIICHI:
            kind, alt = "riichi->dama", _best((i, v) for i, v in pairs if i < RIICHI)
        elif taken < RIICHI:
            kind, alt = "dama->riichi", RIICHI
        else:
            return None
    elif PASS in legal and any(CHI_LOW <= i <= KAN for i in legal):
        if CHI_LOW <= taken <= KAN:
            kind, alt = "call->pass", PASS
        elif taken == PASS:
            kind, alt = "pass->call", _best((i, v) for i, v in pairs if CHI_LOW <= i <= KAN)
        else:
            return None
    elif safe is not None and taken < RIICHI:
        taken_safe = deaka(taken) in safe
        kind = "fold->push" if taken_safe else "push->fold"
        alt = _best((i, v) for i, v in pairs if i < RIICHI and i != taken and (deaka(i) in safe) != taken_safe)
    else:
        return None
    return None if alt is None else (kind, alt)


def riichi_genbutsu(events, seat: int) -> frozenset | None:
    """The tile kinds (0-33, red fives as plain) that are genbutsu against every opponent of ``seat`` whose riichi
    is accepted, from one seat's events of the kyoku (mjai JSON text or dicts, in order): a kind is safe against
    such an opponent when the opponent discarded it this kyoku, or anyone discarded it after the opponent's
    ``reach_accepted`` (no ron came, else the kyoku would have ended). None when no opponent's riichi is accepted.
    A simple rule: no suji, no kabe, no tiles safe by counting."""
    if all(isinstance(ev, str) and '"reach_accepted"' not in ev for ev in events):
        return None  # most discards: nobody's riichi, nothing to parse
    discards = [set() for _ in range(4)]
    passed: dict[int, set] = {}  # riichi opponent -> kinds discarded after its riichi
    for ev in events:
        if isinstance(ev, str):
            if '"dahai"' not in ev and '"reach_accepted"' not in ev:
                continue
            ev = json.loads(ev)
        ty = ev.get("type")
        if ty == "dahai":
            k = deaka(tile_id(ev["pai"]))
            discards[ev["actor"]].add(k)
            for s in passed.values():
                s.add(k)
        elif ty == "reach_accepted" and ev["actor"] != seat:
            passed.setdefault(ev["actor"], set())
    if not passed:
        return None
    return frozenset.intersection(*(frozenset(discards[o] | p) for o, p in passed.items()))


class _Branch(_Game):
    """A clone of a ``_Game``'s table on which the challenger took another action, played by the same agents in
    the same batches to the end of that kyoku; its seats' states are rebuilt from their events. The outcome goes
    into the real decision's meta as ``meta["counterfactual"]``: ``{"action": a, "next": [kyoku_index, honba,
    kyotaku, s0, s1, s2, s3]}`` when the hanchan would go on, ``{"action": a, "final": [s0, s1, s2, s3]}`` when it
    would end. A branch writes no log and never branches itself."""

    def __init__(self, parent: _Game, seat: int, meta: dict, action: int, actions: dict):
        self.gid = -1  # given by the arena loop
        self.parent, self.seat, self.meta, self.action = parent, seat, meta, action
        self.kind = None  # the contested kind (CONTESTED_KINDS) under 'contested', set by fork
        self.nonce, self.key, self.split = parent.nonce, parent.key, parent.split
        self.agents = parent.agents
        self.v4_seats = [False] * 4
        self.encoders = [None] * 4
        self.flow = parent.flow
        self.history = [list(h) for h in parent.history]
        self.states = [PlayerState(s) for s in range(4)]
        for s, st in enumerate(self.states):
            _feed(s, st, None, self.history[s])
        self.spec = None
        self.done = self.cancelled = False
        self.meta_queue = [[] for _ in range(4)]
        self.guard, self.queues, self.waiting, self.decided, self.spec_decided = parent.guard, parent.queues, 0, {}, {}
        self.fork = None
        self.new_branches = []
        self.env = parent.env.clone()
        self.obs = self.env.step(actions)
        self.substeps = parent.substeps + 1
        if self.env.done():
            self._end_kyoku()
        elif not self.obs:
            raise ArenaError(f"{self.label()}: a counterfactual branch's table stopped answering")

    def label(self, seat=None) -> str:
        return f"{super().label(seat)} (counterfactual branch)"

    def cancel(self) -> None:
        """Drop the branch: its decision was not executed; nothing is recorded."""
        self.cancelled = True
        self.meta.pop("counterfactual", None)
        self._close()

    def _close(self) -> None:
        self.done = True
        self.obs = {}
        self.env = None
        self.parent.branches.discard(self)

    def _end_kyoku(self):
        f = self.flow
        self.absorb(self.env.get_observations([0, 1, 2, 3]))  # the ended kyoku's last events
        out = next_kyoku(f, kyoku_result_from_events(kyoku_results(self.history), f.oya, self.states[f.oya].shanten))
        if out.next is None:
            record = {"action": self.action, "final": final_scores(out.scores, out.kyotaku)}
        else:
            n = out.next
            record = {"action": self.action, "next": [n.kyoku_index, n.honba, n.kyotaku, *n.scores]}
        if not self.cancelled:
            self.meta["counterfactual"] = record
        self._close()


def fork(self: _Game, decisions: dict, actions: dict, *, rate: float, rng: random.Random, other_kind: bool = False,
         contested: bool = False):
    """Maybe fork a branch of game ``self`` before its table takes ``actions``: with probability ``rate`` (from
    ``rng``), when the challenger acts by a logged reaction without a kan-select evaluation and has an
    alternative (``counterfactual_action``; with ``contested``, ``contested_action``, where a pass counts and a
    call the branch's table does not execute forks nothing). Returns the ``_Branch`` (also in the game's
    ``branches`` and ``new_branches``) or None."""
    seat = SPLITS.index(self.split)
    dec = decisions.get(seat)
    if dec is None or not isinstance(dec.meta, dict) or "kan_select" in dec.meta:
        return None
    rtype = dec.reaction.get("type")
    if rtype not in REACTION_TYPES and not (contested and rtype == "none"):
        return None
    taken = event_to_label(dec.reaction)
    if contested:
        bits = dec.meta.get("mask_bits")
        safe = None  # the genbutsu only for a discard that neither riichi nor a call makes contested
        if taken < RIICHI and isinstance(bits, int) and not bits >> RIICHI & 1 and not bits >> PASS & 1:
            safe = riichi_genbutsu(self.history[seat], seat)
        kind, alt = contested_action(dec.meta, taken, safe) or (None, None)
    else:
        kind, alt = None, counterfactual_action(dec.meta, taken, other_kind=other_kind)
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
    branch.kind = kind
    if kind == "pass->call" and (branch.done or seat not in branch.obs):
        branch.cancel()  # the call was not executed: the branch would replay the pass
        return None
    if rtype == "none":  # logged on the answered event, its last in the seat's view (views are index-aligned)
        self.pass_metas[seat].append((len(self.history[seat]) - 1, {"actor": seat, "meta": dec.meta}))
    if not branch.done:  # a branch whose kyoku ended at once has recorded already
        self.branches.add(branch)
    self.new_branches.append(branch)
    return branch
