"""scripts/rotate_baseline.py: best -> baselines, with backups and an optional best_perf reset."""

import pathlib

import pytest
import torch

from conftest import load_script
from mortal.tools import quickstart_config
from mortal.config import load_config


def _module():
    return load_script('scripts/rotate_baseline.py', 'rotate_baseline')


def _ckpt(path, marker, best_perf=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({'mortal': {'w': torch.tensor([float(marker)])}, 'current_dqn': {}, 'config': {},
                'best_perf': best_perf or {'avg_rank': 2.2, 'avg_pt': 10.0}}, path)


@pytest.fixture
def setup(tmp_path):
    cfg_path = quickstart_config.write_config(tmp_path, preset='short')
    cfg = load_config(cfg_path)
    _ckpt(pathlib.Path(cfg['control']['best_state_file']), 2)
    _ckpt(pathlib.Path(cfg['control']['state_file']), 3)
    _ckpt(pathlib.Path(cfg['baseline']['train']['state_file']), 1)
    return cfg_path, cfg


def _marker(path):
    return float(torch.load(path, weights_only=True)['mortal']['w'][0])


def test_rotate_copies_best_keeps_backup_and_resets(setup, capsys):
    cfg_path, cfg = setup
    rb = _module()
    assert rb.main(['-c', str(cfg_path), '--reset-best']) == 0
    base = cfg['baseline']['train']['state_file']
    assert _marker(base) == 2.0  # the best checkpoint is now the baseline
    [backup] = pathlib.Path(base).parent.glob('baseline.pth.*.bak')
    assert _marker(backup) == 1.0  # the previous baseline survives
    state = torch.load(cfg['control']['state_file'], weights_only=True)
    assert state['best_perf'] == {'avg_rank': 4.0, 'avg_pt': -135.0}
    assert _marker(cfg['control']['state_file']) == 3.0  # weights untouched
    assert 'restart the clients' in capsys.readouterr().out


def test_rotate_refuses_a_bad_source(setup, capsys):
    cfg_path, cfg = setup
    bad = pathlib.Path(cfg['control']['best_state_file'])
    torch.save({'model': {}}, bad)
    rb = _module()
    assert rb.main(['-c', str(cfg_path)]) == 1
    assert "lacks ['mortal', 'current_dqn', 'config']" in capsys.readouterr().err
    assert _marker(cfg['baseline']['train']['state_file']) == 1.0  # nothing touched
