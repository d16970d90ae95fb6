"""Counterfactual rollouts with common random numbers (``[train_play] counterfactual_rate``,
``[online] counterfactual_weight``): the loss term by hand, the arena's branches (a branch that repeats the taken
action must replay the real kyoku exactly), the loader's columns, and a self-play round to a trainer step."""

import gzip
import json
import math

import numpy as np
import pytest
import torch

import mortal.play.arena as arena_mod
import mortal.play.counterfactual as cf_mod
from mortal.data.dataloader import FileDatasetsIter, _game_columns
from mortal.data.gameplay import GameplayLoader
from mortal.data.grp import grand_kyoku
from mortal.data.reward import RewardCalculator
from mortal.features.action import event_to_label
from mortal.learning.loss import LossWeights, counterfactual_term, learner_loss
from mortal.play.agent import MortalBatchAgent
from mortal.play.arena import OneVsThree
from mortal.play.counterfactual import counterfactual_action

from test_arena import PriorityEngine, read_log

PTS = [6.0, 4.0, 2.0, 0.0]


# ---------------------------------------------------------------- the loss term


def test_counterfactual_term_by_hand():
    inf = math.inf
    q = torch.tensor([[1.0, 2.0, -inf, 0.5],
                      [0.0, 3.0, 1.0, -inf],
                      [5.0, 5.0, 5.0, 5.0],
                      [2.0, -1.0, 0.0, 4.0]], requires_grad=True)
    actions = torch.tensor([0, 1, 2, 3])
    cf_actions = torch.tensor([1, 2, -1, 0])  # row 2 has no branch and is ignored (its inf-free q does not count)
    cf_deltas = torch.tensor([0.5, -1.0, 100.0, -3.0])
    # row 0: (2 - 1) - 0.5 = 0.5 -> 0.25; row 1: (1 - 3) + 1 = -1 -> 1; row 3: (2 - 4) + 3 = 1 -> 1
    loss = counterfactual_term(q, actions, cf_actions, cf_deltas)
    assert loss.item() == pytest.approx((0.25 + 1 + 1) / 3)
    loss.backward()
    # d/dq of row 0: 2 * 0.5 / 3 at the alternative, minus that at the taken action
    assert q.grad[0, 1].item() == pytest.approx(1 / 3) and q.grad[0, 0].item() == pytest.approx(-1 / 3)
    assert (q.grad[2] == 0).all()
    none = counterfactual_term(q, actions, torch.full((4,), -1), cf_deltas)
    assert none.item() == 0.0


def test_learner_loss_adds_the_weighted_term_only_when_on():
    torch.manual_seed(0)
    q = torch.randn(4, 46)
    masks = torch.ones(4, 46, dtype=torch.bool)
    actions = torch.tensor([0, 1, 2, 3])
    args = (q, torch.zeros(4, 4), actions, torch.zeros(4), torch.zeros(4, dtype=torch.int64))
    cf = dict(cf_actions=torch.tensor([5, -1, -1, -1]), cf_deltas=torch.tensor([0.25, 0.0, 0.0, 0.0]))
    on = LossWeights.resolve(online=True, min_q_weight=5, online_min_q_weight=0, anchor_weight=0,
                             next_rank_weight=0, calibrated=False, counterfactual_weight=2.0)
    off = on._replace(counterfactual=0.0)
    t_on = learner_loss(*args, masks=masks, online_rows=4, weights=on, **cf)
    t_off = learner_loss(*args, masks=masks, online_rows=4, weights=off, **cf)
    expected = ((q[0, 5] - q[0, 0]) - 0.25) ** 2
    assert t_off.counterfactual_loss is None
    assert t_on.counterfactual_loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert (t_on.total - t_off.total).item() == pytest.approx(2.0 * expected.item(), rel=1e-5)
    # offline training never has the term
    assert LossWeights.resolve(online=False, min_q_weight=5, online_min_q_weight=0, anchor_weight=0,
                               next_rank_weight=0, calibrated=False, counterfactual_weight=2.0).counterfactual == 0


# ---------------------------------------------------------------- the arena


def test_counterfactual_action_is_the_best_other_legal_action():
    meta = {"mask_bits": (1 << 3) | (1 << 7) | (1 << 45), "q_values": [0.5, 0.9, 0.1]}
    assert counterfactual_action(meta, 7) == 3
    assert counterfactual_action(meta, 3) == 7
    assert counterfactual_action({"mask_bits": 1 << 3, "q_values": [0.5]}, 3) is None
    assert counterfactual_action({"mask_bits": 3, "q_values": [0.5]}, 0) is None  # inconsistent meta


def test_counterfactual_action_of_another_kind():
    # legal: discards 3 and 7, riichi 37, pass 45 (as a table never offers, to test the kinds); Q 0.5 0.9 0.1 0.2
    meta = {"mask_bits": (1 << 3) | (1 << 7) | (1 << 37) | (1 << 45), "q_values": [0.5, 0.9, 0.1, 0.2]}
    assert counterfactual_action(meta, 3) == 7  # 'best': the other discard
    assert counterfactual_action(meta, 3, other_kind=True) == 45  # the best of riichi 0.1 and the pass 0.2
    assert counterfactual_action(meta, 37, other_kind=True) == 7  # riichi -> the best discard
    # a pon with chi and the pass legal: another kind; one discard among others only: none
    pon = {"mask_bits": (1 << 38) | (1 << 41) | (1 << 45), "q_values": [2.0, 3.0, -1.0]}
    assert counterfactual_action(pon, 41, other_kind=True) == 45  # the pass: a chi is a call as the pon is
    assert counterfactual_action(pon, 41) == 38  # 'best': the chi
    assert counterfactual_action({"mask_bits": (1 << 3) | (1 << 7), "q_values": [0.5, 0.9]}, 7,
                                 other_kind=True) is None


def test_counterfactual_action_refuses_non_finite_q():
    meta = {"mask_bits": (1 << 3) | (1 << 7) | (1 << 37), "q_values": [0.5, 0.9, 0.1]}
    assert counterfactual_action(meta, 37) == 7
    assert counterfactual_action({**meta, "q_values": [float("nan"), 0.9, 0.1]}, 37) is None


def test_kind_group_puts_chi_and_pon_together():
    from mortal.play.counterfactual import kind_group
    assert [kind_group(i) for i in (0, 36, 37, 38, 40, 41, 42, 43, 44, 45)] == [
        "discard", "discard", "riichi", "call", "call", "call", "kan", "hora", "ryukyoku", "pass"]
    with pytest.raises(ValueError):
        kind_group(46)


def test_other_kind_branches_change_the_kind_and_count_eligible_decisions_only(tmp_path, two_kyoku):
    from mortal.features.action import action_kind
    arena = OneVsThree(disable_progress_bar=True, log_dir=str(tmp_path / "k"), counterfactual_rate=1.0,
                       counterfactual_alternative="other_kind")
    arena.py_vs_py(PriorityEngine("trainee", 1), PriorityEngine("baseline", 2, guard=True),
                   seed_start=(100, 42), seed_count=1)
    logs = {p.name: read_log(p) for p in sorted((tmp_path / "k").iterdir())}
    found = list(_branched(logs))
    assert found and len(found) == arena.counterfactual["recorded"]
    for *_, ev, cf, _, _ in found:
        taken = event_to_label(ev)
        assert action_kind(cf["action"]) != action_kind(taken)
        assert cf["action"] == counterfactual_action(ev["meta"], taken, other_kind=True)
    # at rate 1 every eligible trainee reaction forks: none with an alternative of another kind is left out
    for events in logs.values():
        trainee = events[0]["names"].index("trainee")
        for ev in events:
            meta = ev.get("meta")
            if ev.get("actor") == trainee and isinstance(meta, dict) and "kan_select" not in meta \
                    and counterfactual_action(meta, event_to_label(ev), other_kind=True) is not None:
                assert "counterfactual" in meta or ev["type"] in ("chi", "pon", "daiminkan"), ev


def _run(log_dir, rate, seed_count=1, seed=0):
    arena = OneVsThree(disable_progress_bar=True, log_dir=str(log_dir), counterfactual_rate=rate,
                       counterfactual_seed=seed)
    ranks = arena.py_vs_py(PriorityEngine("trainee", 1), PriorityEngine("baseline", 2, guard=True),
                           seed_start=(100, 42), seed_count=seed_count)
    return arena, ranks, {p.name: read_log(p) for p in sorted(log_dir.iterdir())}


def _branched(logs):
    """(log name, index, event, its counterfactual record, the real next start_kyoku or end_game, the log)."""
    for name, events in logs.items():
        trainee = events[0]["names"].index("trainee")
        for i, ev in enumerate(events):
            cf = (ev.get("meta") or {}).get("counterfactual")
            if cf is None:
                continue
            assert ev["actor"] == trainee, (name, i)
            nxt = next(e for e in events[i + 1:] if e["type"] in ("start_kyoku", "end_game"))
            yield name, i, ev, cf, nxt, events


def _final_scores(events):
    from mortal.data.grp import Grp
    return Grp.load_events(events).final_scores.tolist()


@pytest.mark.slow
def test_branches_force_a_legal_other_action_and_record_the_outcome(tmp_path, two_kyoku):
    arena, ranks, logs = _run(tmp_path / "cf", 1.0)
    assert sum(ranks) == 4 and len(logs) == 4
    found = list(_branched(logs))
    c = arena.counterfactual
    assert c["forked"] == c["recorded"] + c["dropped"] and len(found) == c["recorded"] > 50
    assert c["scenes"] > 0
    for name, i, ev, cf, nxt, _ in found:
        meta = ev["meta"]
        assert set(cf) in ({"action", "next"}, {"action", "final"})
        legal = [a for a in range(46) if meta["mask_bits"] >> a & 1]
        assert cf["action"] in legal and cf["action"] != event_to_label(ev)
        assert cf["action"] == counterfactual_action(meta, event_to_label(ev))
        assert "kan_select" not in meta
        if "next" in cf:
            assert len(cf["next"]) == 7 and 0 <= cf["next"][0] < 12 and sum(cf["next"][3:]) + 1000 * cf["next"][2] \
                == 100000
        else:
            assert len(cf["final"]) == 4 and sum(cf["final"]) == 100000
    # the pairing is informative: some branches end the kyoku otherwise than the real game
    assert any(cf.get("next") != _real_next(nxt, events) for *_, cf, nxt, events in found)


def _real_next(nxt, events):
    if nxt["type"] == "start_kyoku":
        return [grand_kyoku(nxt["bakaze"], nxt["kyoku"]), nxt["honba"], nxt["kyotaku"], *nxt["scores"]]
    return None


@pytest.mark.slow
def test_a_branch_that_repeats_the_taken_action_replays_the_real_kyoku(tmp_path, monkeypatch, two_kyoku):
    # PriorityEngine decides each row alone (deterministic, batch-independent): the branch plays the real kyoku
    # again on the cloned table with rebuilt states, so its outcome must be the real one exactly
    monkeypatch.setattr(cf_mod, "counterfactual_action", lambda meta, taken, other_kind=False: taken)
    arena, _, logs = _run(tmp_path / "same", 1.0)
    found = list(_branched(logs))
    # every branch recorded, but those of a call another seat's ron superseded (dropped: never in the log)
    assert len(found) == arena.counterfactual["recorded"] > 50
    n_final = 0
    for name, i, ev, cf, nxt, events in found:
        assert cf["action"] == event_to_label(ev)
        if nxt["type"] == "start_kyoku":
            assert cf == {"action": cf["action"], "next": _real_next(nxt, events)}, (name, i)
        else:
            n_final += 1
            assert cf == {"action": cf["action"], "final": _final_scores(events)}, (name, i)
    assert n_final > 0


@pytest.mark.slow
def test_rate_zero_logs_are_those_of_before(tmp_path):
    # sha256 of the four logs' names and decompressed text as the arena wrote them before counterfactual branches
    # existed (commit aadacf3, same run), with the timing field eval_time_ns taken out: byte for byte otherwise
    import hashlib
    import re
    d = tmp_path / "zero"
    arena, _, logs = _run(d, 0.0)
    assert not list(_branched(logs)) and arena.counterfactual["forked"] == 0
    h = hashlib.sha256()
    for p in sorted(d.iterdir()):
        h.update(p.name.encode())
        h.update(re.sub(rb'"eval_time_ns":\d+', b"", gzip.decompress(p.read_bytes())))
    assert h.hexdigest() == "e700277fd06f4005d68a950116ba7ad2f86c2b0930626068e746d4ad57046017"


class Stateful(MortalBatchAgent):
    stateless = False


def test_no_branches_for_agents_that_keep_state(caplog, monkeypatch, two_kyoku):
    monkeypatch.setattr(arena_mod, "_CF_WARNED", False)
    arena = OneVsThree(disable_progress_bar=True, counterfactual_rate=1.0)
    arena.py_vs_py(PriorityEngine("trainee", 1), Stateful(PriorityEngine("baseline", 2)), seed_start=(7, 1),
                   seed_count=1)
    arena.py_vs_py(PriorityEngine("trainee", 1), Stateful(PriorityEngine("baseline", 2)), seed_start=(7, 1),
                   seed_count=1)
    assert arena.counterfactual["forked"] == 0
    assert sum("no counterfactual branches" in r.message for r in caplog.records) == 1


# ---------------------------------------------------------------- the loader

from conftest import DATA_DIR  # noqa: E402

RIICHIENV = DATA_DIR / "riichienv_selfplay_hanchan.jsonl"


def _with_counterfactuals(records):
    """The fixture log's lines with ``meta.counterfactual`` written on seat 0's reaction events: ``records`` maps
    the sample number of seat 0 to ``(action or 'other', record)``; 'other' = a legal action that is not the
    label. Returns (log text, the plain log's seat-0 Gameplay, {sample: the action written})."""
    lines = RIICHIENV.read_text().splitlines()
    plain = GameplayLoader(3, player_names=["0"]).load_log("\n".join(lines) + "\n")[0]
    events = [json.loads(x) for x in lines]
    written = {}
    for n, (action, record) in records.items():
        cur = int(plain.event_idx[n])
        nxt = cur + 1 + (events[cur + 1]["type"] in ("reach_accepted", "dora"))
        ev = events[nxt]
        assert ev["actor"] == 0 and event_to_label(ev) == plain.actions[n]
        if action == "other":
            action = int(next(a for a in np.flatnonzero(plain.masks[n]) if a != plain.actions[n]))
        ev["meta"] = {"q_values": [], "mask_bits": 0, "counterfactual": {"action": action, **record}}
        lines[nxt] = json.dumps(ev, separators=(",", ":"))
        written[n] = action
    return "\n".join(lines) + "\n", plain, written


def _first_discard_of_kyoku(plain, kyoku):
    return int(next(i for i in range(len(plain)) if plain.at_kyoku[i] == kyoku and plain.actions[i] < 37
                    and plain.masks[i].sum() > 1))


def test_loader_records_the_counterfactual_and_its_points_delta():
    plain = GameplayLoader(3, player_names=["0"]).load_log(RIICHIENV.read_text())[0]
    a, b, c = (_first_discard_of_kyoku(plain, k) for k in (0, 1, 2))
    # sample c: an action that is not legal there (a tile seat 0 cannot discard): ignored, the log still loads
    illegal = int(next(x for x in range(37) if not plain.masks[c][x]))
    text, _, written = _with_counterfactuals({
        a: ("other", {"next": [1, 0, 0, 30000, 20000, 25000, 25000]}),
        b: ("other", {"final": [40000, 20000, 20000, 20000]}),
        c: (illegal, {"next": [3, 0, 0, 25000, 25000, 25000, 25000]})})
    loader = GameplayLoader(3, player_names=["0"])
    game = loader.load_log(text)[0]
    assert loader.cf_ignored == 1
    expected = np.full(len(game), -1)
    expected[a], expected[b] = written[a], written[b]
    # a hostile trial's record of 10**300 points became an infinite reward and NaN weights: ignored as malformed
    huge, _, _ = _with_counterfactuals({a: ("other", {"next": [1, 0, 0, 10 ** 300, 25000, 25000, 25000]}),
                                        b: ("other", {"final": [40000, 20000, 20000, -1_000_001]})})
    bounded = GameplayLoader(3, player_names=["0"])
    assert (bounded.load_log(huge)[0].cf_actions == -1).all() and bounded.cf_ignored == 2
    np.testing.assert_array_equal(game.cf_actions, expected)
    np.testing.assert_array_equal(game.actions, plain.actions)  # the samples are those of the plain log

    ds = FileDatasetsIter(3, [], PTS, None, reward="points")
    list(ds)  # builds the reward calculator
    feature = game.grp.feature.copy()
    cols = _game_columns(game, ds.reward_calc)
    cf_actions, cf_deltas = cols[6], cols[7]
    np.testing.assert_array_equal(cf_actions, expected)
    # seat 0 after E1 (the E2 start): 21000 -> branch 30000: +9000 points x 6 / 30000 = +1.8 pt
    assert round(feature[1, 3] * 1e4) == 21000
    assert cf_deltas[a] == pytest.approx(1.8)
    # after E2 (the E3 start) seat 0 has s; the branch ends the game with 40000: (40000 - s) x 2e-4
    s = round(feature[2, 3] * 1e4)
    assert cf_deltas[b] == pytest.approx((40000 - s) * 2e-4)
    assert (cf_deltas[expected < 0] == 0).all() and cf_deltas.dtype == np.float32


def test_loader_grp_delta_is_the_grp_value_of_the_branch_minus_the_real_one():
    from mortal.model.networks import GRP
    torch.manual_seed(0)
    grp = GRP().double()  # float64 as the trainer's
    plain = GameplayLoader(3, player_names=["0"]).load_log(RIICHIENV.read_text())[0]
    a, b = (_first_discard_of_kyoku(plain, k) for k in (1, 2))
    branch_next = [2, 0, 1, 30000, 19000, 25000, 25000]
    text, _, _ = _with_counterfactuals({a: ("other", {"next": branch_next}),
                                        b: ("other", {"final": [10000, 20000, 30000, 40000]})})
    game = GameplayLoader(3, player_names=["0"]).load_log(text)[0]
    feature, ranks = game.grp.feature.copy(), game.grp.rank_by_player.copy()
    ds = FileDatasetsIter(3, [], PTS, grp)
    list(ds)
    cf_deltas = _game_columns(game, ds.reward_calc)[7]
    calc = RewardCalculator(grp, PTS)
    exp_pts = (calc.calc_rank_prob(0, feature, ranks) @ calc.pts).numpy()
    # branch next: the GRP over E1, E2 and the branch's E3 row [2, 0, 1, 3.0, 1.9, 2.5, 2.5]
    seq = torch.as_tensor(np.vstack((feature[:2], [[2, 0, 1, 3.0, 1.9, 2.5, 2.5]])))
    with torch.inference_mode():
        p = grp.calc_matrix(grp([seq]))[0, 0].to(torch.float64)
    assert cf_deltas[a] == pytest.approx(float(p @ calc.pts) - exp_pts[2], abs=1e-6)
    # branch final: seat 0 last (10000): pts[3] = 0, minus E[pts] before E4
    assert cf_deltas[b] == pytest.approx(0.0 - exp_pts[3], abs=1e-6)


# ---------------------------------------------------------------- self-play round -> loader -> trainer step


@pytest.mark.slow
def test_self_play_round_with_counterfactuals_to_trainer_step(tmp_path, monkeypatch, two_kyoku):
    from conftest import load_tiny_config, trainer_on_round, write_baseline
    from mortal import client as cl
    from mortal.net import wire
    from mortal.play.player import TrainPlayer

    names = tmp_path / 'names.txt'
    names.write_text('trainee\n')  # the trainer learns from the trainee's seat only, as online
    config, _ = load_tiny_config(tmp_path, online=False, **{
        'control': {'batch_size': 8, 'save_every': 1000, 'test_every': 1000},
        'train_play.default': {'counterfactual_rate': 0.5},
        'dataset': {'player_names_files': [str(names)]}})
    write_baseline(config, config['baseline']['train']['state_file'], seed=3)
    client = cl.Client(config, train_player=TrainPlayer(config, {}, train_key=9),
                       remote=wire.Remote('127.0.0.1', 1))
    assert client.train_player.counterfactual_rate == 0.5
    rankings, files = client.train_player.train_play(client.mortal, client.dqn, 'cpu')
    assert rankings.sum() == 4 and len(files) == 4
    counts = client.train_player.counterfactual
    assert counts['recorded'] > 0 and counts['scenes'] > 0
    branched = [cf for f in files for *_, cf, _, _ in _branched({f: read_log(f)})]
    assert len(branched) == counts['recorded']

    trainer = trainer_on_round(tmp_path, config, files)
    # the term is online-only (LossWeights.resolve); this offline trainer reads the round's logs with it on
    trainer.loss_weights = trainer.loss_weights._replace(counterfactual=1.0)
    seen = []
    real_train_batch = trainer.train_batch

    def spy(*batch):
        seen.append((batch[6].clone(), batch[7].clone(), batch[2].clone(), batch[1].clone()))
        return real_train_batch(*batch)

    trainer.train_batch = spy
    trainer.run()
    cf_actions = torch.cat([s[0] for s in seen])
    cf_deltas = torch.cat([s[1] for s in seen])
    masks = torch.cat([s[2] for s in seen])
    actions = torch.cat([s[3] for s in seen])
    has = cf_actions >= 0
    # every branch of the trainee's seat became a sample (the last short batch may drop a few)
    assert 0 < int(has.sum()) <= len(branched)
    rows = torch.nonzero(has).flatten()
    assert masks[rows, cf_actions[rows]].all() and (cf_actions[rows] != actions[rows]).all()
    assert (cf_deltas[~has] == 0).all() and (cf_deltas[has] != 0).any()
    assert trainer.steps == len(seen) > 0
    assert trainer.stats['counterfactual_loss'] > 0  # the term was computed on those rows


def test_augmented_loader_swaps_the_counterfactual_action_with_the_tiles():
    plain = GameplayLoader(3, player_names=["0"]).load_log(RIICHIENV.read_text())[0]
    # a kyoku-0 discard whose sample has a legal manzu or pinzu alternative
    n = next(i for i in range(len(plain)) if plain.actions[i] < 37
             and any(a != plain.actions[i] and a < 18 for a in np.flatnonzero(plain.masks[i])))
    alt = int(next(a for a in np.flatnonzero(plain.masks[n]) if a != plain.actions[n] and a < 18))
    text, _, _ = _with_counterfactuals({n: (alt, {"next": [1, 0, 0, 25000, 25000, 25000, 25000]})})
    game = GameplayLoader(3, player_names=["0"], augmented=True).load_log(text)[0]
    assert game.cf_actions[n] == (alt + 9 if alt < 9 else alt - 9)
    assert game.masks[n][game.cf_actions[n]]
