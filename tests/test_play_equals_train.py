"""Play equals train: what a Mortal engine received at each decision in the arena is what the learner's loader
rebuilds from the written log for that decision.

Each test plays one duplicate deal (4 games) of tiny random models through a real play path (the client's
``TrainPlayer``, the trainer's ``TestPlayer``, ``mortal.play.evaluation.play_chunk``, also against RulebaseBots) at
feature version 3 or 4, recording every ``MortalEngine.react_batch`` row as the engine received it (observation,
mask) with the action it chose, and every decision the agents took (quick eval and bots included). The fast
variants end each game after 2-4 kyoku (``_end_games_early``); the ``slow`` ones play whole hanchan. Then each log goes through the learner's path
(``GameplayLoader`` as ``FileDatasetsIter.load_files`` builds it, then ``_game_columns``, the function that turns a
seat's ``Gameplay`` into the trainer's columns) and the two are compared decision for decision, for every seat the
loader yields and for the loader that keeps the trainee's seat only (the online learner's ``player_names``), the
counterfactual columns included where the client forks branches.

A mismatch names the game, seat and decision, the differing feature rows and the events around it.
"""

from __future__ import annotations

import gzip
import json
import math
import pathlib
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from mortal.data.dataloader import _game_columns
from mortal.data.gameplay import GameplayLoader
from mortal.features.packed_obs import packer, row_bytes, unpack
from mortal.data.reward import RewardCalculator
from mortal.features.action import HORA, KAN, event_to_label, kan_select_label
from mortal.play import agent as agent_mod
import mortal.play.game as game_mod
from mortal.play.game import SPLITS
from mortal.play.engine import MortalEngine
from mortal.play.kyoku_flow import KyokuOutcome

from conftest import load_tiny_config

PTS = [6.0, 4.0, 2.0, 0.0]
_OWN = frozenset({"dahai", "reach", "chi", "pon", "daiminkan", "kakan", "ankan", "hora"})
_SKIPPED_AS_NEXT = ("reach_accepted", "dora")


# ---------------------------------------------------------------- recording what the engine received


@dataclass
class Row:
    """One ``react_batch`` row: its scene, whether it is the kan-select row, the observation (packed, exact), the
    mask (46,) bool, the engine's action and Q values (46 floats)."""
    scene: object
    kan: bool
    packed: np.ndarray
    mask: np.ndarray
    action: int
    q: list


@dataclass
class Decided:
    """One scene an agent decided, with its ``Decision`` and its engine rows (none: quick eval or a bot). For an
    mjai bot's scene, ``state_packed``/``state_mask``: the version-3 observation (packed) and the mask of the seat's
    ``PlayerState`` at the decision, what an engine in that seat would have been given."""
    scene: object
    decision: object
    rows: list = field(default_factory=list)
    state_packed: np.ndarray | None = None
    state_mask: np.ndarray | None = None


class PlayRecord:
    """Wraps ``MortalBatchAgent.react`` / ``_encode_rows`` and ``MortalEngine.react_batch`` (for every engine of
    every path) to keep each decision and each row exactly as the engine received it, and ``MjaiBotAgent.react``
    to keep a bot seat's decisions with its state's observation and mask.

    What it relies on: ``_encode_rows`` returns the rows of the agent's next ``react_batch`` call in that order
    (``(scene, at_kan_select, ...)`` each); a ``Scene`` carries ``game``, ``seat``, ``events`` (every event the seat
    was fed since its previous scene), ``speculative`` and ``adopted``; counterfactual branches get game ids after
    the real games'. An arena or agent rewrite that moves these moves the hooks here with it."""

    def __init__(self, monkeypatch):
        self.decided: list[Decided] = []
        self._rows_of: dict[int, list] = {}
        self._pending: list = []
        real_encode = agent_mod.MortalBatchAgent._encode_rows
        real_react = agent_mod.MortalBatchAgent.react
        real_batch = MortalEngine.react_batch
        real_bot = agent_mod.MjaiBotAgent.react
        rec = self

        def encode_rows(agent, rows):
            out = real_encode(agent, rows)
            rec._pending = [(sc, kan) for sc, kan, _, _ in rows]
            return out

        def react_batch(engine, obs, masks, invisible_obs=None):
            pending, rec._pending = rec._pending, []
            assert len(pending) == len(obs), "react_batch rows do not match the agent's encoded rows"
            version = engine.version
            got = []
            for (sc, kan), o, m in zip(pending, obs, masks):
                packed = np.empty((1, row_bytes(version)), np.uint8)
                packer(version)(np.ascontiguousarray(o), packed, 0)
                # the record is exact: what it keeps unpacks to the very array the engine got
                assert np.array_equal(unpack(packed, version)[0], o)
                got.append((sc, kan, packed[0], np.array(m, dtype=bool)))
            out = real_batch(engine, obs, masks, invisible_obs)
            for (sc, kan, packed, mask), a, q in zip(got, out[0], out[1]):
                rec._rows_of.setdefault(id(sc), []).append(Row(sc, kan, packed, mask, int(a), list(q)))
            return out

        def react(agent, scenes):
            decisions = real_react(agent, scenes)
            for sc, dec in zip(scenes, decisions):
                rec.decided.append(Decided(sc, dec, rec._rows_of.pop(id(sc), [])))
            return decisions

        def bot_react(agent, scenes):
            decisions = real_bot(agent, scenes)
            for sc, dec in zip(scenes, decisions):
                obs, mask = agent_mod._encode(sc.state, 3, False)
                packed = np.empty((1, row_bytes(3)), np.uint8)
                packer(3)(obs, packed, 0)
                rec.decided.append(Decided(sc, dec, [], packed[0], np.array(mask, dtype=bool)))
            return decisions

        monkeypatch.setattr(agent_mod.MjaiBotAgent, "react", bot_react)
        monkeypatch.setattr(agent_mod.MortalBatchAgent, "_encode_rows", encode_rows)
        monkeypatch.setattr(agent_mod.MortalBatchAgent, "react", react)
        monkeypatch.setattr(MortalEngine, "react_batch", react_batch)

    def by_seat(self, games: int) -> dict:
        """``{(game, seat): [Decided, ...]}`` of the real games ``0 .. games - 1`` in decision order: a
        counterfactual branch's scenes (game ids from ``games`` on) and speculative scenes the arena did not adopt
        are no decisions of a logged game."""
        out: dict = {}
        for d in self.decided:
            sc = d.scene
            if sc.game >= games or (sc.speculative and not sc.adopted):
                continue
            out.setdefault((sc.game, sc.seat), []).append(d)
        return out


# ---------------------------------------------------------------- the learner's view of a log


@dataclass
class Sample:
    """One loader sample of one seat: its decision index among the seat's samples, log event index (the event
    after which it was taken), kan-select flag, packed obs, mask, action, counterfactual action and record."""
    n: int
    event_idx: int
    kan: bool
    packed: np.ndarray
    mask: np.ndarray
    action: int
    cf_action: int
    cf_record: object


def learner_samples(path, version: int, player_names=None) -> dict:
    """``{seat: [Sample, ...]}`` of the log at ``path`` through the trainer's path: ``GameplayLoader`` with the
    options ``FileDatasetsIter.load_files`` gives it (kan select always, no augmentation), then ``_game_columns``
    (the columns a training batch is cut from; the reward does not matter here)."""
    loader = GameplayLoader(version, player_names=player_names, augmented=False)
    calc = RewardCalculator(None, PTS, reward="points")
    out = {}
    for game in loader.load_log_file(path):
        event_idx = game.event_idx.copy()
        cf_records = list(game.cf_records)
        seat = game.player_id
        cols = _game_columns(game, calc)
        if cols is None:
            out[seat] = []
            continue
        packed, actions, masks, cf_actions = cols[0], cols[1], cols[2], cols[6]
        out[seat] = [Sample(n, int(e), n > 0 and e == event_idx[n - 1], packed[n], masks[n], int(actions[n]),
                            int(cf_actions[n]), cf_records[n]) for n, e in enumerate(event_idx)]
    return out


# ---------------------------------------------------------------- the comparison


def read_events(path) -> list:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def _around(events, idx, before=4, after=3) -> str:
    lo, hi = max(0, idx - before), min(len(events), idx + after + 1)
    return "\n".join(f"    {'>' if i == idx else ' '} [{i}] " + json.dumps({k: v for k, v in events[i].items()
                                                                          if k != "meta"})
                     for i in range(lo, hi))


def _obs_diff(a: np.ndarray, b: np.ndarray, version: int) -> str:
    """The feature rows (channels) in which two packed observations differ, with the differing columns."""
    oa, ob = unpack(a[None], version)[0], unpack(b[None], version)[0]
    rows = np.flatnonzero((oa != ob).any(axis=1))
    lines = [f"    {len(rows)} feature row(s) differ: {rows[:16].tolist()}"]
    for r in rows[:6]:
        cols = np.flatnonzero(oa[r] != ob[r])
        lines.append(f"      row {r}: " + ", ".join(f"col {c} played {oa[r, c]:.6g} loaded {ob[r, c]:.6g}"
                                                    for c in cols[:6]) + (" ..." if len(cols) > 6 else ""))
    return "\n".join(lines)


def _decision_positions(name: str, decided: list, events: list) -> list:
    """Log event index of each decision of one seat: within a kyoku the seat's events (after the ``start_game``
    the arena sends every kyoku) are those of the log from its ``start_kyoku`` on, masked; the last event before
    a decision is checked against the log's (type and actor)."""
    starts = [i for i, ev in enumerate(events) if ev["type"] == "start_kyoku"]
    kyoku, count, out = -1, 0, []
    last = None
    for d in decided:
        for raw in d.scene.events:
            ev = json.loads(raw)
            if ev["type"] == "start_game":
                continue
            if ev["type"] == "start_kyoku":
                kyoku, count = kyoku + 1, 0
            count += 1
            last = ev
        idx = starts[kyoku] + count - 1
        logged = events[idx]
        assert (logged["type"], logged.get("actor")) == (last["type"], last.get("actor")), (
            f"{name} seat {d.scene.seat}: the arena's event before a decision {last} is not the log's [{idx}]\n"
            + _around(events, idx))
        out.append(idx)
    return out


def _preempted(events, idx, seat) -> bool:
    """Whether the log shows no action of ``seat`` right after event ``idx`` (another seat's call or ron took
    the turn), so the loader has no label for the decision there."""
    j = idx + 1
    while events[j]["type"] in _SKIPPED_AS_NEXT:
        j += 1
    return not (events[j]["type"] in _OWN and events[j].get("actor") == seat)


def _chosen(decision) -> int:
    return event_to_label(decision.reaction)


def compare_game(name: str, path, decided_by_seat: dict, samples_by_seat: dict, version: int,
                 agari_guard: dict) -> dict:
    """Assert that every loader sample of the log at ``path`` is the decision the arena took there, with the
    observation and mask the engine received (quick-eval decisions and kan tiles chosen without the engine: the
    action only; an mjai bot's seat: the mask of its state, and at version 3 its observation), and that every
    decision the arena took is a sample unless another seat's call or ron took the turn. ``agari_guard``: seat ->
    whether its agent may overrule the engine's hora. Returns counts."""
    events = read_events(path)
    counts = {"rows": 0, "quick": 0, "kan_alone": 0, "preempted": 0, "cf": 0, "bot": 0}
    for seat, samples in samples_by_seat.items():
        decided = decided_by_seat.get(seat, [])
        positions = _decision_positions(name, decided, events)
        at = {}
        for idx, d in zip(positions, decided):
            assert idx not in at, f"{name} seat {seat}: two decisions after log event {idx}\n" + _around(events, idx)
            at[idx] = d
        used = set()
        for s in samples:
            where = (f"{name} seat {seat} decision {s.n} (after log event {s.event_idx}"
                     f"{', kan select' if s.kan else ''})")
            d = at.get(s.event_idx)
            assert d is not None, f"{where}: the loader has a decision the arena never asked for\n" + _around(
                events, s.event_idx)
            used.add(s.event_idx)
            row = next((r for r in d.rows if r.kan == s.kan), None)
            final = _chosen(d.decision)
            if s.kan:
                assert final == KAN, f"{where}: a kan-select sample but the arena chose {d.decision.reaction}"
            if row is None and d.state_mask is not None:  # an mjai bot's seat
                assert s.action == (kan_select_label(d.decision.reaction) if s.kan else final), (
                    f"{where}: the bot took {d.decision.reaction}, the loader labels {s.action}\n"
                    + _around(events, s.event_idx))
                if not s.kan:
                    if not np.array_equal(d.state_mask, s.mask):
                        pytest.fail(f"{where}: masks differ: the bot's state had legal "
                                    f"{np.flatnonzero(d.state_mask).tolist()}, loaded legal "
                                    f"{np.flatnonzero(s.mask).tolist()}\n  events:\n" + _around(events, s.event_idx))
                    if version == 3 and not np.array_equal(d.state_packed, s.packed):
                        pytest.fail(f"{where}: the observation of the bot's state differs from the loader's\n"
                                    + _obs_diff(d.state_packed, s.packed, version) + "\n  events:\n"
                                    + _around(events, s.event_idx))
                    counts["bot"] += 1
                continue
            if row is None:
                if s.kan:  # a single candidate (or a daiminkan): the arena asks the engine nothing
                    assert s.mask.sum() == 1 and s.action == kan_select_label(d.decision.reaction), (
                        f"{where}: kan tile {s.action} with mask {np.flatnonzero(s.mask).tolist()}, decided "
                        f"without the engine: {d.decision.reaction}")
                    counts["kan_alone"] += 1
                else:
                    assert d.decision.meta is None, f"{where}: the engine got no row for this decision"
                    assert s.action == final, (f"{where}: quick eval took {final}, the loader labels {s.action}\n"
                                               + _around(events, s.event_idx))
                    counts["quick"] += 1
                continue
            counts["rows"] += 1
            if not np.array_equal(row.packed, s.packed):
                pytest.fail(f"{where}: the observation the engine received differs from the loader's\n"
                            + _obs_diff(row.packed, s.packed, version) + "\n  events:\n"
                            + _around(events, s.event_idx))
            if not np.array_equal(row.mask, s.mask):
                pytest.fail(f"{where}: masks differ: played legal {np.flatnonzero(row.mask).tolist()}, loaded "
                            f"legal {np.flatnonzero(s.mask).tolist()}\n  events:\n" + _around(events, s.event_idx))
            taken = row.action if s.kan else final
            assert s.action == taken, (f"{where}: the arena took action {taken} ({d.decision.reaction}), the loader "
                                       f"labels {s.action}\n" + _around(events, s.event_idx))
            if not s.kan and row.action != final:  # only the rule-based agari guard overrules the engine
                assert agari_guard[seat] and row.action == HORA, f"{where}: engine chose {row.action}, took {final}"
            # counterfactual branch: the loader's columns are the arena's fork
            cf = (d.decision.meta or {}).get("counterfactual")
            if cf is None:
                assert s.cf_action == -1 and s.cf_record is None, (
                    f"{where}: the loader has a counterfactual ({s.cf_action}, {s.cf_record}) the arena never forked")
            else:
                kind = "final" if "final" in cf else "next"
                assert (s.cf_action, s.cf_record) == (cf["action"], (kind, cf[kind])), (
                    f"{where}: branch {cf} played, the loader has ({s.cf_action}, {s.cf_record})")
                # the branch took the highest-Q other legal action of those the engine returned
                q = np.where(row.mask, np.asarray(row.q, dtype=np.float64), -math.inf)
                q[final] = -math.inf
                assert cf["action"] == int(np.argmax(q)), f"{where}: branch action {cf['action']} is not the best other"
                counts["cf"] += 1
        for idx, d in at.items():
            if idx in used:
                continue
            assert _preempted(events, idx, seat), (
                f"{name} seat {seat}: the arena's decision {d.decision.reaction} after log event {idx} is no "
                f"sample of the loader\n" + _around(events, idx))
            counts["preempted"] += 1
    return counts


def compare_logs(record: PlayRecord, log_dir, nonce: int, key: int, version: int, trainee: str,
                 guards: dict, *, games: int = 4) -> dict:
    """``compare_game`` over the ``games`` logs of one duplicate deal (nonce, key), every seat the loader yields
    (no name filter) and the loader that keeps the seat named ``trainee`` only. ``guards``: name -> whether that
    side's engine has the agari guard. Returns the summed counts (``ev_<type>``: events of that type in the
    logs)."""
    by_seat = record.by_seat(games)
    total: dict = {}
    for gid in range(games):
        split = SPLITS[gid % 4]
        path = log_dir / f"{nonce + gid // 4}_{key}_{split}.json.gz"
        assert path.is_file(), f"no log {path.name} (the arena failed a game?)"
        evs = read_events(path)
        names = evs[0]["names"]
        for ev in evs:  # what the games covered, for the callers' checks
            total["ev_" + ev["type"]] = total.get("ev_" + ev["type"], 0) + 1
        assert names[SPLITS.index(split)] == trainee
        guard = {s: guards[n] for s, n in enumerate(names)}
        seats = {s: by_seat.get((gid, s), []) for s in range(4)}
        every = learner_samples(path, version)
        assert sorted(every) == [0, 1, 2, 3]
        mine = learner_samples(path, version, player_names=[trainee])
        assert list(mine) == [SPLITS.index(split)]
        for got in (every, mine):
            counts = compare_game(f"game {path.name}", path, seats, got, version, guard)
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
    return total


# ---------------------------------------------------------------- the play paths


def _write_checkpoint(config, filename, version: int, seed: int):
    from mortal.model.networks import AuxNet, Brain, DQN
    torch.manual_seed(seed)
    r = config["resnet"]
    brain = Brain(version=version, conv_channels=r["conv_channels"], num_blocks=r["num_blocks"])
    dqn = DQN(version=version)
    torch.save({"mortal": brain.state_dict(), "current_dqn": dqn.state_dict(), "aux_net": AuxNet((4,)).state_dict(),
                "config": config, "steps": 0}, filename)


def _setup(tmp_path, monkeypatch, version: int, hanchan: bool, **overrides):
    """The tiny config at ``version`` with two checkpoints, games cut short unless ``hanchan``, and a recorder of
    the engines' rows: ``(config, brain, dqn, record)``."""
    if not hanchan:
        _end_games_early(monkeypatch)
    config, _ = load_tiny_config(tmp_path, online=False, control={"version": version}, **overrides)
    _write_checkpoint(config, config["baseline"]["train"]["state_file"], version, seed=3)
    _write_checkpoint(config, config["control"]["state_file"], version, seed=5)
    from mortal.model.checkpoint import load_model_pair
    brain, dqn, got = load_model_pair(config["control"]["state_file"])
    assert got == version
    return config, brain, dqn, PlayRecord(monkeypatch)


def _end_games_early(monkeypatch):
    """Games (and counterfactual branches, same flow) end once the next kyoku would be E3 or later or at honba 2
    or more: 2-4 kyoku a game, each on a fresh table, as ``(kyoku index, honba)`` rises with every kyoku. Keeps
    the fast subset fast; the ``slow`` variants play whole hanchan."""
    real = game_mod.next_kyoku

    def short(state, result):
        out = real(state, result)
        if out.next is not None and (out.next.kyoku_index >= 2 or out.next.honba >= 2):
            return KyokuOutcome(None, out.scores, out.kyotaku)
        return out

    monkeypatch.setattr(game_mod, "next_kyoku", short)


def _assert_covered(counts: dict, hanchan: bool) -> None:
    """The games were not trivial: every game had a second kyoku (the per-kyoku table reset), there were calls and
    a kan's new dora (the seeds are chosen for it: an event that is silently lost on the way to a seat shows as a
    feature difference only after it), and hundreds of engine rows to compare."""
    assert counts["ev_start_kyoku"] >= 4 * (4 if hanchan else 2), counts
    assert counts.get("ev_chi", 0) + counts.get("ev_pon", 0) > 0 and counts.get("ev_dora", 0) > 0, counts
    assert counts["rows"] > (2000 if hanchan else 300), counts


# (version, whole hanchan): the fast subset plays short games at both versions, the slow one whole hanchan
PLAYS = [pytest.param(3, False, id="v3"), pytest.param(4, False, id="v4"),
         pytest.param(3, True, id="v3-hanchan", marks=pytest.mark.slow),
         pytest.param(4, True, id="v4-hanchan", marks=pytest.mark.slow)]


@pytest.mark.parametrize("version,hanchan", PLAYS)
def test_self_play_round_equals_what_the_learner_loads(tmp_path, monkeypatch, version, hanchan):
    """The client's round (``TrainPlayer.train_play``, exploring trainee vs greedy baseline); at version 3 with
    counterfactual branches (version 4 forks none), whose columns must be the forks'."""
    from mortal.play.player import TrainPlayer
    rate = 0.3 if version == 3 else 0.0
    config, brain, dqn, record = _setup(tmp_path, monkeypatch, version, hanchan, **{"train_play.default": {
        "boltzmann_epsilon": 0.2, "boltzmann_temp": 1.0, "counterfactual_rate": rate}})
    key = {3: 7, 4: 10}[version]  # deals with a kan (see _assert_covered)
    player = TrainPlayer(config, {}, train_key=key)
    rankings, files = player.train_play(brain, dqn, "cpu")
    assert len(files) == 4 and rankings.sum() == 4
    # gzip header byte 8 (XFL): 4 = fastest (level 1) for the logs the learner reads once
    assert [pathlib.Path(f).read_bytes()[8] for f in files] == [4] * 4
    counts = compare_logs(record, tmp_path / "train_play", 10000, key, version, "trainee",
                          {"trainee": False, "baseline": True})
    _assert_covered(counts, hanchan)
    if rate:
        assert counts["cf"] > 0 and player.counterfactual["recorded"] > 0


@pytest.mark.parametrize("version,hanchan", PLAYS)
def test_test_play_equals_what_the_learner_loads(tmp_path, monkeypatch, version, hanchan):
    """The trainer's test play (``TestPlayer``: greedy challenger 'mortal' vs the ``[baseline.test]`` engine)."""
    from mortal.play.player import TEST_SEED, TestPlayer
    config, brain, dqn, record = _setup(tmp_path, monkeypatch, version, hanchan)
    TestPlayer(config).test_play(1, brain, dqn, "cpu")
    assert {p.read_bytes()[8] for p in (tmp_path / "test_play").glob("*.json.gz")} == {2}  # level 9, as Mortal
    counts = compare_logs(record, tmp_path / "test_play", TEST_SEED[0], TEST_SEED[1], version, "mortal",
                          {"mortal": False, "baseline": True})
    _assert_covered(counts, hanchan)


@pytest.mark.parametrize("version,hanchan", PLAYS)
def test_evaluation_equals_what_the_learner_loads(tmp_path, monkeypatch, version, hanchan):
    """``mortal.play.evaluation.play_chunk`` (what ``play_duplicate`` runs in each worker) from two checkpoints."""
    from mortal.play.evaluation import play_chunk
    config, _, _, record = _setup(tmp_path, monkeypatch, version, hanchan)
    chal = ("mortal", config["control"]["state_file"])
    champ = ("mortal", config["baseline"]["train"]["state_file"])
    units = play_chunk((chal, champ, 20000, 1, 13, str(tmp_path / "eval")))
    assert list(units) == [20000]
    counts = compare_logs(record, tmp_path / "eval", 20000, 13, version, "challenger",
                          {"challenger": True, "champion": True})
    _assert_covered(counts, hanchan)


@pytest.mark.parametrize("version,hanchan", PLAYS)
def test_evaluation_against_rule_based_bots_equals_what_the_learner_loads(tmp_path, monkeypatch, version, hanchan):
    """``play_chunk`` of a checkpoint against three RulebaseBots (``scripts/evaluate.py --champion rulebase``): the
    bots declare riichi and win, so the engine's decisions after a riichi, a hora and a kyoku that ended in one are
    compared too; the bot seats' samples are checked against their states (mask; observation at version 3)."""
    from mortal.play.evaluation import play_chunk
    config, _, _, record = _setup(tmp_path, monkeypatch, version, hanchan)
    units = play_chunk((("mortal", config["control"]["state_file"]), ("rulebase", None), 20000, 1, 12,
                        str(tmp_path / "eval")))
    assert list(units) == [20000]
    counts = compare_logs(record, tmp_path / "eval", 20000, 12, version, "challenger",
                          {"challenger": True, "champion": False})
    assert counts["bot"] > 300 and counts["ev_reach"] > 0 and counts["ev_hora"] > 0, counts
    assert counts["ev_start_kyoku"] >= 8 and counts.get("ev_dora", 0) > 0 and counts["rows"] > 100, counts
