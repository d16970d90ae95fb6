"""The long-run guards of the online learner: the paired best.pth rule, SPRT test plays, rollback, and a client
picking up a replaced baseline and the trainer's factors through a live server."""

import glob
import logging
import os

import pytest
import torch

from mortal.learning import guards
from mortal.net import replay_store, wire
from mortal import train as tr

from conftest import (FakeWriter, fake_trainer, free_port, load_tiny_config, random_batch, start_param_server,
                      stop_server, tiny_config_dict, write_baseline)


class UnitsStat:
    """The part of mortal.stat.Stat the trainer reads, from per-deal ranks."""

    def __init__(self, units):
        self.ranks = [r for rs in units.values() for r in rs]
        self.avg_rank = sum(self.ranks) / len(self.ranks)

    def avg_pt(self, pts):
        return sum(pts[r - 1] for r in self.ranks) / len(self.ranks)

    def write_tensorboard(self, writer, step, pts):
        writer.add_scalar('test_play/avg_ranking', self.avg_rank, step)


class PlannedPlayer:
    """A test player with per-deal results: test play k gets ``plans[k](nonce)`` as the 4 ranks of each deal."""

    def __init__(self, plans, log_dir='/nonexistent/test_play'):
        self.plans = list(plans)
        self.calls = []
        self.units = {}
        self.log_dir = log_dir
        self.replay_plan = EVEN  # best.pth replayed ([test_play] fresh_deals)

    def begin(self):
        self.plan = self.plans.pop(0)
        self.units = {}
        self.calls.append([])

    def play_units(self, first, count, mortal, dqn, device, *, log_dir=None, name='mortal'):
        self.calls[-1].append((first, count) if name == 'mortal' else (name, first, count))
        plan = self.plan if name == 'mortal' else self.replay_plan
        out = {n: list(plan(n)) for n in range(first, first + count)}
        if name == 'mortal':
            self.units.update(out)
        return out

    def stat(self):
        return UnitsStat(self.units)


EVEN = lambda n: [1, 2, 3, 4]  # noqa: E731 - the baseline's own result on every deal
WORSE = lambda n: [4, 4, 3, 4] if n % 2 else [3, 4, 4, 2]  # noqa: E731
BETTER = lambda n: [1, 1, 2, 2] if n % 2 else [1, 2, 1, 3]  # noqa: E731


def online_trainer(tmp_path, plans, **overrides):
    """An online learner of the tiny model with a planned test player: test play every 4 steps of 4 deals
    (16 games; ``min_deals`` 0, as the rules judged here are those of any count); submissions are recorded in
    ``trainer.submits``."""
    control = {'save_every': 2, 'test_every': 4, 'submit_every': 2, **overrides.pop('control', {})}
    test_play = {'games': 16, 'min_deals': 0, **overrides.pop('test_play', {})}
    config, _ = load_tiny_config(tmp_path, online=True, control=control, test_play=test_play, **overrides)
    write_baseline(config, config['baseline']['train']['state_file'])
    writer = FakeWriter()
    player = PlannedPlayer(plans, log_dir=config['test_play']['log_dir'])
    trainer = fake_trainer(config, test_player=player, writer=writer)
    trainer.submits = []
    trainer.submit_param = lambda is_idle=False: trainer.submits.append(trainer.play_settings())
    trainer.sync_baseline = lambda: None  # no server here (test_baseline_sync.py has one)
    return trainer, writer, player


def run_to_test_play(trainer, seed=0):
    """Train until the next test play has run (it ends an online learner with TestPlayDone)."""
    with pytest.raises(tr.TestPlayDone):
        for i in range(trainer.test_every):
            trainer.train_batch(*random_batch(seed=seed + i))


def weights(state):
    return {k: v.clone() for k, v in state['mortal'].items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize('games, replaced', [(16, False), (32, True)])
def test_best_needs_min_deals(tmp_path, caplog, games, replaced):
    # issue 36: a "better" test play of 4 deals (16 games) does not replace best.pth under the default min_deals 8;
    # one of 8 deals does. BETTER: -1.0 / -0.75 a deal against EVEN's record
    trainer, _, _ = online_trainer(tmp_path, [EVEN, BETTER], test_play={'games': games, 'min_deals': 8})
    run_to_test_play(trainer)  # the first makes best.pth whatever its size
    first = torch.load(trainer.best_state_file, weights_only=True)
    assert first['steps'] == 4
    with caplog.at_level(logging.INFO, logger='mortal.train'):
        run_to_test_play(trainer, seed=10)
    best = torch.load(trainer.best_state_file, weights_only=True)
    assert best['steps'] == (8 if replaced else 4)
    assert trainer.best_perf['avg_rank'] == pytest.approx(1.625 if replaced else 2.5)
    why = [r.getMessage() for r in caplog.records if 'not replaced' in r.getMessage()]
    assert why == ([] if replaced else ['best.pth not replaced: this test play has 4 deals, fewer than '
                                         '[test_play] min_deals 8 (a CI over so few deals is noise)'])


def test_first_test_play_line_says_it_becomes_best_not_a_verdict(tmp_path, caplog):
    """The first test play has nothing to beat: its line must not say 'not better' before 'a new record'."""
    trainer, _, _ = online_trainer(tmp_path, [EVEN])
    with caplog.at_level(logging.INFO):
        run_to_test_play(trainer)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('test play: ')]
    assert len(lines) == 1
    assert lines[0].endswith(': the first test play (no best.pth yet), so it becomes best.pth')
    assert 'not better' not in lines[0]


def test_paired_rule_keeps_best_until_significantly_better(tmp_path):
    noisy = lambda n: [1, 2, 3, 4] if n % 2 else [1, 1, 3, 4]  # noqa: E731 - -0.25 on half the deals
    trainer, writer, _ = online_trainer(tmp_path, [EVEN, noisy, BETTER])
    run_to_test_play(trainer)  # no best.pth yet: the first test play makes it, with its record
    first = torch.load(trainer.best_state_file, weights_only=True)
    assert first['best_perf']['deals'] == {n: [1, 2, 3, 4] for n in range(10000, 10004)}
    run_to_test_play(trainer, seed=10)  # -0.125 ± 0.14 on 4 deals: not significant, best.pth stays
    assert torch.load(trainer.best_state_file, weights_only=True)['steps'] == first['steps']
    run_to_test_play(trainer, seed=20)  # BETTER: -1.0 (odd deals) / -0.75 (even): -0.875 ± 0.14
    best = torch.load(trainer.best_state_file, weights_only=True)
    assert best['steps'] == 12 and best['best_perf']['avg_rank'] == pytest.approx(1.625)
    assert best['best_perf']['deals'][10001] == [1, 1, 2, 2]
    diffs = [v for t, v, _ in writer.scalars if t == 'test_play/paired_diff']
    assert diffs == pytest.approx([0.0, -0.125, -0.875])


@pytest.mark.slow
def test_rollback_after_consecutive_worse_test_plays_restores_best(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(guards, 'ROLLBACKS_KEPT', 1)
    trainer, writer, _ = online_trainer(tmp_path, [EVEN, WORSE, WORSE, WORSE, WORSE],
                                        guard={'rollback_after': 2, 'lr_factor': 0.5, 'epsilon_factor': 0.25})
    run_to_test_play(trainer)
    best = weights(torch.load(trainer.best_state_file, weights_only=True))
    # a planted degradation: a learning-rate spike between the test plays
    for group in trainer.optimizer.param_groups:
        group['lr'] = 1.0
    run_to_test_play(trainer, seed=10)
    assert trainer.guard['worse_streak'] == 1 and trainer.guard['rollbacks'] == 0
    degraded = weights(torch.load(trainer.state_file, weights_only=True))
    assert not same_weights(degraded, best)
    with caplog.at_level(logging.WARNING, logger='mortal.train'):
        run_to_test_play(trainer, seed=20)
    state = torch.load(trainer.state_file, weights_only=True)
    assert same_weights(weights(state), best)  # state_file holds best.pth's weights again
    assert state['steps'] == 12 and state['guard']['rollbacks'] == 1 and state['guard']['worse_streak'] == 0
    kept = glob.glob(f'{trainer.state_file}.*.rollback')
    assert len(kept) == 1 and not same_weights(weights(torch.load(kept[0], weights_only=True)), best)
    assert 'ROLLBACK #1 at step 12: 2 test plays in a row significantly worse than best.pth' in caplog.text
    # lr and epsilon lowered; the clients get the factor with the next parameters
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(0.5e-3)
    assert trainer.play_settings()['epsilon_factor'] == 0.25
    assert ('guard/rollbacks', 1, 12) in writer.scalars
    # a resumed learner keeps the guard state; a second rollback keeps only the newest copy (ROLLBACKS_KEPT = 1)
    again = fake_trainer(trainer.config, test_player=trainer.test_player, drop_submits=True)
    assert again.guard['lr_scale'] == 0.5 and again.scheduler.get_last_lr()[0] == pytest.approx(0.5e-3)
    run_to_test_play(again, seed=30)
    run_to_test_play(again, seed=40)
    assert again.guard['rollbacks'] == 2 and again.guard['lr_scale'] == 0.25
    assert len(glob.glob(f'{trainer.state_file}.*.rollback')) == 1


def test_instrument_bound_triggers_a_rollback(tmp_path, caplog):
    trainer, _, _ = online_trainer(tmp_path, [EVEN, EVEN], guard={'min_q_gap': 1e9})
    run_to_test_play(trainer)  # makes best.pth: no rollback onto itself, whatever the instruments say
    assert trainer.guard['rollbacks'] == 0
    with caplog.at_level(logging.WARNING, logger='mortal.train'):
        run_to_test_play(trainer, seed=10)  # not better, and q_gap < 1e9
    assert trainer.guard['rollbacks'] == 1
    assert 'below [guard] min_q_gap 1000000000.0' in caplog.text


def test_sprt_test_play_stops_early_and_is_judged_by_the_sprt(tmp_path):
    trainer, writer, player = online_trainer(tmp_path, [EVEN, WORSE],
                                             test_play={'games': 128, 'best_rule': 'sprt', 'sprt_chunk': 32})
    run_to_test_play(trainer)
    assert player.calls[0] == [(10000, 32)]  # no best.pth yet: the first test play is whole, for the record
    run_to_test_play(trainer, seed=10)
    assert player.calls[1] == [(10000, 8)]  # WORSE: rejected at the first look
    assert ('test_play/games', 32, 8) in writer.scalars
    assert torch.load(trainer.best_state_file, weights_only=True)['steps'] == 4


@pytest.mark.slow
def test_a_running_client_picks_up_a_rotation_and_the_factors(tmp_path, caplog):
    from mortal import client as cl
    from mortal.model.checkpoint import load_model_pair
    port = free_port()
    config, _ = load_tiny_config(tmp_path, port=port)
    baseline = config['baseline']['train']['state_file']
    write_baseline(config, baseline, seed=0)
    server = start_param_server(tmp_path, 64, port=port, timeout=10)
    store = server.store
    remote = wire.Remote('127.0.0.1', port, timeout=10)
    brain, dqn, _ = load_model_pair(baseline)

    def submit(**settings):
        reply = remote.request({'type': 'submit_param', 'mortal': wire.pack_state_dict(brain.state_dict()),
                                'dqn': wire.pack_state_dict(dqn.state_dict()), 'is_idle': True, **settings})
        assert reply['status'] == 'ok'

    try:
        submit(steps=100, epsilon_factor=1.0, temp_factor=1.0, baseline_version=0)
        client = cl.Client(config, env={}, sleep=lambda s: None)
        client.run_round()
        old = client.train_player.baseline_engine
        write_baseline(config, baseline, seed=1)  # replaced by hand (scripts/rotate_baseline.py)
        new_weights = torch.load(baseline, weights_only=True)['mortal']
        submit(steps=200, epsilon_factor=0.5, temp_factor=2.0, baseline_version=1)
        with caplog.at_level(logging.INFO, logger='mortal.client'):
            client.run_round()
        engine = client.train_player.baseline_engine
        assert engine is not old
        assert all(torch.equal(engine.brain.state_dict()[k], v) for k, v in new_weights.items())
        assert 'the baseline was rotated (version 0 -> 1): reloading it' in caplog.text
        assert client.train_player.effective_exploration() == pytest.approx((0.0025, 0.1))
        assert len(os.listdir(store.buffer_dir)) == 8  # both rounds submitted
    finally:
        stop_server(server)


def test_server_checks_the_play_settings():
    assert wire.check_play_settings({}) == wire.DEFAULT_PLAY_SETTINGS
    assert wire.check_play_settings(
            {'epsilon_factor': 0, 'temp_factor': 3, 'steps': 5, 'baseline_version': 2}) == {
        'steps': 5, 'baseline_version': 2, 'epsilon_factor': 0.0, 'temp_factor': 3.0}
    for bad in ({'temp_factor': 0.0}, {'epsilon_factor': float('nan')}, {'epsilon_factor': -1.0},
                {'temp_factor': 1e7}, {'baseline_version': -1}, {'steps': 1.5}, {'epsilon_factor': 'x'},
                {'baseline_version': True}):
        with pytest.raises(replay_store.BadRequest):
            wire.check_play_settings(bad)


def test_train_player_applies_the_trainers_factors(tmp_path):
    from mortal.play import player as pl
    config, _ = load_tiny_config(tmp_path)
    write_baseline(config, config['baseline']['train']['state_file'], seed=0)
    tp = pl.TrainPlayer(config, env={})
    tp.set_factors(500.0, 0.5)
    assert tp.effective_exploration() == (1.0, 0.025)  # epsilon capped at 1


@pytest.mark.slow
def test_defaults_never_roll_back(tmp_path):
    trainer, writer, _ = online_trainer(tmp_path, [EVEN, WORSE, WORSE, WORSE, BETTER, BETTER, BETTER])
    for k in range(7):
        run_to_test_play(trainer, seed=10 * k)
    state = torch.load(trainer.state_file, weights_only=True)
    assert state['guard']['rollbacks'] == 0
    assert state['guard']['worse_streak'] == 0 and state['guard']['lr_scale'] == 1.0
    assert not glob.glob(f'{trainer.state_file}.*.rollback')
    assert not glob.glob(f"{trainer.config['baseline']['train']['state_file']}.*.bak")
    assert trainer.play_settings() == {'steps': 28, 'epsilon_factor': 1.0, 'temp_factor': 1.0, 'baseline_version': 0}


def test_rotation_backups_of_one_second_get_a_suffix(tmp_path):
    from mortal.model.rotation import rotate
    config, _ = load_tiny_config(tmp_path)
    baseline = config['baseline']['train']['state_file']
    write_baseline(config, baseline, seed=0)
    write_baseline(config, config['control']['best_state_file'], seed=1)
    rotate(config, stamp='20261201-101010')
    write_baseline(config, config['control']['best_state_file'], seed=2)
    done = rotate(config, stamp='20261201-101010')
    assert done == [(baseline, f'{baseline}.20261201-101010-2.bak')]
    assert sorted(glob.glob(f'{baseline}.*')) == [f'{baseline}.20261201-101010-2.bak', f'{baseline}.20261201-101010.bak']


def test_client_ignores_bad_play_settings(tmp_path, caplog):
    from mortal import client as cl
    config, _ = load_tiny_config(tmp_path)

    class Player:
        def __init__(self):
            self.factors, self.reloads = [], 0

        def set_factors(self, e, t):
            self.factors.append((e, t))

        def effective_exploration(self):
            return self.factors[-1]

        def reload_baseline(self):
            self.reloads += 1

        def baseline_stale(self):
            return False

    player = Player()
    client = cl.Client(config, train_player=player, remote=wire.Remote('127.0.0.1', 1), sleep=lambda s: None)
    with caplog.at_level(logging.WARNING, logger='mortal.client'):
        for bad in ({'epsilon_factor': None}, {'temp_factor': float('nan')}, {'baseline_version': 'x'},
                    {'epsilon_factor': True}):
            client.baseline.apply_play_settings({'param_version': 3, **bad}, client.train_player)
    assert player.factors == [] and player.reloads == 0 and client.baseline.version is None
    assert caplog.text.count('ignoring the play settings of parameters version 3') == 4
    client.baseline.apply_play_settings({'epsilon_factor': 0.5, 'baseline_version': 0}, client.train_player)
    client.baseline.apply_play_settings({'epsilon_factor': 0.5, 'baseline_version': 2}, client.train_player)
    assert player.factors == [(0.5, 1.0)] and player.reloads == 1 and client.baseline.version == 2


@pytest.mark.parametrize('edit, expected', [
    (lambda c: c.update(guard=5), '[guard] in {path} must be a table, got 5'),
    (lambda c: c['test_play'].update(best_rule='best'), '[test_play] best_rule in {path} must be one of paired'),
])
def test_bad_guard_config_names_the_key(tmp_path, edit, expected):
    import toml
    from mortal.config import ConfigError, load_config
    cfg = tiny_config_dict(tmp_path)
    edit(cfg)
    path = tmp_path / 'bad.toml'
    path.write_text(toml.dumps(cfg))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert expected.format(path=path) in str(err.value)


def test_rollback_with_a_foreign_optimizer_state_still_restores_the_weights(tmp_path, caplog):
    trainer, _, _ = online_trainer(tmp_path, [EVEN, WORSE], guard={'rollback_after': 1})
    run_to_test_play(trainer)
    best = torch.load(trainer.best_state_file, weights_only=True)
    best['optimizer'] = {'state': {}, 'param_groups': []}
    torch.save(best, trainer.best_state_file)
    with caplog.at_level(logging.WARNING, logger='mortal.train'):
        run_to_test_play(trainer, seed=10)
    assert trainer.guard['rollbacks'] == 1
    assert same_weights(weights(torch.load(trainer.state_file, weights_only=True)), weights(best))
    assert 'not restored' in caplog.text and 'starting it fresh' in caplog.text


def test_the_server_refuses_a_temp_factor_near_zero():
    assert wire.check_play_settings({'temp_factor': wire.MIN_TEMP_FACTOR})['temp_factor'] == wire.MIN_TEMP_FACTOR
    with pytest.raises(replay_store.BadRequest):
        wire.check_play_settings({'temp_factor': 1e-40})


def test_reset_best_on_a_corrupt_state_file_touches_nothing(tmp_path):
    from mortal.model.rotation import rotate
    config, _ = load_tiny_config(tmp_path)
    baseline = config['baseline']['train']['state_file']
    write_baseline(config, baseline, seed=0)
    write_baseline(config, config['control']['best_state_file'], seed=1)
    with open(config['control']['state_file'], 'wb') as f:
        f.write(b'not a checkpoint')
    before = open(baseline, 'rb').read()
    with pytest.raises(ValueError, match='cannot reset best_perf'):
        rotate(config, reset_best=True)
    assert open(baseline, 'rb').read() == before and not glob.glob(f'{baseline}.*.bak')


@pytest.mark.slow
def test_fresh_deals_replay_best_on_new_deals_each_test_play(tmp_path):
    trainer, writer, player = online_trainer(tmp_path, [EVEN, EVEN, EVEN], test_play={'fresh_deals': True})
    run_to_test_play(trainer)  # no best.pth yet: no replay, deals 10000-10003
    player.replay_plan = WORSE  # best.pth, replayed on the next deals, does worse there than the challenger
    run_to_test_play(trainer, seed=10)
    run_to_test_play(trainer, seed=20)
    assert player.calls == [[(10000, 4)], [(10004, 4), ('best', 10004, 4)], [(10008, 4), ('best', 10008, 4)]]
    assert trainer.guard['test_plays'] == 3
    # EVEN (2.5 each deal) against the replayed WORSE (3.75 / 3.25): -1.0 a deal, a new best each time
    diffs = [v for t, v, _ in writer.scalars if t == 'test_play/paired_diff']
    assert diffs[1:] == pytest.approx([-1.0, -1.0])
    assert torch.load(trainer.best_state_file, weights_only=True)['steps'] == 12
    assert os.path.isdir(config_log_dir(trainer) + '_best')


def config_log_dir(trainer):
    return os.path.normpath(trainer.test_player.log_dir)


class StubProbe:
    """A probe of ``size`` positions whose k-th measure answers drift k / 10 (no network pass)."""

    def __init__(self, size):
        self.size, self.calls = size, 0

    def __len__(self):
        return self.size

    def measure(self, brain, dqn, aux_net, device):
        self.calls += 1
        return self.calls / 10, 1.0


def test_probe_measured_every_20x_its_rows_and_before_each_test_play(tmp_path):
    # batch 8, save every 2 steps, test play at step 14; a probe of 4 positions is due after 20 x 4 = 80 rows,
    # i.e. at the save of step 10 (80 rows), then at step 14 (32 rows since) because the test play follows
    trainer, writer, _ = online_trainer(tmp_path, [EVEN], control={'test_every': 14})
    trainer.instruments.probe = StubProbe(4)
    run_to_test_play(trainer)
    drift = [(s, v) for t, v, s in writer.scalars if t == 'diag/policy_drift']
    assert drift == [(10, pytest.approx(0.1)), (14, pytest.approx(0.2))]
    assert [s for t, _, s in writer.scalars if t == 'diag/next_rank_loss_probe'] == [10, 14]
    assert [s for t, _, s in writer.scalars if t == 'diag/q_gap'] == [2, 4, 6, 8, 10, 12, 14]  # every save
    assert trainer.instruments.last['policy_drift'] == pytest.approx(0.2)  # what the guard read at the test play
