"""bench/arena.py: the replay of the arena's serving rule and the schedule bound, on steps worked out by hand."""

import pytest

from conftest import load_script


def _module():
    return load_script('bench/arena.py', 'arena_bench')


def test_replay_serves_the_side_with_most_pending_ties_to_the_challenger():
    # game 0 steps C then H, game 1 H then C: turn 1 ties 1-1 -> C (game 0 moves to H); turn 2 H serves both
    # (game 0 ends, game 1 moves to C); turn 3 C ends game 1
    per_turn, early = _module().replay_max_pending([[(1, 0), (0, 1)], [(0, 1), (1, 0)]])
    assert per_turn == [1, 2, 1]
    assert early == [1, 2]  # N = 2: the cut is the first game's end, turn 2 included


def test_replay_counts_a_step_of_both_sides_once_each_side_decided():
    # one game, one step needing 1 challenger and 2 champion decisions: champion first (2 > 1), then challenger
    per_turn, _ = _module().replay_max_pending([[(1, 2)]])
    assert per_turn == [2, 1]


def test_best_schedule_beats_the_greedy_rule_by_waiting():
    # game 0: H then C; games 1, 2: C. Greedy serves C first (2 > 1) and needs 3 turns [2, 1, 1];
    # serving H first lets all three games meet at C: 2 turns [1, 3]
    steps = [[(0, 1), (1, 0)], [(1, 0)], [(1, 0)]]
    mod = _module()
    assert mod.replay_max_pending(steps) == ([2, 1, 1], [2])
    assert mod.best_schedule(steps, 4) == ([1, 3], [1, 3])


def test_an_unwritable_json_path_fails_before_the_games(tmp_path, capsys, monkeypatch):
    mod = _module()
    monkeypatch.setattr(mod, 'run', lambda *a, **k: pytest.fail('played games before checking --json'))
    (tmp_path / 'a_file').write_text('x')
    bad = tmp_path / 'a_file' / 'figures.json'  # its folder is a file
    with pytest.raises(SystemExit) as info:
        mod.main(['--seeds', '1', '--json', str(bad)])
    assert info.value.code == 2
    assert f'--json {bad}: cannot write it (Not a directory)' in capsys.readouterr().err
