"""bench/refactor_equivalence.py: the same tree twice is identical in every part; a planted change to the loss is
found in both training parts and not in the loader."""

import shutil

import pytest

from conftest import ROOT, load_script


@pytest.mark.slow
def test_same_tree_is_identical_and_a_planted_loss_change_is_found(tmp_path, capsys):
    bench = load_script('bench/refactor_equivalence.py', 'refactor_equivalence')
    assert bench.main(['--old', str(ROOT), '--new', str(ROOT), '--steps', '3']) == 0
    out = capsys.readouterr().out
    assert out.count('identical') == 3 and 'cannot run' not in out
    planted = tmp_path / 'tree'
    shutil.copytree(ROOT, planted, ignore=shutil.ignore_patterns('.git', 'work', '__pycache__'))
    loss = planted / 'mortal' / 'learning' / 'loss.py'
    text = loss.read_text()
    assert text.count('dqn_loss = 0.5 * F.mse_loss(') == 1
    loss.write_text(text.replace('dqn_loss = 0.5 * F.mse_loss(', 'dqn_loss = 0.5001 * F.mse_loss('))
    assert bench.main(['--old', str(ROOT), '--new', str(planted), '--steps', '3']) == 1
    lines = capsys.readouterr().out.splitlines()
    verdicts = {ln.split()[0]: ln.split()[1] for ln in lines if not ln.startswith(' ')}
    assert verdicts == {'loader': 'identical', 'offline_epoch': 'DIFFERENT', 'online_steps': 'DIFFERENT'}
