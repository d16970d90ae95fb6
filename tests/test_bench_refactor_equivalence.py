"""bench/refactor_equivalence.py: the same tree twice is identical in every part; a planted change to the loss is
found in both training parts and not in the loader nor the arena; another gzip level changes the logs' size, not
their digest."""

import re
import shutil

import pytest

from conftest import ROOT, load_script


@pytest.mark.slow
def test_same_tree_is_identical_and_a_planted_loss_change_is_found(tmp_path, capsys):
    bench = load_script('bench/refactor_equivalence.py', 'refactor_equivalence')
    assert bench.main(['--old', str(ROOT), '--new', str(ROOT), '--steps', '3']) == 0
    out = capsys.readouterr().out
    assert out.count('identical') == 4 and 'cannot run' not in out
    planted = tmp_path / 'tree'
    shutil.copytree(ROOT, planted, ignore=shutil.ignore_patterns('.git', 'work', '__pycache__'))
    # the learner's DQN term, wherever the loss lives: exactly one source line computes it
    [loss] = [p for p in (planted / 'mortal').rglob('*.py') if 'dqn_loss = 0.5 * ' in p.read_text()]
    text = loss.read_text()
    assert text.count('dqn_loss = 0.5 * ') == 1
    loss.write_text(text.replace('dqn_loss = 0.5 * ', 'dqn_loss = 0.5001 * '))
    [arena] = [p for p in (planted / 'mortal').rglob('*.py') if 'log_compresslevel: int = 9' in p.read_text()]
    arena.write_text(arena.read_text().replace('log_compresslevel: int = 9', 'log_compresslevel: int = 1'))
    assert bench.main(['--old', str(ROOT), '--new', str(planted), '--steps', '3']) == 1
    lines = capsys.readouterr().out.splitlines()
    verdicts = {ln.split()[0]: ln.split()[1] for ln in lines if not ln.startswith((' ', 'arena gzip'))}
    assert verdicts == {'loader': 'identical', 'offline_epoch': 'DIFFERENT', 'online_steps': 'DIFFERENT',
                        'arena_logs': 'identical'}
    [sizes] = [ln for ln in lines if ln.startswith('arena gzip')]
    old, new = (int(v) for v in re.findall(r'(\d+) bytes of gzip', sizes))
    assert new > old * 1.05  # level 1 compresses worse
