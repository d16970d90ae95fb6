"""bench/grp_quality.py rank: the correlation of each kyoku reward with the final rank."""

import gzip
import shutil

import numpy as np
import pytest
import torch

from conftest import DATA_DIR, load_script


@pytest.fixture(scope='module')
def gq():
    return load_script('bench/grp_quality.py', 'grp_quality')


@pytest.fixture
def val_dir(tmp_path):
    for i, name in enumerate(['riichienv_selfplay_hanchan.jsonl', 'meta_annotated_hanchan.jsonl']):
        (tmp_path / f'{i}.json.gz').write_bytes(gzip.compress((DATA_DIR / name).read_bytes()))
    shutil.copy(DATA_DIR / 'arena_double_ron_hanchan.json.gz', tmp_path / '2.json.gz')
    return tmp_path


def test_points_reward_correlation_with_final_rank(gq, val_dir):
    from mortal.data.grp import Grp
    n, corr = gq.rank_correlation(str(val_dir))
    games = Grp.load_gz_log_files(sorted(val_dir.glob('*.json.gz')))
    assert n == 4 * sum(len(g) - 1 for g in games)  # every seat's kyoku but each game's last
    # by hand: each kyoku's score change of the seat against its final rank 1-4
    deltas, ranks = [], []
    for g in games:
        for seat in range(4):
            scores = np.rint(g.feature[:, 3 + seat] * 1e4)
            deltas += list(np.diff(scores))
            ranks += [int(g.rank_by_player[seat]) + 1] * (len(g) - 1)
    assert corr == pytest.approx(np.corrcoef(deltas, ranks)[0, 1], abs=1e-9)  # the scale changes no correlation
    assert corr < 0  # a gain goes with a better (lower) final rank


def test_rank_subcommand_prints_points_and_each_grp(gq, val_dir, tmp_path, capsys):
    from mortal.model.networks import GRP
    torch.manual_seed(0)
    path = tmp_path / 'grp.pth'
    torch.save({'model': GRP(hidden_size=64, num_layers=2).state_dict(), 'steps': 0}, path)
    assert gq.main(['rank', str(val_dir), str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith('points: ') and ' kyoku, corr -' in out[1]
    assert out[2].startswith(f'{path}: ') and 'val CE ' in out[2]
