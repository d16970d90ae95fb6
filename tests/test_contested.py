"""Counterfactual branches where the decision is contested (``counterfactual_alternative = 'contested'``, issue 33
part 2): which decisions qualify and their alternative, by hand; the draw after the eligibility; a pass's branch
in the log and the loader; and an arena run whose every branch is of a contested kind."""

import json
import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import ROOT
from mortal.data.gameplay import GameplayLoader
from mortal.features.action import event_to_label
from mortal.play.arena import OneVsThree
from mortal.play.counterfactual import contested_action, fork, riichi_genbutsu
from mortal.play.log_writer import kyoku_lines, render_line

from test_arena import PriorityEngine, read_log, check_log
from test_arena_logs import _views

sys.path.insert(0, str(ROOT / "bench"))
import counterfactual_gaps as cg  # noqa: E402


def _meta(q: dict) -> dict:
    """A decision's meta with the legal actions ``q``'s keys and their Q values (as the agent writes it)."""
    legal = sorted(q)
    return {"mask_bits": sum(1 << i for i in legal), "q_values": [q[i] for i in legal]}


# ---------------------------------------------------------------- the kinds and their alternative, by hand


def test_riichi_vs_dama():
    # discards 3m (2), 7m (6), 5mr (34), riichi (37), tsumo hora (43)
    meta = _meta({2: 0.1, 6: 0.9, 34: 0.4, 37: 0.5, 43: -3.0})
    assert contested_action(meta, 37) == ("riichi->dama", 6)  # the highest-Q discard, not the hora
    assert contested_action(meta, 2) == ("dama->riichi", 37)
    assert contested_action(meta, 34) == ("dama->riichi", 37)
    assert contested_action(meta, 43) is None  # a hora is not contested
    # riichi legal decides the kind even when an opponent is in riichi
    assert contested_action(meta, 2, frozenset({2})) == ("dama->riichi", 37)


def test_call_vs_pass():
    # chi low (38), pon (41), ron (43), pass (45) on another seat's discard
    meta = _meta({38: 1.5, 41: 2.5, 43: 9.0, 45: 2.0})
    assert contested_action(meta, 41) == ("call->pass", 45)
    assert contested_action(meta, 38) == ("call->pass", 45)
    assert contested_action(meta, 45) == ("pass->call", 41)  # the best call, not the ron
    assert contested_action(meta, 43) is None
    assert contested_action(_meta({42: -1.0, 45: 0.0}), 45) == ("pass->call", 42)  # a daiminkan is a call
    assert contested_action(_meta({43: 1.0, 45: 0.0}), 45) is None  # only a ron offered: nothing contested


def _riichi_kyoku(*, second_riichi=False):
    """Seat 0's view of a kyoku: seat 1 discards 3m; seat 2 discards 1m, then declares riichi on E (accepted);
    seat 3 discards 9p after it; seat 1 discards 5sr. With ``second_riichi``, seat 3 also declares riichi on 9p
    and 2m is discarded after both."""
    evs = [{"type": "start_kyoku"},
           {"type": "dahai", "actor": 1, "pai": "3m", "tsumogiri": False},
           {"type": "dahai", "actor": 2, "pai": "1m", "tsumogiri": False},
           {"type": "reach", "actor": 2},
           {"type": "dahai", "actor": 2, "pai": "E", "tsumogiri": False},
           {"type": "reach_accepted", "actor": 2}]
    if second_riichi:
        evs.append({"type": "reach", "actor": 3})
    evs.append({"type": "dahai", "actor": 3, "pai": "9p", "tsumogiri": True})
    if second_riichi:
        evs.append({"type": "reach_accepted", "actor": 3})
        evs.append({"type": "dahai", "actor": 1, "pai": "2m", "tsumogiri": True})
    evs.append({"type": "dahai", "actor": 1, "pai": "5sr", "tsumogiri": True})
    return [json.dumps(e, separators=(",", ":")) for e in evs]


def test_riichi_genbutsu_by_hand():
    # against seat 2: its own 1m and E, then 9p and 5s (red as plain) passed after its riichi; 3m came before it
    assert riichi_genbutsu(_riichi_kyoku(), 0) == frozenset({0, 27, 17, 22})
    # the same as dicts; seat 2's own view: no opponent in riichi
    assert riichi_genbutsu([json.loads(e) for e in _riichi_kyoku()], 0) == frozenset({0, 27, 17, 22})
    assert riichi_genbutsu(_riichi_kyoku(), 2) is None
    # two riichi: safe against both. Seat 3's riichi tile 9p is its own; 1m and E are not seat 3's discards and
    # came before its riichi; 2m and 5s came after both
    assert riichi_genbutsu(_riichi_kyoku(second_riichi=True), 0) == frozenset({17, 1, 22})
    # a riichi declared but not accepted (yet) is no riichi
    assert riichi_genbutsu(_riichi_kyoku()[:5], 0) is None


def test_push_vs_fold_after_an_opponents_riichi():
    safe = riichi_genbutsu(_riichi_kyoku(), 0)  # 1m, 9p, 5s, E
    # discards: 1m (0, safe), 3m (2, unsafe), 6p (14, unsafe), 5sr (36, safe as 5s), E (27, safe)
    meta = _meta({0: 0.2, 2: 1.0, 14: 0.7, 36: 0.6, 27: -0.5})
    assert contested_action(meta, 2, safe) == ("push->fold", 36)  # the highest-Q safe discard
    assert contested_action(meta, 14, safe) == ("push->fold", 36)
    assert contested_action(meta, 0, safe) == ("fold->push", 2)  # the highest-Q unsafe discard
    assert contested_action(meta, 36, safe) == ("fold->push", 2)
    # no safe tile in hand: an unsafe discard has no alternative; all safe: neither has one
    assert contested_action(_meta({2: 1.0, 14: 0.7}), 2, safe) is None
    assert contested_action(_meta({0: 1.0, 27: 0.7}), 0, safe) is None
    # a kan or a hora is no push or fold
    assert contested_action(_meta({2: 1.0, 27: 0.5, 42: 0.2}), 42, safe) is None


def test_ordinary_discards_are_not_contested():
    meta = _meta({0: 0.2, 2: 1.0, 14: 0.7, 36: 0.6, 27: -0.5})
    assert contested_action(meta, 2) is None  # no riichi legal, no call, nobody in riichi
    assert contested_action(meta, 2, None) is None


# ---------------------------------------------------------------- fork: the draw comes after the eligibility


class CountingRng(random.Random):
    def __init__(self):
        super().__init__(0)
        self.draws = 0

    def random(self):
        self.draws += 1
        return 0.999  # above any rate < 1: nothing forks, no table needed


def _draws(reaction, meta, history, **mode):
    game = SimpleNamespace(split="a", history=[history, [], [], []])
    rng = CountingRng()
    dec = SimpleNamespace(reaction=reaction, meta=meta)
    assert fork(game, {0: dec}, {}, rate=0.5, rng=rng, **mode) is None
    return rng.draws


def test_fork_draws_only_at_contested_decisions():
    dahai = {"type": "dahai", "actor": 0, "pai": "3m", "tsumogiri": False}
    discards = _meta({0: 0.2, 2: 1.0, 14: 0.7, 36: 0.6, 27: -0.5})
    quiet = _riichi_kyoku()[:3]  # nobody in riichi
    # an ordinary discard: 'best' draws (it has another discard), 'contested' never does
    assert _draws(dahai, discards, quiet) == 1
    assert _draws(dahai, discards, quiet, contested=True) == 0
    # the same discard after an opponent's riichi accepted: push (3m is not genbutsu) -> fold
    assert _draws(dahai, discards, _riichi_kyoku(), contested=True) == 1
    # riichi legal: a discard is dama
    assert _draws(dahai, _meta({2: 1.0, 37: 0.5}), quiet, contested=True) == 1
    # a pass where a pon is offered: 'contested' draws; 'best' and 'other_kind' never fork a pass
    none = {"type": "none"}
    offered = _meta({41: 0.5, 45: 1.0})
    assert _draws(none, offered, quiet, contested=True) == 1
    assert _draws(none, offered, quiet) == 0
    assert _draws(none, offered, quiet, other_kind=True) == 0
    # a pass where only a ron is offered is not contested
    assert _draws(none, _meta({43: 0.5, 45: 1.0}), quiet, contested=True) == 0


class FakeBranch:
    """Stands for ``_Branch``: the seats its table asks next are ``FakeBranch.next_seats``."""
    next_seats = ()

    def __init__(self, parent, seat, meta, action, actions):
        self.done, self.cancelled, self.action = False, False, action
        self.obs = dict.fromkeys(FakeBranch.next_seats)

    def cancel(self):
        self.cancelled = True


def test_a_pass_forks_only_when_the_branch_executes_its_call(monkeypatch):
    import mortal.play.counterfactual as cf_mod
    monkeypatch.setattr(cf_mod, "_Branch", FakeBranch)
    monkeypatch.setattr(cf_mod, "reaction_from_index", lambda state, index: {"type": "pon"})
    history = _riichi_kyoku()[:3]
    dec = SimpleNamespace(reaction={"type": "none"}, meta=_meta({41: 0.5, 45: 1.0}))

    def game():
        return SimpleNamespace(split="a", history=[history, [], [], []], states=[None] * 4, branches=set(),
                               new_branches=[], pass_metas=[[], [], [], []],
                               obs={0: SimpleNamespace(select_action_from_mjai=lambda reaction: "pon")})

    # another seat acts next on the branch's table (its pon or ron came first): the pon was not executed
    FakeBranch.next_seats = (2,)
    g = game()
    assert fork(g, {0: dec}, {}, rate=1.0, rng=random.Random(0), contested=True) is None
    assert g.new_branches == [] and g.pass_metas == [[], [], [], []]
    # the caller acts next: the branch forks, and the pass's record waits for the log at the answered event
    FakeBranch.next_seats = (0,)
    g = game()
    b = fork(g, {0: dec}, {}, rate=1.0, rng=random.Random(0), contested=True)
    assert b is not None and b.action == 41 and b.kind == "pass->call" and g.new_branches == [b]
    assert g.pass_metas[0] == [(2, {"actor": 0, "meta": dec.meta})]


# ---------------------------------------------------------------- a pass's branch in the log and the loader


def test_a_pass_record_is_logged_on_the_event_it_answered():
    meta = {"q_values": [0.5, 1.0], "mask_bits": (1 << 41) | (1 << 45)}
    passes = [[], [(3, {"actor": 1, "meta": meta})], [], []]
    q0 = [[({"type": "dahai", "pai": "5s"}, None)], [], [], []]
    lines, _ = kyoku_lines(_views(), q0, {id(meta)}, passes)  # its branch still runs
    assert isinstance(lines[2], tuple)
    meta["counterfactual"] = {"action": 41, "next": [1, 0, 0, 25000, 26000, 24000, 25000]}
    assert render_line(lines[2]) == (
        '{"actor":0,"pai":"5s","tsumogiri":true,"type":"dahai","pass":{"actor":1,"meta":{"q_values":[0.5,1.0],'
        '"mask_bits":37383395344384,"counterfactual":{"action":41,"next":[1,0,0,25000,26000,24000,25000]}}}}')
    # ended before the kyoku did: written at once; a branch dropped (no record): nothing written
    lines, _ = kyoku_lines(_views(), q0, frozenset(), passes)
    assert lines[2] == render_line(lines[2]) and '"pass":{"actor":1' in lines[2]
    lines, _ = kyoku_lines(_views(), q0, frozenset(), [[], [(3, {"actor": 1, "meta": {}})], [], []])
    assert lines[2] == '{"actor":0,"pai":"5s","tsumogiri":true,"type":"dahai"}'


class Menzen(PriorityEngine):
    """PriorityEngine that never calls (a large bonus on the pass), so closed hands can declare riichi."""

    def __init__(self, name, seed, guard=False):
        super().__init__(name, seed, guard)
        self.bonus[45] = 5.0


# Hands by tile kind (0-8 m, 9-17 p, 18-26 s, 27-33 E S W N P F C): the dealer (seat 0) and seat 2 are tenpai,
# seats 1 and 3 far from it; the dealer draws E first.
_HANDS = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
          [27, 27, 28, 29, 30, 1, 4, 7, 13, 16, 19, 22, 25],
          [18, 19, 20, 21, 22, 23, 24, 25, 26, 10, 11, 17, 17],
          [31, 31, 32, 33, 2, 5, 14, 15, 20, 23, 28, 29, 30]]


def _rigged_wall(nonce, key, kyoku_index, honba):
    """A 136-tile wall (riichienv ids, kind = id // 4) dealing ``_HANDS``: riichienv deals blocks of 4 to seats
    0-3 three times (wall[16 r + 4 s:...]), then wall[48 + s], and the dealer draws wall[52]."""
    pools = {k: list(range(4 * k, 4 * k + 4)) for k in range(34)}
    wall = [None] * 136
    for s, hand in enumerate(_HANDS):
        for j, k in enumerate(hand):
            wall[16 * (j // 4) + 4 * s + j % 4 if j < 12 else 48 + s] = pools[k].pop()
    wall[52] = pools[27].pop()
    rest = [t for k in range(34) for t in pools[k]]
    random.Random(nonce + kyoku_index + honba).shuffle(rest)
    it = iter(rest)
    return [t if t is not None else next(it) for t in wall]


def test_contested_arena_branches_only_contested_decisions(tmp_path, monkeypatch, two_kyoku):  # noqa: F811
    import mortal.play.game as game_mod
    monkeypatch.setattr(game_mod, "kyoku_wall", _rigged_wall)
    d = tmp_path / "c"
    arena = OneVsThree(disable_progress_bar=True, log_dir=str(d), counterfactual_rate=1.0,
                       counterfactual_alternative="contested")
    arena.py_vs_py(Menzen("trainee", 1), Menzen("baseline", 2, guard=True), seed_start=(100, 42), seed_count=1)
    kinds = arena.counterfactual_kinds
    assert {"riichi->dama", "pass->call", "push->fold", "fold->push"} <= set(kinds)
    assert sum(f for f, _ in kinds.values()) == arena.counterfactual["forked"]
    assert sum(s for _, s in kinds.values()) == arena.counterfactual["scenes"] > 0
    loader = GameplayLoader(3, player_names=["trainee"])
    found = {}
    for p in sorted(d.iterdir()):
        events = read_log(p)
        check_log(events, events[0]["names"])  # a "pass" key does not trouble PlayerState
        trainee = events[0]["names"].index("trainee")
        for i, ev in enumerate(events):
            meta = ev.get("meta")
            if ev.get("actor") != trainee or not isinstance(meta, dict) or ev["type"] not in (
                    "dahai", "reach", "chi", "pon", "daiminkan", "kakan", "ankan"):
                continue
            start = max(j for j in range(i) if events[j]["type"] == "start_kyoku")
            taken = event_to_label(ev)
            want = contested_action(meta, taken, riichi_genbutsu(events[start:i], trainee))
            if "counterfactual" in meta:  # every branch is the contested alternative
                assert want is not None and meta["counterfactual"]["action"] == want[1], ev
            elif ev["type"] in ("dahai", "reach"):  # at rate 1 every contested discard or riichi forked
                assert want is None, ev
        games = loader.load_log_file(str(p))
        assert loader.cf_ignored == 0
        for g in games:
            for i in np.flatnonzero(g.cf_actions >= 0):
                a, b = int(g.actions[i]), int(g.cf_actions[i])
                safe = cg._genbutsu_at(events, int(g.event_idx[i]), g.player_id) if a < 37 and b < 37 else None
                kind = cg.contested_kind(a, b, safe)
                assert kind is not None, (a, b)
                found[kind] = found.get(kind, 0) + 1
    # the logs hold every recorded branch, the passes' included (read from the "pass" key)
    assert found.get("pass->call", 0) > 0
    assert sum(found.values()) == arena.counterfactual["recorded"]
