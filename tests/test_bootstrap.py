"""mortal.tools.bootstrap: rule-based log generation, step planning, offline config and the online dir."""

import gzip
import json
import logging
import math
import os
import pathlib

import pytest
import toml
import torch

from mortal.tools import bootstrap, offline_epochs, quickstart_config, rulebase_games
from mortal.config import load_config


@pytest.fixture
def config(tmp_path):
    path = quickstart_config.write_config(tmp_path, preset='short')
    cfg = load_config(path)
    cfg['bootstrap'].update(games=4, val_games=4, workers=2)
    return cfg


def _events(path):
    with gzip.open(path, 'rt') as f:
        return [json.loads(line) for line in f]


def test_bootstrap_config_defaults_and_errors(config):
    boot = bootstrap.bootstrap_config(config)
    assert boot.epsilon == 0.01 and boot.offline_test_every == 0
    del config['bootstrap']['games']
    with pytest.raises(bootstrap.BootstrapError, match=r'missing key \[bootstrap\] games in c.toml'):
        bootstrap.bootstrap_config(config, path='c.toml')
    config['bootstrap']['games'] = 4
    config['bootstrap']['epsilon'] = 1.5
    with pytest.raises(bootstrap.BootstrapError, match=r'\[bootstrap\] epsilon in c.toml must be within \[0, 1\)'):
        bootstrap.bootstrap_config(config, path='c.toml')
    del config['bootstrap']
    with pytest.raises(bootstrap.BootstrapError, match=r'missing section \[bootstrap\] in c.toml'):
        bootstrap.bootstrap_config(config, path='c.toml')


def test_plan_sets_counts_deals_and_skips_finished_ones(tmp_path):
    # 10 hanchan: ceil(10 / 4) = 3 deals of 4 rotations; with epsilon 0 each deal keeps 1 log -> 10 deals
    todo, done = rulebase_games.plan_sets(tmp_path, 10, 7, 0.01)
    assert (todo, done) == ([0, 1, 2], [])
    for s in 'abcd':
        (tmp_path / f'1_7_{s}.json.gz').write_bytes(b'')
    (tmp_path / '2_7_a.json.gz').write_bytes(b'')  # incomplete deal: replayed
    assert rulebase_games.plan_sets(tmp_path, 10, 7, 0.01) == ([0, 2], [1])
    todo, done = rulebase_games.plan_sets(tmp_path, 10, 7, 0.0)
    assert done == [1, 2] and todo == [0, 3, 4, 5, 6, 7, 8, 9]


@pytest.mark.slow
def test_gen_logs_writes_four_rotations_per_deal_and_resumes(config):
    written = bootstrap.gen_logs(config, progress=False)
    assert written == 8
    root = config['bootstrap']['log_dir']
    key = bootstrap.bootstrap_config(config).seed_key
    train = sorted(p.name for p in pathlib.Path(root, 'train').iterdir())
    val = sorted(p.name for p in pathlib.Path(root, 'val').iterdir())
    assert train == [f'0_{key}_{s}.json.gz' for s in 'abcd']
    assert val == [f'0_{key + 1}_{s}.json.gz' for s in 'abcd']
    blobs = set()
    for name in train:
        events = _events(f'{root}/train/{name}')
        assert events[0]['type'] == 'start_game'
        assert events[0]['names'] == ['rulebase'] * 4
        assert events[-1]['type'] == 'end_game'
        assert sum(e['type'] == 'start_kyoku' for e in events) >= 4  # a hanchan has at least E1-E4
        blobs.add(json.dumps(events))
    # the exploring discards make the four rotations of the deal different games
    assert len(blobs) == 4
    # second run: everything on disk, nothing played
    assert bootstrap.gen_logs(config, progress=False) == 0


def test_exploring_bot_discards_only_legal_tiles():
    """With epsilon = 1 every free discard is random; the arena's mask check would count an illegal one."""
    nonce, subs, err = rulebase_games.play_set((None, 3, 11, 1.0))
    assert err is None
    assert subs == 0


def test_offline_config_redirects_outputs(config):
    cfg = offline_epochs.offline_config(config)
    work = config['bootstrap']['work_dir']
    assert cfg['control']['online'] is False
    assert cfg['control']['state_file'] == f'{work}/offline/mortal.pth'
    # the quickstart's early stopping makes best.pth the best epoch's: the test play's pick goes elsewhere
    assert cfg['control']['best_state_file'] == f'{work}/offline/best_test_play.pth'
    assert cfg['dataset']['globs'] == [f"{config['bootstrap']['log_dir']}/train/*.json.gz"]
    assert cfg['freeze_bn']['mortal'] is False
    assert cfg['control']['test_every'] % cfg['control']['save_every'] == 0
    assert cfg['control']['test_every'] > 10**9  # no test play without offline_test_every
    assert config['control']['online'] is True  # the original is untouched
    # the quickstart's offline_lr (1e-4) replaces its online rate (1e-5) for the offline run only
    assert cfg['optim']['scheduler']['peak'] == cfg['optim']['scheduler']['final'] == 1e-4
    assert config['optim']['scheduler']['peak'] == 1e-5
    config['bootstrap']['offline_test_every'] = 15  # save_every is 10
    with pytest.raises(bootstrap.BootstrapError, match='multiple of'):
        offline_epochs.offline_config(config)


def test_train_grp_skips_when_target_reached(config):
    path = config['grp']['state_file']
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({'steps': config['bootstrap']['grp_steps']}, path)
    assert bootstrap.train_grp(config, progress=False) == config['bootstrap']['grp_steps']


def test_prepare_copies_best_and_resets_best_perf(config):
    p = offline_epochs.offline_paths(bootstrap.bootstrap_config(config))
    os.makedirs(p['root'], exist_ok=True)
    weights = {'w': torch.arange(3.0)}
    torch.save({'mortal': weights, 'current_dqn': {}, 'best_perf': {'avg_rank': 2.1, 'avg_pt': 20.0},
                'config': {'resnet': {}}}, p['best_state_file'])
    written = bootstrap.prepare(config)
    online = config['control']['state_file']
    assert written == [online, config['baseline']['train']['state_file']]  # test baseline is the same file
    state = torch.load(online, weights_only=True)
    assert state['best_perf'] == {'avg_rank': 4.0, 'avg_pt': -135.0}
    assert torch.equal(state['mortal']['w'], weights['w'])
    base = torch.load(config['baseline']['test']['state_file'], weights_only=True)
    assert base['best_perf'] == {'avg_rank': 2.1, 'avg_pt': 20.0}  # a plain copy
    assert bootstrap.prepare(config) == []
    assert len(bootstrap.prepare(config, force=True)) == 2


def test_prepare_without_offline_best_is_an_error(config):
    with pytest.raises(bootstrap.BootstrapError, match='run train-offline first'):
        bootstrap.prepare(config)


def test_cli_reports_config_errors(tmp_path, capsys):
    path = quickstart_config.write_config(tmp_path, preset='short')
    cfg = toml.load(path)
    del cfg['bootstrap']['log_dir']
    path.write_text(toml.dumps(cfg))
    assert bootstrap.main(['gen-logs', '-c', str(path)]) == 2
    err = capsys.readouterr().err
    assert f"missing key [bootstrap] log_dir in {path}" in err


# ---------------------------------------------------------------------------- early stopping and the GRP check

from conftest import DATA_DIR, FakeTestPlayer, FakeWriter, load_tiny_config, random_batch, write_grp  # noqa: E402

RIICHIENV = DATA_DIR / 'riichienv_selfplay_hanchan.jsonl'  # final rank_by_player [3, 2, 1, 0]
META = DATA_DIR / 'meta_annotated_hanchan.jsonl'


def _put_log(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(gzip.compress(src.read_bytes()))


def test_new_bootstrap_keys_keep_the_old_behaviour_by_default(config):
    boot = bootstrap.bootstrap_config({**config, 'bootstrap': {k: config['bootstrap'][k] for k in (
        'games', 'val_games', 'log_dir', 'work_dir', 'grp_steps')}})
    assert (boot.offline_max_epochs, boot.offline_patience, boot.grp_patience) == (1, 1, 0)
    cfg = offline_epochs.offline_config({**config, 'bootstrap': boot.model_dump()})
    assert cfg['control']['best_state_file'].endswith('/offline/best.pth')  # one epoch: test play picks best.pth
    config['bootstrap']['offline_max_epochs'] = 0
    with pytest.raises(bootstrap.BootstrapError, match=r'\[bootstrap\] offline_max_epochs in .* must be > 0'):
        bootstrap.bootstrap_config(config)


def test_quickstart_config_turns_early_stopping_on(config):
    boot = bootstrap.bootstrap_config(config)
    assert boot.offline_max_epochs > 1 and boot.offline_patience >= 1 and boot.grp_patience >= 1
    # early stopping: best.pth is the best epoch's, the test play's pick goes elsewhere
    assert offline_epochs.offline_config(config)['control']['best_state_file'].endswith('/offline/best_test_play.pth')


def _grp_with_bias(config, perm_index, value):
    """A GRP whose prediction is fixed: logit ``value`` for rank order ``perm_index``, 0 for the other 23, so that
    its cross entropy on a game with that order is ln(e^value + 23) - value, ln(e^value + 23) on any other."""
    from mortal.model.networks import GRP
    grp = GRP(**config['grp']['network'])
    with torch.no_grad():
        grp.fc[-1].weight.zero_()
        grp.fc[-1].bias.zero_()
        grp.fc[-1].bias[perm_index] = value
    path = config['grp']['state_file']
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({'model': grp.state_dict(), 'steps': 0}, path)


@pytest.mark.parametrize('order, ce, reward', [
    (23, math.log(math.e ** 2 + 23) - 2, 'grp'),  # the val game's order (3, 2, 1, 0): 1.4141 < ln 24, kept
    (0, math.log(math.e ** 2 + 23), 'points'),  # another order: 3.4141 > ln 24 = 3.1781, refused
])
def test_check_grp_refuses_a_grp_no_better_than_uniform(tmp_path, caplog, order, ce, reward):
    path = quickstart_config.write_config(tmp_path, preset='short')
    config = load_config(path)
    _put_log(RIICHIENV, pathlib.Path(config['bootstrap']['log_dir'], 'val', '0.json.gz'))
    _grp_with_bias(config, order, 2.0)
    with caplog.at_level('INFO', logger='mortal.tools.bootstrap'):
        out = bootstrap.check_grp(config, path)
    assert out['ce'] == pytest.approx(ce, abs=1e-9) and out['uniform'] == math.log(24)
    assert out['reward'] == reward and config['env']['reward'] == reward
    assert toml.load(path)['env']['reward'] == reward  # handed on in the config file the processes read
    warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
    if reward == 'points':
        assert len(warnings) == 1
        assert f'{ce:.4f}' in warnings[0] and '3.1781' in warnings[0] and "reward = 'points'" in warnings[0]
    else:
        assert warnings == []
        assert any("reward = 'grp'" in r.getMessage() and f'{ce:.4f}' in r.getMessage() for r in caplog.records)


def test_the_fallback_reward_reaches_the_offline_data(tmp_path):
    """After the refusal the loader gives the scaled score change, and needs no GRP at all."""
    from mortal.data.dataloader import learner_loader
    path = quickstart_config.write_config(tmp_path, preset='short')
    config = load_config(path)
    _put_log(RIICHIENV, pathlib.Path(config['bootstrap']['log_dir'], 'val', '0.json.gz'))
    _grp_with_bias(config, 0, 2.0)
    assert bootstrap.check_grp(config, path)['reward'] == 'points'
    os.remove(config['grp']['state_file'])
    cfg = offline_epochs.offline_config(load_config(path))  # as a later process reads it
    batch = next(iter(learner_loader(cfg, 3, [str(pathlib.Path(config['bootstrap']['log_dir'], 'val', '0.json.gz'))],
                                     [], batch_size=1024, num_workers=0)))
    rewards = batch[4].numpy()
    # every reward is a score change (a multiple of 100 points) x 6 / 30000
    assert abs(rewards).max() > 0
    assert ((rewards / 2e-4 / 100).round() * 100 * 2e-4 == pytest.approx(rewards))


def test_write_reward_edits_only_that_line(tmp_path):
    path = tmp_path / 'c.toml'
    path.write_text("[env]  # the env\ngamma = 1\n\n[grp]\nstate_file = 'g.pth'  # keep me\n")
    assert bootstrap.write_reward(path, 'points')
    assert path.read_text() == ("[env]  # the env\nreward = 'points'  # written by mortal.tools.bootstrap (check_grp)\n"
                                "gamma = 1\n\n[grp]\nstate_file = 'g.pth'  # keep me\n")
    assert not bootstrap.write_reward(path, 'points')  # already so: untouched
    assert bootstrap.write_reward(path, 'grp')
    assert toml.load(path) == {'env': {'reward': 'grp', 'gamma': 1}, 'grp': {'state_file': 'g.pth'}}
    other = tmp_path / 'd.toml'
    other.write_text("[grp]\nstate_file = 'g.pth'\n")
    assert bootstrap.write_reward(other, 'points') and toml.load(other)['env'] == {'reward': 'points'}
    dotted = tmp_path / 'e.toml'
    dotted.write_text("env = {gamma = 1}\n")
    with pytest.raises(bootstrap.BootstrapError, match='by hand'):
        bootstrap.write_reward(dotted, 'points')
    assert dotted.read_text() == "env = {gamma = 1}\n"


def _offline_setup(tmp_path, **boot):
    """Tiny config (16 x 1 ResNet, batch 8; saved only at the end of an epoch) with one fixture hanchan as train
    and one as val log, and a GRP."""
    bootstrap_table = dict(games=4, val_games=4, log_dir=str(tmp_path / 'logs'), work_dir=str(tmp_path / 'boot'),
                           grp_steps=4, offline_lr=1e-3, **boot)
    config, path = load_tiny_config(tmp_path, bootstrap=bootstrap_table,
                                    control={'save_every': 1000, 'test_every': 1000})
    _put_log(RIICHIENV, tmp_path / 'logs' / 'train' / '0.json.gz')
    _put_log(META, tmp_path / 'logs' / 'val' / '0.json.gz')
    write_grp(config)
    return config


@pytest.mark.slow
def test_validation_loss_is_the_offline_loss_in_eval_mode(tmp_path):
    from mortal.train import Trainer
    config = _offline_setup(tmp_path)
    cfg = offline_epochs.offline_config(config)
    trainer = Trainer(cfg, test_player=offline_epochs.RulebaseTestPlayer(cfg))
    val = [str(tmp_path / 'logs' / 'val' / '0.json.gz')]
    loss, samples = offline_epochs.validation_loss(trainer, val)
    assert samples == 160 + 159 + 151 + 147  # every seat's every decision of the meta fixture (test_dataloader)
    assert 0 < loss < 1e3 and trainer.mortal.training  # the training mode is back
    trainer.batch_size = 64  # eval mode and a mean per sample: the batch size changes nothing
    assert offline_epochs.validation_loss(trainer, val)[0] == pytest.approx(loss, rel=1e-5)
    trainer.writer.close()


def test_epoch_train_loss_counts_every_batch(tmp_path):
    """The epoch's mean training loss is the same whether the trainer saved (and reset its sums) in between."""
    losses = []
    for save_every in (2, 1000):
        (tmp_path / str(save_every)).mkdir()
        config, _ = load_tiny_config(tmp_path / str(save_every), online=False,
                                     control={'save_every': save_every, 'test_every': 1000})
        torch.manual_seed(0)
        trainer = offline_epochs._epoch_trainer_class()(config, test_player=FakeTestPlayer([]), writer=FakeWriter())
        for i in range(5):
            trainer.train_batch(*random_batch(8, seed=i))
        losses.append(trainer.take_epoch_loss(5))
        assert trainer.take_epoch_loss(1) == 0.0  # taken: the next epoch starts from nothing
    assert losses[0] > 0 and losses[0] == pytest.approx(losses[1], rel=1e-6)


def test_offline_epoch_draws_one_bar_not_one_per_save(tmp_path, capsys, caplog):
    """The offline trainer closes and reopens its bar at every save (save_every 2 here: 3 saves in 6 batches); the
    bootstrap's epoch trainer shows one bar for the epoch, so a terminal or a log gets one bar line per epoch, and no
    `total steps` line per save beside it."""
    config, _ = load_tiny_config(tmp_path, online=False, control={'save_every': 2, 'test_every': 1000})
    trainer = offline_epochs._epoch_trainer_class()(config, test_player=FakeTestPlayer([]), writer=FakeWriter(),
                                               progress=True)
    batches = [random_batch(8, seed=i) for i in range(6)]
    trainer.file_list = lambda: ([], [])
    trainer.data_loader = lambda *a, **k: iter(batches)
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger='mortal.train'):
        assert trainer.train_epoch('offline epoch 1/1') == 6 and trainer.steps == 6
    assert not [r for r in caplog.records if r.getMessage().startswith('total steps')]  # the bar counts them
    err = capsys.readouterr().err
    bars = [line for line in err.split('\n') if 'batch' in line]
    assert len(bars) == 1 and bars[0].rstrip().split('\r')[-1].startswith('offline epoch 1/1: 6batch')
    assert trainer.epoch_bar is None  # closed with the epoch
    trainer.writer.close()


@pytest.mark.slow
def test_offline_early_stopping_stops_where_the_val_curve_turns(tmp_path, monkeypatch):
    """Real epochs of the tiny model; the validation curve is scripted so that it turns after epoch 2."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    config = _offline_setup(tmp_path, offline_max_epochs=6, offline_patience=1)
    curve = iter([2.0, 1.5, 1.7, 1.4, 1.3, 1.2])
    calls = []

    def scripted(trainer, files):
        calls.append(trainer.steps)
        return next(curve), 617

    monkeypatch.setattr(offline_epochs, 'validation_loss', scripted)
    import tqdm
    totals = []  # the total of each epoch's bar: unknown for the first, the last epoch's batches after it

    class Bar(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            totals.append((kwargs.get('desc'), kwargs.get('total')))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tqdm, 'tqdm', Bar)
    best = bootstrap.train_offline(config)
    p = offline_epochs.offline_paths(bootstrap.bootstrap_config(config))
    history = offline_epochs.read_history(p['history'])
    # patience 1: epoch 3 (1.7) does not beat epoch 2 (1.5), so the run stops there; the later 1.4 is never seen
    assert [h['val_loss'] for h in history] == [2.0, 1.5, 1.7] and len(calls) == 3
    steps = [h['steps'] for h in history]
    assert steps[0] > 0 and steps == [steps[0], 2 * steps[0], 3 * steps[0]]  # whole epochs of the same logs
    assert [h['batches'] for h in history] == [steps[0]] * 3
    assert [t for t in totals if (t[0] or '').startswith('offline epoch')] == [
        ('offline epoch 1/6', None), ('offline epoch 2/6', steps[0]), ('offline epoch 3/6', steps[0])]
    assert all(h['train_loss'] > 0 for h in history)
    # best.pth is epoch 2's checkpoint; the state file, which went on to epoch 3, is set back to it at the end
    assert best == p['best_state_file']
    assert torch.load(best, weights_only=False)['steps'] == steps[1]
    assert torch.load(p['state_file'], weights_only=False)['steps'] == steps[1]
    acc = EventAccumulator(p['tensorboard_dir'])
    acc.Reload()
    val = [(e.step, e.value) for e in acc.Scalars('bootstrap/val_loss')]
    assert val == [(1, 2.0), (2, 1.5), (3, pytest.approx(1.7))]
    assert [e.step for e in acc.Scalars('bootstrap/train_loss')] == [1, 2, 3]
    # finished: a rerun is skipped; prepare hands on epoch 2
    assert bootstrap.train_offline(config) == best and len(calls) == 3
    bootstrap.prepare(config)
    assert torch.load(config['control']['state_file'], weights_only=False)['steps'] == steps[1]


@pytest.mark.parametrize('max_epochs, why', [(6, 'early stop'), (3, 'max epochs reached')])
def test_offline_end_line_says_early_stop_only_before_the_epoch_limit(tmp_path, caplog, max_epochs, why):
    """Patience 1 runs out at epoch 3 (1.7 after the best 1.5): an early stop with 6 epochs allowed, but with 3 the
    run stopped at its limit."""
    p = {'state_file': str(tmp_path / 'mortal.pth'), 'best_state_file': str(tmp_path / 'best.pth')}
    for path in p.values():
        torch.save({'steps': 20}, path)  # both the best epoch's, as the epochs leave them
    history = [{'epoch': e, 'val_loss': v, 'steps': 10 * e} for e, v in ((1, 2.0), (2, 1.5), (3, 1.7))]
    with caplog.at_level(logging.INFO, logger='mortal.tools.bootstrap'):
        offline_epochs._keep_best_epoch(p, history, 1, True, max_epochs)
    assert caplog.messages == [f'train-offline: {why} after epoch 3; best.pth = epoch 2 (val loss 1.5000, step 20), '
                               'the state file too']


@pytest.mark.slow
def test_offline_early_stopping_resumes_from_its_record(tmp_path, monkeypatch):
    """A run killed between epoch 1's record and its copy to best.pth continues at epoch 2 and first copies the
    state file (still at epoch 1) to best.pth; at the end the state file is the best epoch's too, so a lost best.pth
    is rebuilt from it, and when both are gone that is said plainly."""
    config = _offline_setup(tmp_path, offline_max_epochs=3, offline_patience=0)
    p = offline_epochs.offline_paths(bootstrap.bootstrap_config(config))
    curve = iter([2.0, 2.5, 3.0])  # epoch 1 stays the best
    monkeypatch.setattr(offline_epochs, 'validation_loss', lambda trainer, files: (next(curve), 1))
    real_copy = offline_epochs.atomic_copy

    def killed_copy(src, dst, **kw):
        if dst == p['best_state_file']:
            raise KeyboardInterrupt
        return real_copy(src, dst, **kw)

    monkeypatch.setattr(offline_epochs, 'atomic_copy', killed_copy)
    with pytest.raises(KeyboardInterrupt):
        bootstrap.train_offline(config)
    epoch1 = offline_epochs.read_history(p['history'])
    assert [h['epoch'] for h in epoch1] == [1] and not os.path.exists(p['best_state_file'])
    monkeypatch.setattr(offline_epochs, 'atomic_copy', real_copy)
    bootstrap.train_offline(config)
    history = offline_epochs.read_history(p['history'])
    steps = epoch1[0]['steps']
    assert [(h['epoch'], h['val_loss'], h['steps']) for h in history] == [
        (1, 2.0, steps), (2, 2.5, 2 * steps), (3, 3.0, 3 * steps)]  # patience 0: all offline_max_epochs
    assert torch.load(p['best_state_file'], weights_only=False)['steps'] == steps
    os.remove(p['best_state_file'])  # lost after the end: the state file was set back to the best epoch
    assert bootstrap.train_offline(config) == p['best_state_file']
    assert torch.load(p['best_state_file'], weights_only=False)['steps'] == steps
    os.remove(p['best_state_file'])
    os.remove(p['state_file'])
    with pytest.raises(bootstrap.BootstrapError, match="not the best epoch's checkpoint"):
        bootstrap.train_offline(config)
