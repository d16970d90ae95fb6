"""bench/learning.py helpers that a user's command line reaches: --set parsing and --mark-minutes, and the arms
(bench/learning_arms.py) it runs."""

import math
import pathlib

import pytest

from conftest import load_script

learning = load_script('bench/learning.py', 'bench_learning')
arms = load_script('bench/learning_arms.py', 'bench_learning_arms')


def test_mark_tags_are_distinct_and_sort_by_minutes():
    assert [arms.mark_tag(m) for m in (30, 0.4, 0.5, 7.5, 120)] == ['030m', '000.4m', '000.5m', '007.5m',
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
    from mortal.tools import bootstrap

    def no_step(*a, **k):
        raise AssertionError('a finished start must not run a bootstrap step')
    monkeypatch.setattr(bootstrap, 'run_steps', no_step)
    assert learning.make_start(tmp_path, version=3, games=8, grp_games=0, progress=False) == start.resolve()
    assert (start / 'config.toml').read_text() == 'old = 1\n'


def test_arm_config_keeps_the_starts_reward_and_reward_model(tmp_path):
    import toml
    from mortal.tools.quickstart_config import render_config
    start = tmp_path / 'start'
    start.mkdir()
    cfg = toml.loads(render_config(start, preset='full', version=3))
    cfg['env']['reward'] = 'points'  # what check_grp writes for a GRP no better than uniform
    cfg['grp']['state_file'] = '/somewhere/grp.pth'
    (start / 'config.toml').write_text(toml.dumps(cfg))
    arm = tmp_path / 'arm'
    arm.mkdir()
    _, out = arms.arm_config(start, arm, [(['online', 'counterfactual_weight'], 1.0)], port=5123)
    assert out['env']['reward'] == 'points'
    assert out['grp']['state_file'] == '/somewhere/grp.pth'
    assert out['online']['counterfactual_weight'] == 1.0
    assert toml.load(arm / 'config.toml')['env']['reward'] == 'points'


def test_arm_config_gives_each_extra_client_a_profile_of_its_own(tmp_path):
    """--clients 3: [train_play.client2] and [train_play.client3] copy the default after the overrides, each with
    its own log folder (a client empties its folder every round), and the config loads."""
    import toml
    from mortal.config import load_config
    from mortal.tools.quickstart_config import render_config
    start = tmp_path / 'start'
    start.mkdir()
    (start / 'config.toml').write_text(render_config(start, preset='full', version=3))
    arm = tmp_path / 'arm'
    arm.mkdir()
    path, out = arms.arm_config(start, arm, [(['train_play', 'default', 'boltzmann_temp'], 1.0)], port=5123,
                                    clients=3)
    default = out['train_play']['default']
    assert sorted(out['train_play']) == ['client2', 'client3', 'default']
    for i in (2, 3):
        profile = out['train_play'][f'client{i}']
        assert profile['boltzmann_temp'] == 1.0 and profile['games'] == default['games']
        assert profile['log_dir'] == default['log_dir'].rstrip('/') + f'_client{i}'
    load_config(path)
    _, one = arms.arm_config(start, arm, [], port=5123)
    assert sorted(one['train_play']) == ['default']


def test_client_hanchan_sums_the_rounds_of_every_client_log(tmp_path):
    line = '2026-12-03 15:18:15,347 INFO mortal.client: trainee rankings: [{}] (2.3125, 14.0625pt)\n'
    (tmp_path / 'client.log').write_text(line.format('5, 4, 4, 3') + line.format('4, 4, 4, 4')
                                         + 'x INFO mortal.client: last 50 sessions: [182, 197, 206, 215] (2.5)\n')
    (tmp_path / 'client_client2.log').write_text(line.format('1, 0, 2, 1'))
    (tmp_path / 'train.log').write_text(line.format('9, 9, 9, 9'))  # not a client's
    assert arms.client_hanchan(tmp_path) == 16 + 16 + 4


def test_matched_control_refuses_its_own_arm_and_an_unfinished_one(tmp_path):
    arm = tmp_path / 'arms' / 'cf'
    arm.mkdir(parents=True)
    (arm / 'result.json').write_text('{"steps": 10}')
    for name in ('cf', './cf', 'cf/'):  # the same directory, however it is spelled: it would be emptied
        with pytest.raises(SystemExit, match='a name of its own'):
            learning.run_matched(tmp_path, name, 'cf', 0, print)
    assert (arm / 'result.json').exists()
    with pytest.raises(SystemExit, match='does not exist'):
        learning.run_matched(tmp_path, 'control', 'nope', 0, print)
    with pytest.raises(SystemExit, match='not a finished run arm'):  # no config.toml
        learning.run_matched(tmp_path, 'control', 'cf', 0, print)


def test_report_against_pairs_every_arm_with_one_control(tmp_path, capsys):
    """--against ctl: each other arm's final minus ctl's, paired by deal, by hand; the hanchan column."""
    import json
    arms = {'ctl': {'steps': 5, 'eval_key': 7, 'units': {'final': {'1': [2, 2, 2, 2], '2': [3, 3, 3, 3]}}},
            'rr': {'steps': 5, 'hanchan': 272, 'eval_key': 7,
                   'units': {'final': {'1': [1, 1, 1, 1], '2': [3, 3, 3, 3]}}},
            'pg': {'steps': 5, 'eval_key': 7, 'units': {'final': {'1': [4, 4, 4, 4], '2': [4, 4, 4, 4]}}}}
    for name, res in arms.items():
        (tmp_path / 'arms' / name).mkdir(parents=True)
        (tmp_path / 'arms' / name / 'result.json').write_text(json.dumps(res))
    logged = []
    learning.report(tmp_path, logged.append, against='ctl')
    out = capsys.readouterr().out
    # rr: deals (1 - 2, 3 - 3) -> mean -0.5; pg: (4 - 2, 4 - 3) -> mean +1.5; 2 deals, 8 games each
    assert 'rr final - ctl final, avg rank vs 3x start paired by deal (below 0: the online arm is better): -0.500' in out
    assert 'pg final - ctl final, avg rank vs 3x start paired by deal (below 0: the online arm is better): +1.500' in out
    assert 'ctl final - ctl final' not in out
    assert '| rr | none | 5 | 272 |' in out
    learning.report(tmp_path, logged.append, against='nope')
    assert any('--against nope: no such arm' in line for line in logged)


def test_report_pairs_a_matched_control_on_shared_deals(tmp_path, capsys):
    import json
    # deal -> the 4 ranks (1-4) of the arm's model in that deal's 4 games; deal 3 only in the online arm
    online = {'steps': 9, 'eval_key': 7, 'units': {'final': {'1': [1, 2, 1, 2], '2': [3, 3, 2, 2],
                                                             '3': [4, 4, 4, 4]}}}
    control = {'steps': 4, 'matched': 'cf', 'eval_key': 7,
               'units': {'final': {'1': [2, 2, 2, 2], '2': [3, 3, 3, 3]}}}
    for name, res in (('cf', online), ('control', control), ('broken', None)):
        (tmp_path / 'arms' / name).mkdir(parents=True)
        (tmp_path / 'arms' / name / 'result.json').write_text('{' if res is None else json.dumps(res))
    logged = []
    learning.report(tmp_path, logged.append)
    out = capsys.readouterr().out
    # per deal: (1.5 - 2) = -0.5 and (2.5 - 3) = -0.5; mean -0.5 over 2 deals (8 games)
    assert 'cf final - control final' in out and '-0.500' in out and '(8 games; unreliable: 2 sets)' in out
    assert any('broken' in line and 'skipped' in line for line in logged)
    control['eval_key'] = 8
    (tmp_path / 'arms' / 'control' / 'result.json').write_text(json.dumps(control))
    learning.report(tmp_path, logged.append)
    assert 'cf final - control final' not in capsys.readouterr().out
    assert any('other keys' in line for line in logged)


def test_report_skips_a_result_of_the_wrong_field_types_by_name(tmp_path, capsys):
    import json
    good = {'steps': 4, 'eval_key': 7, 'units': {'final': {'1': [2, 2, 2, 2]}},
            'vs_start': {'final': {'avg_rank': 2.5, 'avg_rank_ci': 0.1, 'avg_pt': 0.0, 'avg_pt_ci': 0.0, 'games': 4,
                                   'deals': 1}}}
    bad = {**good, 'sets': 3, 'curve': [{'step': 'x', 'avg_rank': 2.5, 'avg_rank_ci': 0.1}],
           'units': {'final': {'1': ['2']}}}
    for name, res in (('good', good), ('bad', bad)):
        (tmp_path / 'arms' / name).mkdir(parents=True)
        (tmp_path / 'arms' / name / 'result.json').write_text(json.dumps(res))
    logged = []
    learning.report(tmp_path, logged.append)  # was a TypeError from the row of 'bad'
    out = capsys.readouterr().out
    assert '| good | none | 4 |' in out and '| bad |' not in out
    assert any(str(tmp_path / 'arms' / 'bad' / 'result.json') in line
               and 'field(s) curve, sets, units not of the type the bench writes' in line for line in logged), logged
    assert learning.result_problem(good) == ''


def test_learning_and_learning_flaw_import_no_circle():
    """bench/learning.py runs bench/learning_flaw.py; the flaw bench takes the arms from learning_arms.py, never
    from learning.py (an import circle would run learning.py's module body inside learning_flaw's)."""
    import ast
    from conftest import ROOT

    def imports(name):
        tree = ast.parse((ROOT / 'bench' / f'{name}.py').read_text(encoding='utf-8'))
        return {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
            n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}

    assert 'learning_flaw' in imports('learning') and 'learning_arms' in imports('learning')
    assert 'learning' not in imports('learning_flaw') and 'learning_arms' in imports('learning_flaw')
    assert not {'learning', 'learning_flaw'} & imports('learning_arms')


def test_sigterm_stops_the_arms_processes(tmp_path):
    """A SIGTERM to ``bench/learning.py run`` unwinds through run_arm's ``finally`` (which stops the arm's
    server, learner and client) and exits 143; before, the benchmark died and its children played on."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / 'child.pid'
    driver = tmp_path / 'driver.py'
    # run_arm stood in by one child process stopped in a finally, as run_arm stops its three
    driver.write_text(
        'import pathlib, subprocess, sys, time\n'
        'sys.path.insert(0, "bench")\n'
        'import learning\n'
        'def run_arm(out, arm, **kw):\n'
        '    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])\n'
        f'    pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\n'
        '    try:\n'
        '        time.sleep(120)\n'
        '    finally:\n'
        '        child.kill()\n'
        '        child.wait()\n'
        'learning.run_arm = run_arm\n'
        f'sys.exit(learning.main(["--out", {str(tmp_path / "out")!r}, "run", "x", "--steps", "1"]))\n')
    root = pathlib.Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, str(driver)], cwd=root,
                            env={**os.environ, 'PYTHONPATH': str(root)})
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
