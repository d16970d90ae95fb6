"""Observation version 4 end to end: arena (a v4 engine beside a v3 one), agent, bot, loader, trainer.

Every v4 observation checked here is compared with ``V4Encoder.encode`` on an independent replay of the
events (a fresh ``PlayerState`` + ``V4Encoder`` per seat), so the tests fail if a caller feeds its encoder a
different event stream, skips events or mixes seats. Arena games are cut to two kyoku (``short_games``) and
loader logs to one kyoku, to keep the single-player search cheap.
"""

import gzip
import json
from collections import defaultdict

import numpy as np
import pytest
import torch
from mjai.mlibriichi.state import PlayerState

import mortal.play.arena as arena_mod
import mortal.play.game as game_mod
import mortal.play.kyoku_flow as kyoku_flow
from conftest import DATA_DIR, load_tiny_config, player_view, trainer_on_round
import mortal.play.agent as agent_mod
from mortal.play.agent import MortalBatchAgent, Scene, needs_v4_encoder
from mortal.play.engine import MortalEngine
from mortal.data.gameplay import augment_event
from mortal.data.gameplay import GameplayLoader
from mortal.model.networks import DQN, Brain
from mortal.features.obs_v4 import SP_START, V4Encoder
from mortal.features.sp.calc import require_core

META = DATA_DIR / "meta_annotated_hanchan.jsonl"
RIICHIENV = DATA_DIR / "riichienv_selfplay_hanchan.jsonl"


# ---------------------------------------------------------------- helpers


def tiny_engine(version, name, *, quick_eval=True, seed=0):
    torch.manual_seed(seed)
    brain = Brain(version=version, conv_channels=16, num_blocks=1)
    return MortalEngine(brain, DQN(version=version), version=version, name=name, enable_quick_eval=quick_eval)


class Recording:
    """Wraps an engine; keeps a copy of every (obs, mask) row ``react_batch`` receives."""

    def __init__(self, engine):
        self._engine = engine
        self.rows = []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def react_batch(self, obs, masks, invisible_obs=None):
        self.rows.extend((np.array(o), np.array(m)) for o, m in zip(obs, masks))
        return self._engine.react_batch(obs, masks, invisible_obs)


class SpyAgent(MortalBatchAgent):
    """A ``MortalBatchAgent`` that also records, per call, where each scene stands in its seat's event stream
    (kyoku ordinal, events since that kyoku's ``start_kyoku``) and which engine rows the call produced."""

    def __init__(self, engine):
        super().__init__(engine)
        self.streams = defaultdict(list)
        self.records = []  # ([(game, seat, kyoku_no, offset, has_v4, stream types)], rows)

    def react(self, scenes):
        where = []
        for sc in scenes:
            stream = self.streams[(sc.game, sc.seat)]
            stream.extend(json.loads(e) for e in sc.events)
            starts = [i for i, e in enumerate(stream) if e["type"] == "start_kyoku"]
            where.append((sc.game, sc.seat, len(starts) - 1, len(stream) - starts[-1], sc.v4 is not None,
                          [e["type"] for e in stream[starts[-1]:]]))
        before = len(self.engine.rows)
        out = super().react(scenes)
        self.records.append((where, self.engine.rows[before:]))
        return out


def limit_kyoku(monkeypatch, n_kyoku):
    """Arena games end after their first (``n_kyoku`` = 1) or second (2: E1's repeat or E2) kyoku."""
    real = game_mod.next_kyoku

    def short(state, result):
        out = real(state, result)
        if out.next is not None and (n_kyoku == 1 or state.kyoku_index > 0 or state.honba > 0):
            return kyoku_flow.KyokuOutcome(None, out.scores, out.kyotaku)
        return out

    monkeypatch.setattr(game_mod, "next_kyoku", short)


@pytest.fixture
def short_games(monkeypatch):
    """Arena games of two kyoku."""
    limit_kyoku(monkeypatch, 2)


@pytest.fixture
def encoder_census(monkeypatch):
    """Counts V4Encoders the arena builds and their encode calls, per seat."""
    built, encoded = [], defaultdict(int)

    class Counting(V4Encoder):
        def __init__(self, seat):
            super().__init__(seat)
            built.append(seat)

    real_batch = agent_mod.encode_v4_batch

    def counting_batch(items, threads=None, v3s=None):
        for enc, _, _ in items:
            encoded[enc.player_id] += 1
        return real_batch(items, threads, v3s)

    monkeypatch.setattr(game_mod, "V4Encoder", Counting)
    monkeypatch.setattr(agent_mod, "encode_v4_batch", counting_batch)
    return built, encoded


def read_gz_log(path):
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def replay(events, seat, stops):
    """A fresh ``PlayerState`` + ``V4Encoder`` for ``seat`` fed ``events`` in order; at each count of events in
    ``stops`` (ascending) yields ``(count, state, encoder)``."""
    state, enc = PlayerState(seat), V4Encoder(seat)
    stops = sorted(set(stops))
    k = 0
    for n, ev in enumerate(events, 1):
        state.update(json.dumps(ev))
        enc.update(ev)
        while k < len(stops) and stops[k] == n:
            yield n, state, enc
            k += 1


def cut_log(path, first_kyoku, n_kyoku):
    """``start_game``, kyoku ``first_kyoku`` .. ``+ n_kyoku - 1`` (0-based) of a real log, then ``end_game``."""
    lines = path.read_text().splitlines()
    types = [json.loads(line)["type"] for line in lines]
    starts = [i for i, t in enumerate(types) if t == "start_kyoku"]
    ends = [i for i, t in enumerate(types) if t == "end_kyoku"]
    return "\n".join([lines[0]] + lines[starts[first_kyoku]:ends[first_kyoku + n_kyoku - 1] + 1]
                     + ['{"type":"end_game"}']) + "\n"


# ---------------------------------------------------------------- arena


@pytest.mark.slow
def test_arena_v4_engine_gets_the_replayed_v4_obs_and_v3_engine_pays_nothing(tmp_path, short_games,
                                                                              encoder_census):
    built, encoded = encoder_census
    v4 = SpyAgent(Recording(tiny_engine(4, "v4", quick_eval=False, seed=1)))
    v3 = Recording(tiny_engine(3, "v3", seed=2))
    arena = arena_mod.OneVsThree(disable_progress_bar=True, log_dir=str(tmp_path))
    ranks = arena.py_vs_py(v4, v3, seed_start=(11, 5), seed_count=1)
    assert sum(ranks) == 4

    # The v3 engine (three seats per game) got v3 rows only; encoders exist only for the v4 seat of each game.
    assert v3.rows and all(o.shape == (934, 34) and o.dtype == np.float32 for o, _ in v3.rows)
    n_kyoku = {}
    for split in range(4):
        events = read_gz_log(tmp_path / f"11_5_{'abcd'[split]}.json.gz")
        n_kyoku[split] = sum(e["type"] == "start_kyoku" for e in events)
        assert n_kyoku[split] == 2  # short_games: two kyoku, so the per-kyoku reset is exercised
    assert sorted(built) == sorted(s for s in range(4) for _ in range(n_kyoku[s]))  # one per kyoku, v4 seat only
    assert set(encoded) == {0, 1, 2, 3}

    # Every v4 row equals V4Encoder.encode on a fresh replay of the written log up to the decision.
    logs = {g: read_gz_log(tmp_path / f"11_5_{'abcd'[g]}.json.gz") for g in range(4)}
    positions = defaultdict(list)  # game -> log positions (events replayed) of its v4 decisions
    for where, _ in v4.records:
        for game, seat, kyoku_no, offset, has_v4, stream_types in where:
            assert has_v4 and seat == game  # seed_count=1: game index == split == challenger seat
            start = [i for i, e in enumerate(logs[game]) if e["type"] == "start_kyoku"][kyoku_no]
            # the seat's stream is the log, event for event (masked tiles aside)
            assert [e["type"] for e in logs[game][start:start + offset]] == stream_types
            positions[game].append(start + offset)
    expected = {}  # (game, position) -> [(obs, mask)] of the main row and the kan-select row if any
    for game, stops in positions.items():
        for n, state, enc in replay(logs[game], game, stops):
            cans = state.last_cans
            assert cans.can_act
            rows = [enc.encode(state, False)]
            if cans.can_ankan or cans.can_kakan:  # quick eval off: always a kan-select row
                rows.append(enc.encode(state, True))
            expected[game, n] = rows
    checked = 0
    for where, rows in v4.records:
        it = iter(rows)
        for game, _, kyoku_no, offset, _, _ in where:
            start = [i for i, e in enumerate(logs[game]) if e["type"] == "start_kyoku"][kyoku_no]
            for exp_obs, exp_mask in expected[game, start + offset]:
                obs, mask = next(it)
                assert obs.shape == (1012, 34) and obs.dtype == np.float32
                np.testing.assert_array_equal(obs, exp_obs)
                np.testing.assert_array_equal(mask, exp_mask)
                checked += 1
        assert next(it, None) is None
    assert checked == len(v4.engine.rows) > 40
    assert sum(np.any(o[SP_START:] != 0) for o, _ in v4.engine.rows) > 20  # the SP block is really there


def test_needs_v4_encoder():
    assert needs_v4_encoder(MortalBatchAgent(tiny_engine(4, "a")))
    assert not needs_v4_encoder(MortalBatchAgent(tiny_engine(3, "b")))

    class Bot:
        name = "bot"

    assert not needs_v4_encoder(Bot())


def _riichi_forced_discard():
    """Seat 1 of META after its riichi is accepted, at its next draw (only tsumogiri is legal)."""
    state, enc = PlayerState(1), V4Encoder(1)
    accepted = False
    with open(META) as f:
        for line in f:
            ev = json.loads(line)
            cans = state.update(line)
            enc.update(ev)
            accepted |= ev["type"] == "reach_accepted" and ev["actor"] == 1
            if accepted and ev["type"] == "tsumo" and ev["actor"] == 1:
                assert cans.can_discard and not cans.can_tsumo_agari
                return state, enc
    raise AssertionError("no riichi draw of seat 1 in the log")


def test_v4_agent_quick_eval_skips_the_sp_search_and_needs_the_encoder(monkeypatch):
    state, enc = _riichi_forced_discard()
    calls = []
    real_batch = agent_mod.encode_v4_batch

    class Counting:
        player_id = enc.player_id

    def counting_batch(items, threads=None, v3s=None):
        calls.extend(kan for _, _, kan in items)
        return real_batch([(None if e is None else enc, st, kan) for e, st, kan in items], threads, v3s)

    monkeypatch.setattr(agent_mod, "encode_v4_batch", counting_batch)

    engine = Recording(tiny_engine(4, "v4"))
    agent = MortalBatchAgent(engine)
    [dec] = agent.react([Scene(0, 1, state, [], None, Counting())])
    assert state.encode_obs(3, False)[1].sum() == 1  # only one legal action
    assert dec.meta is None and dec.reaction["type"] == "dahai"  # quick eval: the forced tsumogiri
    assert dec.reaction["pai"] == state.last_self_tsumo()
    assert calls == [] and engine.rows == []

    slow = MortalBatchAgent(Recording(tiny_engine(4, "v4", quick_eval=False)))
    [dec] = slow.react([Scene(0, 1, state, [], None, Counting())])
    assert calls == [False] and dec.meta is not None
    np.testing.assert_array_equal(slow.engine.rows[0][0], enc.encode(state, False)[0])

    with pytest.raises(ValueError, match="V4Encoder"):
        slow.react([Scene(0, 1, state, [], None, None)])


# ---------------------------------------------------------------- bot


def test_bot_v4_engine_sees_the_replayed_v4_obs():
    from mortal import bot as bot_mod

    seat = 1
    engine = Recording(tiny_engine(4, "mortal", quick_eval=False))
    bot = bot_mod.Bot(engine, seat)
    assert isinstance(bot.v4, V4Encoder) and bot.v4.player_id == seat
    ref, enc = PlayerState(seat), V4Encoder(seat)
    lines = player_view(RIICHIENV, seat)
    ends = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "end_kyoku"]
    n = 0
    for line in lines[:ends[1] + 1]:  # two kyoku
        cans = ref.update(line)
        enc.update(line)
        before = len(engine.rows)
        reaction = bot.react(line)
        assert (reaction is not None) == cans.can_act
        if not cans.can_act:
            continue
        expected = [enc.encode(ref, False)]
        if cans.can_ankan or cans.can_kakan:
            expected.append(enc.encode(ref, True))
        got = engine.rows[before:]
        assert len(got) == len(expected)
        for (obs, mask), (exp_obs, exp_mask) in zip(got, expected):
            np.testing.assert_array_equal(obs, exp_obs)
            np.testing.assert_array_equal(mask, exp_mask)
        n += 1
    assert n > 20

    assert bot_mod.Bot(tiny_engine(3, "v3"), seat).v4 is None


# ---------------------------------------------------------------- loader


@pytest.mark.parametrize("path,first_kyoku,n_kyoku,augmented", [
    (META, 0, 1, False),       # riichi, pon, chi, a riichi-accepted hora
    (RIICHIENV, 6, 1, False),  # an ankan (kan-select samples), calls
    (RIICHIENV, 0, 1, True),   # manzu/pinzu swapped: the encoder must see the augmented events too
])
def test_loader_v4_is_v3_repacked_plus_the_replayed_sp_block(path, first_kyoku, n_kyoku, augmented):
    raw = cut_log(path, first_kyoku, n_kyoku)
    g3 = GameplayLoader(3, augmented=augmented).load_log(raw, path.name)
    g4 = GameplayLoader(4, augmented=augmented).load_log(raw, path.name)
    events = [json.loads(line) for line in raw.splitlines()]
    if augmented:
        events = [augment_event(e) for e in events]
    n_kan = 0
    for a, b in zip(g3, g4):
        seat = b.player_id
        obs4, obs3 = b.obs, a.obs
        assert obs4.shape == (len(a), 1012, 34) and obs4.dtype == np.float32 and len(a) > 5
        np.testing.assert_array_equal(b.masks, a.masks)
        np.testing.assert_array_equal(b.actions, a.actions)
        np.testing.assert_array_equal(b.event_idx, a.event_idx)
        stops = [int(i) + 1 for i in b.event_idx]  # the decision follows event_idx
        expected = {n: ((state.scores, state.honba, state.kyotaku), enc.encode(state, False)[0],
                        enc.encode(state, True)[0])
                    for n, state, enc in replay(events, seat, stops)}
        for i, n in enumerate(stops):
            kan_select = i > 0 and stops[i - 1] == n  # the second sample of a decision is the kan select
            getters, main, kan = expected[n]
            head = np.zeros((1012, 34), np.float32)
            require_core().repack_v3(np.ascontiguousarray(obs3[i], dtype=np.float32), tuple(getters[0]), *getters[1:], head)
            np.testing.assert_array_equal(obs4[i, :SP_START], head[:SP_START])
            np.testing.assert_array_equal(obs4[i, SP_START:], (kan if kan_select else main)[SP_START:])
            n_kan += kan_select
    if path == RIICHIENV and not augmented:
        assert n_kan >= 1


# ---------------------------------------------------------------- self-play round -> loader -> trainer


@pytest.mark.slow
def test_self_play_round_to_trainer_step_with_version_4(tmp_path, monkeypatch):
    from mortal import client as cl
    from mortal.net import wire
    from mortal.play.player import TrainPlayer

    limit_kyoku(monkeypatch, 1)
    names = tmp_path / 'names.txt'
    names.write_text('trainee\n')  # the trainer learns from the v4 trainee's seat only, as online
    config, _ = load_tiny_config(tmp_path, online=False, **{
        'control': {'version': 4, 'batch_size': 8, 'save_every': 1000, 'test_every': 1000},
        'dataset': {'player_names_files': [str(names)]}})
    # the baseline is a version-3 checkpoint: a 1v3 of two versions
    torch.manual_seed(3)
    baseline = {'mortal': Brain(version=3, conv_channels=16, num_blocks=1).state_dict(),
                'current_dqn': DQN(version=3).state_dict(),
                'config': {'control': {'version': 3}, 'resnet': {'conv_channels': 16, 'num_blocks': 1}}}
    torch.save(baseline, config['baseline']['train']['state_file'])

    client = cl.Client(config, train_player=TrainPlayer(config, {}, train_key=9),
                       remote=wire.Remote('127.0.0.1', 1))
    assert client.mortal.encoder.net[0].in_channels == 1012
    rankings, files = client.train_player.train_play(client.mortal, client.dqn, 'cpu')
    assert rankings.sum() == 4 and len(files) == 4

    trainer = trainer_on_round(tmp_path, config, files)
    seen = []
    real_train_batch = trainer.train_batch

    def spy(obs, *rest):
        seen.append(tuple(obs.shape))
        return real_train_batch(obs, *rest)

    trainer.train_batch = spy
    before = [p.detach().clone() for p in trainer.mortal.parameters()]
    trainer.run()
    assert seen and all(s == (8, 15320) for s in seen)  # packed rows of v4 (mortal.features.packed_obs.row_bytes(4))
    assert trainer.steps == len(seen) > 0
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.mortal.parameters()))
