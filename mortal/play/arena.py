"""One-vs-three arena: many hanchan in lock-step on ``riichienv`` tables.

Design: every game owns one ``riichienv.RiichiEnv``
played **one kyoku per reset** with an explicit wall derived from
(nonce, key, kyoku index, honba), so all four seat rotations of a nonce see the
same deal whenever they reach the same kyoku label (Mortal's duplicate property,
not Mortal's exact walls). Scores, honba and kyotaku are carried here and the
Tenhou hanchan flow (Mortal's ``libriichi/src/arena/game.rs``) is
applied by the pure function ``next_kyoku`` (``mortal.play.kyoku_flow``). Each seat has an
``mjai.mlibriichi`` ``PlayerState`` fed from the table's masked events (plus, for a
seat whose agent encodes version 4, a ``mortal.features.obs_v4.V4Encoder`` fed the same
events in the same order); an agent (``mortal.play.agent``) is called with all its
pending decisions across all games (and, for a call step, the step after it in case every asked seat
passes: ``OneVsThree(speculate_passes=True)``).

Within a kyoku the table scores hora (incl. honba/kyotaku, multi-ron, pao),
nagashi mangan, noten payments and abortive draws; this module takes its
``deltas``, ``reach_accepted`` and ``ryukyoku`` reasons.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random

from mjai.mlibriichi.state import PlayerState
from riichienv import GameRule, RiichiEnv, calculate_score

from mortal.features.action import action_kind, event_to_label
from mortal.play.agent import IllegalReaction, Scene, abs_scores, make_agent, needs_v4_encoder, reaction_from_index
from mortal.data.grp import rank_by_player  # rankings.rs: 0-based rank of each seat, ties to the lower seat
from mortal.features.obs_v4 import V4Encoder
from mortal.play.log_writer import LogWriter
from mortal.play.kyoku_flow import MAX_KYOKU_INDEX, KyokuState, final_scores, kyoku_result_from_events, next_kyoku

logger = logging.getLogger('mortal.arena')  # the name before the package split (log format)

SPLITS = "abcd"
_U64 = 1 << 64
_REACTION_TYPES = frozenset(("dahai", "chi", "pon", "daiminkan", "kakan", "ankan", "reach"))
_CALL_TYPES = frozenset(("chi", "pon", "daiminkan"))
COUNTERFACTUAL_ALTERNATIVES = ("best", "other_kind")
_CF_WARNED = False  # the warning that counterfactual branches cannot be played was logged
MAX_STEPS_PER_KYOKU = 1000  # watchdog: a kyoku takes < 300 steps
_dumps = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(x, separators=...) without a new encoder per call


class ArenaError(RuntimeError):
    """A table stopped answering, an agent gave an invalid reaction, or a log
    invariant broke; the message names the game (nonce, key, split) and seat."""


class StatePanic(Exception):
    """A seat's ``PlayerState`` (mjai's Rust core) panicked on an event, so that seat's view of the game is lost.

    Known case: its fixed-capacity kawa (24 discards per seat) overflows on a legal kyoku in which one seat
    discards 25 times (others pon its discards, it draws at once). The lock-step loop ends that game as failed
    (``OneVsThree.failed_games``) or drops that counterfactual branch; the other games go on. ``seat``: 0-3;
    ``event``: the mjai event (a dict or its JSON text)."""

    def __init__(self, seat: int, event, panic: BaseException):
        self.seat, self.event = seat, event
        super().__init__(f"seat {seat}'s PlayerState panicked on {event}: {type(panic).__name__}: {panic}")


def is_rust_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is pyo3's ``PanicException`` (a Rust panic surfacing in Python). It derives from
    BaseException, not Exception, and each extension module makes its own class, so it is known by name."""
    return type(exc).__name__ == "PanicException" and not isinstance(exc, Exception)


def _feed(seat: int, st: PlayerState, enc, ev) -> None:
    """Feed the mjai event ``ev`` to seat ``seat``'s state (and version-4 encoder ``enc``, if any).

    Raises:
        StatePanic: the state (or encoder) panicked; other errors propagate unchanged.
    """
    try:
        st.update(ev)
        if enc is not None:
            enc.update(ev)
    except BaseException as e:  # noqa: BLE001 - pyo3's PanicException is a BaseException
        if not is_rust_panic(e):
            raise
        raise StatePanic(seat, ev, e) from None


# ---------------------------------------------------------------------------
# walls


def kyoku_wall(nonce: int, key: int, kyoku_index: int, honba: int) -> list[int]:
    """The 136-tile wall (riichienv tile ids 0-135) of kyoku label
    (nonce, key, kyoku_index, honba): SHA3-256 of the little-endian u64 nonce, u64
    key, u8 kyoku index, u8 honba seeds a ``random.Random`` shuffle. Same label,
    same wall (kyotaku does not count, as Mortal's board.rs); not Mortal's walls.

    Raises:
        ValueError: nonce/key outside u64 or kyoku_index outside 0-11.
    """
    if not (0 <= nonce < _U64 and 0 <= key < _U64):
        raise ValueError(f"nonce and key must be u64, got {nonce}, {key}")
    if not 0 <= kyoku_index < MAX_KYOKU_INDEX:
        raise ValueError(f"kyoku_index must be 0-11, got {kyoku_index}")
    seed = hashlib.sha3_256(
        nonce.to_bytes(8, "little") + key.to_bytes(8, "little") + bytes((kyoku_index, honba % 256))
    ).digest()
    wall = list(range(136))
    random.Random(int.from_bytes(seed, "little")).shuffle(wall)
    return wall


# ---------------------------------------------------------------------------
# one game


def tenhou_rule() -> GameRule:
    """Tenhou rules as Mortal: kuikae forbidden, triple ron paid (no abort)."""
    return GameRule(sanchaho_is_draw=False, kuikae_forbidden=True)


class _Game:
    """One hanchan: its table, four ``PlayerState`` s (and ``V4Encoder`` s for the
    seats of version-4 agents), flow state and log."""

    def __init__(self, gid, nonce, key, split, agents, names):
        self.gid, self.nonce, self.key, self.split = gid, nonce, key, split
        self.agents = agents  # per seat
        self.names = names
        self.v4_seats = [needs_v4_encoder(a) for a in agents]
        self.encoders: list[V4Encoder | None] = [None] * 4
        self.env = RiichiEnv(game_mode=0, seed=nonce % _U64, rule=tenhou_rule())
        self.flow = KyokuState()
        self.lines = [json.dumps({"type": "start_game", "names": names, "seed": [nonce, key]}, separators=(",", ":"))]
        self.states: list[PlayerState] = []
        self.history: list[list[str]] = []  # per seat, the events its state was fed this kyoku
        self.obs: dict = {}
        self.spec: dict | None = None  # seat -> (events, Scene) of the speculative continuation after all pass
        self.done = False
        self.failed: str | None = None  # why the game was ended as failed (StatePanic), left out of the results
        self.scores: list[int] | None = None
        self.ranks: list[int] | None = None
        self.substeps = 0
        self.meta_queue: list[list] = []
        self.tentative_calls: dict[int, list] = {}
        self.cf_rate = 0.0  # counterfactual branches (set by OneVsThree for the real games, see fork)
        self.cf_rng: random.Random | None = None
        self.cf_other_kind = False  # branch only to an action of another kind (counterfactual_alternative)
        self.branches: set = set()  # live _Branch es of this game (its log waits for them)
        self.new_branches: list = []  # forked by the last commit, for the arena loop to take up
        self._start_kyoku()

    def label(self, seat=None) -> str:
        s = f"game {self.nonce}_{self.key}_{self.split}"
        return s if seat is None else f"{s} seat {seat}"

    def _start_kyoku(self):
        f = self.flow
        wall = kyoku_wall(self.nonce, self.key, f.kyoku_index, f.honba)
        self.states = [PlayerState(s) for s in range(4)]
        self.history = [[] for _ in range(4)]
        # fresh per kyoku like the states (the encoder also resets itself at start_kyoku)
        self.encoders = [V4Encoder(s) if self.v4_seats[s] else None for s in range(4)]
        self.meta_queue = [[] for _ in range(4)]
        self.substeps = 0
        # A fresh table every kyoku also sends each seat a start_game before its start_kyoku, which resets an mjai
        # bot: mjai's Bot keeps its call, discard and dora events from start_game on (its Match sends one a
        # hanchan), and a meld of an earlier kyoku left in its hand string makes find_improving_tiles return
        # nothing, so the teacher only discards its draws (tests/test_teacher_whole.py).
        self.obs = self.env.reset(oya=f.oya, wall=wall, round_wind=f.kyoku_index // 4,
                                  scores=list(f.scores), honba=f.honba, kyotaku=f.kyotaku)
        if not self.obs:
            raise ArenaError(f"{self.label()}: table gave no decision at the start of kyoku {f.kyoku_index}")

    def absorb(self) -> dict:
        """Feed each asked seat's new masked events to its state (and encoder); returns seat -> events."""
        out = {}
        for seat, ob in self.obs.items():
            events = ob.new_events()
            st, enc = self.states[seat], self.encoders[seat]
            for ev in events:
                _feed(seat, st, enc, ev)
            self.history[seat].extend(events)
            out[seat] = events
        return out

    def scenes(self, guard: list[bool], absorbed: dict | None = None) -> list[Scene]:
        """The scenes of the seats the table asks now (``absorbed``: their events, if ``absorb`` already ran)."""
        if absorbed is None:
            absorbed = self.absorb()
        out = []
        for seat, ob in self.obs.items():
            st = self.states[seat]
            if not st.last_cans.can_act:
                raise ArenaError(f"{self.label(seat)}: the table asks for a decision the PlayerState does not offer "
                                 f"(legal {[a.to_mjai() for a in ob.legal_actions()]})")
            best = (lambda seat=seat: self._best_win_scores(seat)) if guard[seat] else None
            out.append(Scene(self.gid, seat, st, absorbed[seat], best, self.encoders[seat]))
        return out

    def speculate(self, guard: list[bool]) -> list[Scene]:
        """Scenes of the step that follows if every asked seat passes, to be decided in the same batch.

        Only for a call step (no asked seat can discard) whose asked seats and whose continuation's seats all
        belong to one agent that keeps no state between scenes (``stateless``), in a game without version-4
        encoders: the continuation is played on a clone of the table, and each of its seats gets a fresh
        ``PlayerState`` replayed from the seat's events of this kyoku. ``adopt`` later uses the decisions iff
        the seats did all pass and the table then asks the same seats with the same events. Sets ``self.spec``;
        returns its scenes (empty when there is none).
        """
        self.spec = None
        agent = {id(self.agents[seat]) for seat in self.obs}
        if len(agent) != 1 or any(self.v4_seats):
            return []
        agent = self.agents[next(iter(self.obs))]
        if not getattr(agent, "stateless", False) or any(self.states[seat].last_cans.can_discard for seat in self.obs):
            return []
        sim = self.env.clone()
        passes = {}
        for seat, ob in self.obs.items():
            act = ob.select_action_from_mjai('{"type":"none"}')
            if act is None:
                return []
            passes[seat] = act
        obs = sim.step(passes)
        if sim.done() or not obs or any(self.agents[seat] is not agent for seat in obs):
            return []
        spec = {}
        for seat, ob in obs.items():
            events = ob.new_events()
            st = PlayerState(seat)
            try:
                for ev in self.history[seat] + events:
                    _feed(seat, st, None, ev)
            except StatePanic:
                return []  # no speculation; the real step, if it comes, fails the game
            if not st.last_cans.can_act:
                return []
            best = (lambda seat=seat, st=st, ob=ob: self._best_win_scores(seat, sim, ob, st)) if guard[seat] else None
            spec[seat] = (events, Scene(self.gid, seat, st, events, best, None, speculative=True))
        self.spec = spec
        return [sc for _, sc in spec.values()]

    def adopt(self, absorbed: dict) -> bool:
        """Whether the speculative continuation is the table's step now (same seats, same events), after
        ``absorb``; then its states replace the seats' states (they were fed the same events)."""
        spec, self.spec = self.spec, None
        if spec is None or set(spec) != set(self.obs) or any(spec[s][0] != absorbed[s] for s in spec):
            return False
        for seat, (_, sc) in spec.items():
            self.states[seat] = sc.state
            sc.adopted = True
        return True

    def commit(self, decisions: dict) -> None:
        actions = {}
        for seat, dec in decisions.items():
            ob = self.obs[seat]
            act = ob.select_action_from_mjai(dec.reaction)  # a dict: no JSON text to build and parse
            if act is None:
                raise ArenaError(f"{self.label(seat)}: invalid reaction {dec.reaction} "
                                 f"(legal {[a.to_mjai() for a in ob.legal_actions()]})")
            actions[seat] = act
            if dec.reaction.get("type") in _REACTION_TYPES:
                self.meta_queue[seat].append([dec.reaction, dec.meta])
        branch = self.fork(decisions, actions) if self.cf_rate > 0 else None
        obs = self.env.step(actions)
        self.substeps += 1
        # a call is executed iff its caller must act next (discard / rinshan draw)
        for seat, dec in decisions.items():
            if dec.reaction.get("type") in _CALL_TYPES and seat not in obs:
                self.meta_queue[seat].pop()
                if branch is not None and branch.seat == seat:
                    branch.cancel()  # the call it is paired with never happened
        if self.env.done():
            self._end_kyoku()
            return
        if not obs:
            raise ArenaError(f"{self.label()}: table stopped answering after actions "
                             f"{ {s: d.reaction for s, d in decisions.items()} }")
        if self.substeps > MAX_STEPS_PER_KYOKU:
            raise ArenaError(f"{self.label()}: no progress, kyoku {self.flow.kyoku_index} passed "
                             f"{MAX_STEPS_PER_KYOKU} steps")
        self.obs = obs

    def fork(self, decisions: dict, actions: dict):
        """Maybe fork a counterfactual branch at this step, before the table takes ``actions`` (see
        ``OneVsThree``'s ``counterfactual_rate``): with probability ``cf_rate``, when the challenger seat acts
        here by a logged reaction (``_REACTION_TYPES``) without a kan-select evaluation and has another legal
        action (of another kind with ``cf_other_kind``), a clone of the table takes the other seats' same actions
        and the challenger's best such action (``counterfactual_action``). Returns the ``_Branch`` (also in ``branches`` and ``new_branches``) or None."""
        seat = SPLITS.index(self.split)
        dec = decisions.get(seat)
        if dec is None or dec.reaction.get("type") not in _REACTION_TYPES or not isinstance(dec.meta, dict) \
                or "kan_select" in dec.meta:
            return None
        taken = event_to_label(dec.reaction)
        alt = counterfactual_action(dec.meta, taken, other_kind=self.cf_other_kind)
        # the draw comes after the eligibility: the rate is that of the decisions that have an alternative
        if alt is None or self.cf_rng.random() >= self.cf_rate:
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

    def _best_win_scores(self, seat: int, env=None, ob=None, st=None) -> list[int]:
        """Absolute scores after this seat's hora now (the agari guard of Mortal's ``agent/mortal.rs``): the table's
        exact payment for the hand (single winner), plus, in riichi, an upper bound on
        ura dora: every ura indicator pointing at the most-held kinds. ``env``/``ob``/``st``: the table, the
        seat's observation and state of a speculative step (default: this game's)."""
        st = self.states[seat] if st is None else st
        ob = self.obs[seat] if ob is None else ob
        return _win_scores(self.env if env is None else env, ob, st, seat, self.flow)

    def _end_kyoku(self):
        f = self.flow
        # catch the seats' states up with the end of the kyoku (dealer tenpai)
        tail = self.env.get_observations([0, 1, 2, 3])
        for seat, ob in tail.items():
            enc = self.encoders[seat]
            for ev in ob.new_events():
                _feed(seat, self.states[seat], enc, ev)
        events = [e for e in self.env.mjai_log if e["type"] not in ("start_game", "end_game")]
        queues = [iter(q) for q in self.meta_queue]
        for ev in events:
            if ev["type"] in _REACTION_TYPES:
                actor = ev["actor"]
                sub = next(queues[actor], None)
                if sub is None or sub[0]["type"] != ev["type"] or sub[0].get("pai", ev.get("pai")) != ev.get("pai"):
                    raise ArenaError(f"{self.label(actor)}: logged {ev} does not match the submitted reaction "
                                     f"{None if sub is None else sub[0]}")
                if sub[1] is not None:
                    ev["meta"] = sub[1]
        result = kyoku_result_from_events(events, f.oya, self.states[f.oya].shanten)
        # an event whose meta a counterfactual branch still running will write into stays a dict until log_text
        waiting = {id(b.meta) for b in self.branches}
        self.lines.extend(e if id(e.get("meta")) in waiting else _dumps(e) for e in events)
        out = next_kyoku(f, result)
        if out.next is None:
            self.scores = final_scores(out.scores, out.kyotaku)
            self.ranks = rank_by_player(self.scores)
            self.lines.append('{"type":"end_game"}')
            self.done = True
            self.obs = {}
        else:
            self.flow = out.next
            self._start_kyoku()

    def log_text(self) -> str:
        return "\n".join(ln if isinstance(ln, str) else _dumps(ln) for ln in self.lines) + "\n"


def _win_scores(env, ob, st: PlayerState, seat: int, flow: KyokuState) -> list[int]:
    """Absolute scores after ``seat``'s hora now on the table ``env`` (``ob``: the seat's observation, ``st``: its
    ``PlayerState``, ``flow``: the kyoku's oya and honba): the table's exact payment for the hand, played on a
    clone (single winner), plus, in riichi, ``_add_ura_bound``; the scores now when the seat cannot win."""
    now = abs_scores(st)
    hora = next((a for a in ob.legal_actions() if "RON" in str(a.action_type) or "TSUMO" in str(a.action_type)), None)
    if hora is None:
        return now
    sim = env.clone()
    sim.step({seat: hora})
    hora_ev = next((e for e in sim.mjai_log if e["type"] == "hora" and e["actor"] == seat), None)
    if hora_ev is None:
        return now
    exp = [s + d for s, d in zip(now, hora_ev["deltas"])]
    if st.self_riichi_accepted:
        _add_ura_bound(exp, sim, st, seat, hora_ev, flow)
    return exp


def _add_ura_bound(exp: list[int], sim, st: PlayerState, seat: int, hora_ev: dict, flow: KyokuState) -> None:
    """Add to the scores ``exp`` after the hora ``hora_ev`` (played on ``sim``) an upper bound on its ura dora:
    every ura indicator pointing at the most-held kinds (the win tile joins the largest group; each ankan is 4).
    Nothing for a yakuman or when the table gives no win result."""
    results = sim.win_results
    results = results() if callable(results) else results
    wr = results.get(seat) if isinstance(results, dict) else None
    if wr is None or wr.yakuman:
        return
    counts = sorted((c for c in st.tehai if c), reverse=True) + [4] * len(st.ankans)
    counts.sort(reverse=True)
    counts[0] += 1
    n_ura = len(hora_ev.get("ura_markers") or []) or 1
    extra_han = sum(counts[:n_ura])
    tsumo = hora_ev["target"] == seat
    is_oya = seat == flow.oya
    hi = calculate_score(wr.han + extra_han, wr.fu, is_oya, tsumo, flow.honba)
    lo = calculate_score(wr.han, wr.fu, is_oya, tsumo, flow.honba)
    if tsumo:
        for s in range(4):
            if s != seat:
                pay = (hi.pay_tsumo_oya - lo.pay_tsumo_oya) if s == flow.oya else (hi.pay_tsumo_ko - lo.pay_tsumo_ko)
                exp[s] -= pay
                exp[seat] += pay
    else:
        gain = hi.pay_ron - lo.pay_ron
        exp[seat] += gain
        exp[hora_ev["target"]] -= gain


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
        self.tentative_calls = {}
        self.cf_rate, self.cf_rng, self.cf_other_kind = 0.0, None, False
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
        tail = self.env.get_observations([0, 1, 2, 3])
        for seat, ob in tail.items():
            for ev in ob.new_events():
                _feed(seat, self.states[seat], None, ev)
        events = [e for e in self.env.mjai_log if e["type"] not in ("start_game", "end_game")]
        out = next_kyoku(f, kyoku_result_from_events(events, f.oya, self.states[f.oya].shanten))
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


class _LockStep:
    """One run of ``OneVsThree.py_vs_py``'s lock-step loop over ``games`` (and the counterfactual branches they
    fork): each agent's pending scenes across all games in flight, the games waiting for decisions, and the
    decisions taken so far. ``run`` serves the agent with the most pending scenes until every game has ended;
    the arena's counters (``speculated``, ``counterfactual``) are counted on ``arena``, and each finished game goes
    through its ``_finish``.

    A ``StatePanic`` while a game commits or gathers (``guarded``) ends only that game, as failed (``fail``): it
    has no scene pending then, and its counterfactual branches still in flight play on (they are clones with
    states of their own) before it is settled. A branch that panics is dropped the same way."""

    def __init__(self, arena: "OneVsThree", games: list[_Game], chal, champ):
        self.arena = arena
        self.games = games
        self.rankings = [0, 0, 0, 0]
        self.flight: dict[int, _Game] = {g.gid: g for g in games}  # gid -> every game in flight, branches included
        self.next_gid = len(games)
        self.guards = {id(a): bool(getattr(a, "agari_guard", False)) for a in (chal, champ)}
        self.agents = {id(chal): chal, id(champ): champ}
        self.pending: dict[int, list[Scene]] = {aid: [] for aid in self.agents}
        self.waiting: dict[int, int] = {}  # game -> scenes not yet decided
        self.decided: dict[int, dict] = {}
        self.spec_ids: set[int] = set()  # id() of the speculative scenes pending
        self.spec_decided: dict[int, dict] = {}  # game -> seat -> Decision of its speculative scenes

    def run(self) -> list[int]:
        """Play every game to its end; returns the rankings (as ``py_vs_py``)."""
        from tqdm import tqdm

        remaining = len(self.games)
        for g in self.games:
            if not self.guarded(g, self.gather, g) and self.settle(g):
                remaining -= 1
        with tqdm(total=len(self.games), unit="game", disable=self.arena.disable_progress_bar or None) as bar:
            bar.update(len(self.games) - remaining)
            while remaining:
                for g in self.serve(remaining):
                    self.guarded(g, self.advance, g, self.decided.pop(g.gid), self.spec_decided.pop(g.gid))
                    self.take_up(g)
                    if g.done and self.settle(g):
                        remaining -= 1
                        bar.update(1)
        return self.rankings

    def guarded(self, g: _Game, step, *args) -> bool:
        """``step(*args)`` for game (or branch) ``g``; on a ``StatePanic``, ``fail`` it. Returns False if it failed."""
        try:
            step(*args)
        except StatePanic as e:
            self.fail(g, e)
            return False
        return True

    def fail(self, g: _Game, err: StatePanic) -> None:
        """End ``g`` after ``err``: a real game is marked failed (``_finish`` leaves it out of the rankings and
        logs, ``OneVsThree.failed_games`` names it); a branch is cancelled (its outcome counted as dropped)."""
        g.spec = None
        if isinstance(g, _Branch):
            logger.warning("%s: %s; branch dropped", g.label(), err)
            g.cancel()
            return
        logger.warning("%s (seed %d, %d): %s; game left out of the results", g.label(), g.nonce, g.key, err)
        g.failed = str(err)
        g.done = True
        g.obs = {}

    def serve(self, remaining: int) -> list[_Game]:
        """Hand the agent with the most pending decisions all of them in one call; returns the games whose every
        asked seat is now decided, in the order their last scene was decided."""
        # Serve the agent with the most pending decisions: games then fall into
        # step and each forward sees close to every game (lock-step cycles over
        # two engines would average N/2 rows per forward).
        pending = self.pending
        aid = max(pending, key=lambda k: len(pending[k]))
        scenes, pending[aid] = pending[aid], []
        if not scenes:
            raise ArenaError(f"no progress: {remaining} games running but no decision pending")
        try:
            decisions = self.agents[aid].react(scenes)
        except IllegalReaction as e:
            raise ArenaError(f"{self.flight[e.game].label(e.seat)}: {e}") from e
        ready = []
        for sc, dec in zip(scenes, decisions):
            if id(sc) in self.spec_ids:
                self.spec_ids.discard(id(sc))
                self.spec_decided[sc.game][sc.seat] = dec
                continue
            self.decided[sc.game][sc.seat] = dec
            self.waiting[sc.game] -= 1
            if self.waiting[sc.game] == 0:
                ready.append(self.flight[sc.game])
        return ready

    def gather(self, g: _Game, absorbed: dict | None = None) -> None:
        """Queue the scenes ``g``'s table asks now (and, with ``speculate_passes``, its speculative ones)."""
        arena = self.arena
        guard = [self.guards[id(a)] for a in g.agents]
        scenes = g.scenes(guard, absorbed)
        self.waiting[g.gid] = len(scenes)
        if isinstance(g, _Branch):
            arena.counterfactual["scenes"] += len(scenes)
        self.decided[g.gid] = {}
        self.spec_decided[g.gid] = {}
        spec = g.speculate(guard) if arena.speculate_passes else []
        self.spec_ids.update(id(sc) for sc in spec)
        arena.speculated[0] += len(spec)
        for sc in scenes + spec:
            self.pending[id(g.agents[sc.seat])].append(sc)

    def advance(self, g: _Game, dec: dict, spec: dict) -> None:
        """Commit ``g``'s decisions and gather its next scenes; a call step all passed whose continuation was
        decided in the same batch takes that step too."""
        while True:
            g.commit(dec)
            if g.done:
                return
            absorbed = g.absorb()
            if not (spec and all(d.reaction.get("type") == "none" for d in dec.values())
                    and g.adopt(absorbed)):
                g.spec = None
                self.gather(g, absorbed)
                return
            self.arena.speculated[1] += len(spec)
            dec, spec = spec, {}

    def take_up(self, g: _Game) -> None:
        """The branches ``g``'s last commits forked join the loop (those dropped or ended at once are counted)."""
        counts = self.arena.counterfactual
        for b in g.new_branches:
            counts["forked"] += 1
            if b.done:
                counts["recorded"] += not b.cancelled
                continue
            b.gid = self.next_gid
            self.next_gid += 1
            self.flight[b.gid] = b
            if not self.guarded(b, self.gather, b):
                # dropped before it had a scene pending; settling it here would also settle its parent, which
                # the caller settles
                del self.flight[b.gid]
                self.waiting.pop(b.gid, None)
        g.new_branches = []

    def settle(self, g: _Game) -> bool:
        """A game or branch has ended; True when a real game is finished (its log waits for its branches)."""
        self.waiting.pop(g.gid, None)  # a game that failed at its first gather has no entry
        if isinstance(g, _Branch):
            self.arena.counterfactual["recorded"] += not g.cancelled
            del self.flight[g.gid]
            g = g.parent
        if not (g.done and not g.branches and self.flight.pop(g.gid, None) is not None):
            return False
        self.arena._finish(g, self.rankings)
        return True


# ---------------------------------------------------------------------------
# OneVsThree


class OneVsThree:
    """Mortal's 1v3 duplicate arena (``libriichi/src/arena/one_vs_three.rs``).

    Args:
        disable_progress_bar: no tqdm bar (games finished / total, games/s).
        log_dir: if set, one ``{nonce}_{key}_{a|b|c|d}.json.gz`` mjai log per game
            (decimal nonce/key; split = challenger seat 0-3), written atomically as
            each game ends, on a background thread (``mortal.play.log_writer``): all are on disk when ``py_vs_py``
            returns; the directory is created, not cleared.
        speculate_passes: decide the step after a call step in the same batch as the call (see
            ``py_vs_py``); False (the default) batches as before. Off by default: on 2 CPU cores it took 12% fewer
            forwards at 0.83 N useful rows per forward but 6% more rows in all, and ran 6% slower
            (``bench/arena.py --speculate on|off``); on a GPU, where a forward costs about the same at any size, it
            should pay, unmeasured. It also changes which random draws exploring rows get (same distribution). ``speculated``:
            ``[scenes handed to agents, scenes used]`` of the last run.
        counterfactual_rate: probability that a decision of the challenger's by a logged reaction (dahai, calls,
            kans, reach; not one with a kan-select evaluation) forks a counterfactual branch: a clone of the
            table (same wall) where the challenger takes its highest-Q other legal action instead, played out to
            the end of the kyoku by the same agents in the same batches (``_Branch``); its outcome goes into
            the real decision's ``meta["counterfactual"]`` (the learner's paired target, ``mortal.data``). 0 (the
            default) = Mortal's games. Needs ``stateless`` agents without version 4, else nothing is forked (one
            warning). A game's log is written once all its branches have ended. ``counterfactual``: counts of the
            last run. ``counterfactual_seed``: seeds the per-game draws. ``counterfactual_alternative``: 'best'
            (the highest-Q other legal action) or 'other_kind' (the highest-Q legal action of another kind: a
            decision with none, one discard among others, forks nothing); the rate is that of the decisions
            that have such an alternative.
    """

    def __init__(self, *, disable_progress_bar: bool = False, log_dir: str | None = None,
                 speculate_passes: bool = False, counterfactual_rate: float = 0.0, counterfactual_seed: int = 0,
                 counterfactual_alternative: str = "best"):
        if not 0.0 <= counterfactual_rate <= 1.0:
            raise ValueError(f"counterfactual_rate must be within [0, 1], got {counterfactual_rate}")
        if counterfactual_alternative not in COUNTERFACTUAL_ALTERNATIVES:
            raise ValueError(f"counterfactual_alternative must be one of {COUNTERFACTUAL_ALTERNATIVES}, "
                             f"got {counterfactual_alternative!r}")
        self.counterfactual_alternative = counterfactual_alternative
        self.disable_progress_bar = disable_progress_bar
        self.log_dir = log_dir
        self.speculate_passes = speculate_passes
        self.counterfactual_rate = float(counterfactual_rate)
        self.counterfactual_seed = int(counterfactual_seed)
        self.speculated = [0, 0]  # speculative scenes of the last run: handed to agents, and used
        # counterfactual branches of the last run: forked, outcome recorded, dropped (call not executed), the
        # scenes their agents decided
        self.counterfactual = {"forked": 0, "recorded": 0, "dropped": 0, "scenes": 0}
        self.last_games: list = []  # (nonce, key, split, final scores, rank_by_player) of the last run
        # (nonce, key, split, reason) of the last run's games ended as failed (StatePanic), left out of the above
        self.failed_games: list = []
        self._logs = LogWriter()  # py_vs_py's background log writer (mortal.play.log_writer)

    def _enable_counterfactuals(self, games: list[_Game], agents) -> None:
        """Let the games fork counterfactual branches (``counterfactual_rate`` > 0) when every agent is
        ``stateless`` and none encodes version 4; else warn once per process and play without. Each game draws
        from its own generator, seeded by (``counterfactual_seed``, nonce, key, split): the draws do not depend
        on the batching."""
        global _CF_WARNED
        if self.counterfactual_rate <= 0:
            return
        if not all(getattr(a, "stateless", False) and not needs_v4_encoder(a) for a in agents):
            if not _CF_WARNED:
                logger.warning("counterfactual_rate %g: no counterfactual branches, they need stateless agents "
                               "of observation version 1-3 (got %s)", self.counterfactual_rate,
                               ", ".join(type(a).__name__ for a in agents))
                _CF_WARNED = True
            return
        for g in games:
            g.cf_rate = self.counterfactual_rate
            g.cf_rng = random.Random(f"{self.counterfactual_seed}:{g.nonce}:{g.key}:{g.split}")
            g.cf_other_kind = self.counterfactual_alternative == "other_kind"

    def py_vs_py(self, challenger, champion, seed_start: tuple[int, int], seed_count: int) -> list[int]:
        """Play ``4 * seed_count`` hanchan, all in flight: nonces ``seed_start[0] …
        + seed_count − 1`` with key ``seed_start[1]``, each 4 times with the
        challenger in seat 0, 1, 2, 3 (splits a-d) and the champion in the rest.

        ``challenger``/``champion``: an engine with ``react_batch`` (as ``mortal.play.engine.MortalEngine``) or
        an arena agent (``mortal.play.agent.MjaiBotAgent``). Each agent call takes every
        pending decision of that agent across all games (one ``react_batch``); the
        agent with the most pending decisions is served next, so games fall into
        step and batches approach the number of games in flight.

        Why rows are still lost: a game waits whenever its next decision belongs to the other agent, and
        every call opportunity (pass, chi, pon) shifts a game's turn order against the others. With
        ``speculate_passes``, a call step whose asked seats and whose all-pass continuation belong to one
        stateless agent (``MortalBatchAgent``) also hands that agent the continuation's scenes, played on a
        clone of the table; if all pass, the game takes both steps in one batch (the decisions are those it
        would get one batch later: a greedy engine plays the same game), else those rows are wasted.
        Exploration draws (``MortalEngine`` with ``boltzmann_epsilon > 0``) are taken in batch order, so
        any change of batching changes which draw a row gets: same distribution, other games.

        A game in which a seat's ``PlayerState`` panics (``StatePanic``: mjai's fixed capacities, e.g. a 25th
        discard of one seat) is ended as failed, with a warning naming its seed (nonce, key), split and event: it
        is left out of the rankings, ``last_games`` and the logs, and listed in ``failed_games``; the other games
        are played on. Callers that pair games by deal drop such a deal whole (``mortal.play.duplicate``
        ``complete_units``).

        Returns:
            ``[n1, n2, n3, n4]``: games in which the challenger finished 1st … 4th (they sum to
            ``4 * seed_count - len(failed_games)``).

        Raises:
            ArenaError: an invalid reaction, a table that stops answering, or no
                progress; the message names the game and seat.
            ValueError: bad seed_start / seed_count.
        """
        nonce0, key = (int(v) for v in seed_start)
        if seed_count < 1:
            raise ValueError(f"seed_count must be >= 1, got {seed_count}")
        chal = make_agent(challenger)
        champ = make_agent(champion)
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        games: list[_Game] = []
        for n in range(seed_count):
            for split in range(4):
                agents = [chal if s == split else champ for s in range(4)]
                games.append(_Game(len(games), nonce0 + n, key, SPLITS[split], agents, [a.name for a in agents]))
        self.last_games = []
        self.failed_games = []
        self.speculated = [0, 0]
        self.counterfactual = dict.fromkeys(self.counterfactual, 0)
        self._enable_counterfactuals(games, (chal, champ))
        with LogWriter() as self._logs:  # every log is on disk when py_vs_py returns
            rankings = _LockStep(self, games, chal, champ).run()
        self.counterfactual["dropped"] = self.counterfactual["forked"] - self.counterfactual["recorded"]
        return rankings

    def _finish(self, g: _Game, rankings: list[int]) -> None:
        for s in range(4):
            g.agents[s].end_game(g.gid, s)
        if g.failed is not None:  # no ranks, no log (its kyoku never ended)
            self.failed_games.append((g.nonce, g.key, g.split, g.failed))
            g.lines = []
            g.env = None
            return
        split = SPLITS.index(g.split)
        rankings[g.ranks[split]] += 1
        self.last_games.append((g.nonce, g.key, g.split, g.scores, g.ranks))
        if self.log_dir:
            path = os.path.join(self.log_dir, f"{g.nonce}_{g.key}_{g.split}.json.gz")
            self._logs.submit(path, g.log_text())
        g.lines = []
        g.env = None
