"""bench/learning.py helpers that a user's command line reaches: --set parsing and --mark-minutes."""

import math

import pytest

from conftest import load_script

learning = load_script('bench/learning.py', 'bench_learning')


def test_mark_tags_are_distinct_and_sort_by_minutes():
    assert [learning.mark_tag(m) for m in (30, 0.4, 0.5, 7.5, 120)] == ['030m', '000.4m', '000.5m', '007.5m',
                                                                       '120m']


@pytest.mark.parametrize('marks, minutes, problem', [
    ([30], 120, None),
    ([0.4, 0.5], 0, None),
    ([30, 30.0], 120, 'repeats a value'),
    ([math.nan], 0, 'finite number of minutes > 0'),
    ([-5], 0, 'finite number of minutes > 0'),
    ([150], 120, 'past --minutes 120'),
])
def test_check_marks(marks, minutes, problem):
    got = learning.check_marks(marks, minutes)
    assert got is None if problem is None else problem in got


def test_parse_sets_reads_toml_values():
    assert learning.parse_sets(['online.offline_batch_size=64', 'optim.scheduler.peak=1e-5',
                                'grp.state_file=/x/grp.pth']) == [
        (['online', 'offline_batch_size'], 64), (['optim', 'scheduler', 'peak'], 1e-5),
        (['grp', 'state_file'], '/x/grp.pth')]
    with pytest.raises(SystemExit):
        learning.parse_sets(['no-equals-sign'])


def test_a_finished_start_is_reused_untouched(tmp_path, monkeypatch):
    start = tmp_path / 'start'
    (start / 'online').mkdir(parents=True)
    (start / 'online' / 'baseline.pth').write_bytes(b'x')
    (start / 'config.toml').write_text('old = 1\n')
    from mortal import bootstrap

    def no_step(*a, **k):
        raise AssertionError('a finished start must not run a bootstrap step')
    monkeypatch.setattr(bootstrap, 'run_steps', no_step)
    assert learning.make_start(tmp_path, version=3, games=8, grp_games=0, progress=False) == start.resolve()
    assert (start / 'config.toml').read_text() == 'old = 1\n'


def test_arm_config_keeps_the_starts_reward_and_reward_model(tmp_path):
    import toml
    from mortal.quickstart_config import render_config
    start = tmp_path / 'start'
    start.mkdir()
    cfg = toml.loads(render_config(start, preset='full', version=3))
    cfg['env']['reward'] = 'points'  # what check_grp writes for a GRP no better than uniform
    cfg['grp']['state_file'] = '/somewhere/grp.pth'
    (start / 'config.toml').write_text(toml.dumps(cfg))
    arm = tmp_path / 'arm'
    arm.mkdir()
    _, out = learning.arm_config(start, arm, [(['online', 'counterfactual_weight'], 1.0)], port=5123)
    assert out['env']['reward'] == 'points'
    assert out['grp']['state_file'] == '/somewhere/grp.pth'
    assert out['online']['counterfactual_weight'] == 1.0
    assert toml.load(arm / 'config.toml')['env']['reward'] == 'points'
