"""One hanchan on a ``riichienv`` table for the arena's lock-step loop, one kyoku per reset."""

from __future__ import annotations

import hashlib
import random
from functools import partial

from mjai.mlibriichi.state import PlayerState
from riichienv import GameRule, RiichiEnv, calculate_score

from mortal.data.grp import rank_by_player  # rankings.rs: 0-based rank of each seat, ties to the lower seat
from mortal.features.obs_v4 import V4Encoder
from mortal.play.agent import Scene, abs_scores, needs_v4_encoder
from mortal.play.kyoku_flow import MAX_KYOKU_INDEX, KyokuState, final_scores, kyoku_result_from_events, next_kyoku
from mortal.play.log_writer import REACTION_TYPES, dumps, kyoku_lines, render_line

SPLITS = "abcd"  # the challenger's seat 0-3 as a log name's split
_U64 = 1 << 64
_CALL_TYPES = frozenset(("chi", "pon", "daiminkan"))
MAX_STEPS_PER_KYOKU = 1000  # watchdog: a kyoku takes < 300 steps


class ArenaError(RuntimeError):
    """A table stopped answering, an invalid reaction, or a broken log invariant; names game and seat."""


class StatePanic(Exception):
    """A seat's ``PlayerState`` panicked on ``event``: the game fails (or the branch is dropped), others go on."""

    def __init__(self, seat: int, event, panic: BaseException):
        self.seat, self.event = seat, event
        super().__init__(f"seat {seat}'s PlayerState panicked on {event}: {type(panic).__name__}: {panic}")


def _feed(seat: int, st: PlayerState, enc, events) -> None:
    """Feed ``events`` (mjai JSON texts) to ``seat``'s state and v4 encoder ``enc``; ``StatePanic`` if either panics."""
    ev = None
    try:
        for ev in events:
            st.update(ev)
            if enc is not None:
                enc.update(ev)
    except BaseException as e:  # noqa: BLE001 - pyo3's PanicException: a BaseException, one class per module
        if type(e).__name__ != "PanicException" or isinstance(e, Exception):
            raise
        raise StatePanic(seat, ev, e) from None


def kyoku_wall(nonce: int, key: int, kyoku_index: int, honba: int) -> list[int]:
    """The 136-tile wall (riichienv ids) of (nonce, key, kyoku_index, honba): a ``random.Random`` shuffle seeded
    by their SHA3-256 (u64, u64, u8, u8 little-endian). ValueError for values out of range."""
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


class _Game:
    """One hanchan: its table, seat states (and v4 encoders), flow state and log."""

    def __init__(self, gid, nonce, key, split, agents):
        self.gid, self.nonce, self.key, self.split = gid, nonce, key, split
        self.agents = agents  # per seat
        self.v4_seats = [needs_v4_encoder(a) for a in agents]
        rule = GameRule(sanchaho_is_draw=False, kuikae_forbidden=True)  # Tenhou's as Mortal: triple ron paid
        self.env = RiichiEnv(game_mode=0, seed=nonce % _U64, rule=rule)
        self.flow = KyokuState()
        self.lines = [dumps({"type": "start_game", "names": [a.name for a in agents], "seed": [nonce, key]})]
        self.spec: dict | None = None  # seat -> (events, Scene) of the speculative continuation after all pass
        self.done = False
        self.failed: str | None = None  # why the game was ended as failed (StatePanic), left out of the results
        self.scores: list[int] | None = None
        self.ranks: list[int] | None = None
        # the lock-step loop's (mortal.play.lockstep): per seat, the agari guard's switch and the agent's queue of
        # pending scenes; the scenes of this step not yet decided; the decisions of this step and of its
        # speculative continuation
        self.guard: list[bool] = [False] * 4
        self.queues: list[list] | None = None
        self.waiting = 0
        self.decided: dict = {}
        self.spec_decided: dict = {}
        # fork(game, decisions, actions) -> branch or None: mortal.play.counterfactual.fork with this game's
        # draws, set by OneVsThree when it plays counterfactual branches
        self.fork = None
        self.branches: set = set()  # live _Branch es of this game (its log waits for them)
        self.new_branches: list = []  # forked by the last commit, for the arena loop to take up
        self._start_kyoku()  # the per-kyoku state: states, history, encoders, meta queues, obs

    def label(self, seat=None) -> str:
        s = f"game {self.nonce}_{self.key}_{self.split}"
        return s if seat is None else f"{s} seat {seat}"

    def _start_kyoku(self):
        f = self.flow
        wall = kyoku_wall(self.nonce, self.key, f.kyoku_index, f.honba)
        self.states = [PlayerState(s) for s in range(4)]
        self.history = [[] for _ in range(4)]  # per seat, the events its state was fed this kyoku
        # fresh per kyoku like the states (the encoder also resets itself at start_kyoku)
        self.encoders = [V4Encoder(s) if self.v4_seats[s] else None for s in range(4)]
        self.meta_queue = [[] for _ in range(4)]
        self.pass_metas = [[] for _ in range(4)]  # per seat, (view index, record) of its passes that forked
        self.substeps = 0
        # A fresh table every kyoku also sends each seat a start_game before its start_kyoku, which resets an mjai
        # bot: mjai's Bot keeps its call, discard and dora events from start_game on (its Match sends one a
        # hanchan), and a meld of an earlier kyoku left in its hand string makes find_improving_tiles return
        # nothing, so the teacher only discards its draws (tests/test_teacher_whole.py).
        self.obs = self.env.reset(oya=f.oya, wall=wall, round_wind=f.kyoku_index // 4,
                                  scores=list(f.scores), honba=f.honba, kyotaku=f.kyotaku)
        if not self.obs:
            raise ArenaError(f"{self.label()}: table gave no decision at the start of kyoku {f.kyoku_index}")

    def absorb(self, obs: dict | None = None) -> dict:
        """Feed each asked seat's (``obs``: default the table's asks now) new masked events to its state (and
        encoder); returns seat -> events."""
        out = {}
        for seat, ob in (self.obs if obs is None else obs).items():
            events = ob.new_events()
            _feed(seat, self.states[seat], self.encoders[seat], events)
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
            best = partial(_win_scores, self.env, ob, st, seat, self.flow) if guard[seat] else None
            out.append(Scene(self.gid, seat, st, absorbed[seat], best, self.encoders[seat]))
        return out

    def speculate(self, guard: list[bool]) -> list[Scene]:
        """Scenes of the step that follows if every asked seat passes, on a clone; sets ``self.spec``."""
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
                _feed(seat, st, None, self.history[seat] + events)
            except StatePanic:
                return []  # no speculation; the real step, if it comes, fails the game
            if not st.last_cans.can_act:
                return []
            best = partial(_win_scores, sim, ob, st, seat, self.flow) if guard[seat] else None
            spec[seat] = (events, Scene(self.gid, seat, st, events, best, None, speculative=True))
        self.spec = spec
        return [sc for _, sc in spec.values()]

    def adopt(self, absorbed: dict) -> bool:
        """Whether the speculative continuation is the table's step now; then its states replace the seats'."""
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
            if dec.reaction.get("type") in REACTION_TYPES:
                self.meta_queue[seat].append([dec.reaction, dec.meta])
        branch = self.fork(self, decisions, actions) if self.fork is not None else None
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

    def _end_kyoku(self):
        f = self.flow
        self.absorb(self.env.get_observations([0, 1, 2, 3]))  # the ended kyoku's last events (dealer tenpai, result)
        waiting = {id(b.meta) for b in self.branches}  # metas a counterfactual branch still running writes into
        try:
            lines, results = kyoku_lines(self.history, self.meta_queue, waiting, self.pass_metas)
        except ValueError as e:
            raise ArenaError(f"{self.label()}: {e}") from None
        self.lines.extend(lines)
        out = next_kyoku(f, kyoku_result_from_events(results, f.oya, self.states[f.oya].shanten))
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
        return "\n".join(map(render_line, self.lines)) + "\n"


def _win_scores(env, ob, st: PlayerState, seat: int, flow: KyokuState) -> list[int]:
    """Absolute scores after ``seat``'s hora now (played on a clone, single winner) plus, in riichi,
    ``_add_ura_bound``; the scores now when it cannot win."""
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
    """Add to ``exp`` an upper bound on the ura dora of ``hora_ev``; nothing for a yakuman."""
    results = sim.win_results
    results = results() if callable(results) else results
    wr = results.get(seat) if isinstance(results, dict) else None
    if wr is None or wr.yakuman:
        return
    counts = sorted([c for c in st.tehai if c] + [4] * len(st.ankans), reverse=True)
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

