"""mortal.bootstrap: rule-based log generation, step planning, offline config and the online dir."""

import gzip
import json
import os
import pathlib

import pytest
import toml
import torch

from mortal import bootstrap, quickstart_config
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
    assert boot['epsilon'] == 0.01 and boot['offline_test_every'] == 0
    del config['bootstrap']['games']
    with pytest.raises(bootstrap.BootstrapError, match=r"lacks key\(s\) \['games'\]"):
        bootstrap.bootstrap_config(config)
    config['bootstrap']['games'] = 4
    config['bootstrap']['epsilon'] = 1.5
    with pytest.raises(bootstrap.BootstrapError, match='epsilon must be within'):
        bootstrap.bootstrap_config(config)


def test_plan_sets_counts_deals_and_skips_finished_ones(tmp_path):
    # 10 hanchan: ceil(10 / 4) = 3 deals of 4 rotations; with epsilon 0 each deal keeps 1 log -> 10 deals
    todo, done = bootstrap.plan_sets(tmp_path, 10, 7, 0.01)
    assert (todo, done) == ([0, 1, 2], [])
    for s in 'abcd':
        (tmp_path / f'1_7_{s}.json.gz').write_bytes(b'')
    (tmp_path / '2_7_a.json.gz').write_bytes(b'')  # incomplete deal: replayed
    assert bootstrap.plan_sets(tmp_path, 10, 7, 0.01) == ([0, 2], [1])
    todo, done = bootstrap.plan_sets(tmp_path, 10, 7, 0.0)
    assert done == [1, 2] and todo == [0, 3, 4, 5, 6, 7, 8, 9]


@pytest.mark.slow
def test_gen_logs_writes_four_rotations_per_deal_and_resumes(config):
    written = bootstrap.gen_logs(config, progress=False)
    assert written == 8
    root = config['bootstrap']['log_dir']
    key = config['bootstrap'].get('seed_key', bootstrap.DEFAULTS['seed_key'])
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
    nonce, subs, err = bootstrap.play_set((None, 3, 11, 1.0))
    assert err is None
    assert subs == 0


def test_offline_config_redirects_outputs(config):
    cfg = bootstrap.offline_config(config)
    work = config['bootstrap']['work_dir']
    assert cfg['control']['online'] is False
    assert cfg['control']['state_file'] == f'{work}/offline/mortal.pth'
    assert cfg['control']['best_state_file'] == f'{work}/offline/best.pth'
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
        bootstrap.offline_config(config)


def test_train_grp_skips_when_target_reached(config):
    path = config['grp']['state_file']
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({'steps': config['bootstrap']['grp_steps']}, path)
    assert bootstrap.train_grp(config, progress=False) == config['bootstrap']['grp_steps']


def test_prepare_copies_best_and_resets_best_perf(config):
    p = bootstrap._offline_paths(bootstrap.bootstrap_config(config))
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
