"""bench/gpu.py: the log parsing of the learner's idle time (by hand), and the reduced CPU mode end to end."""

import datetime
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, load_script

gpu = load_script('bench/gpu.py', 'bench_gpu')


def at(clock):
    """Epoch seconds of ``2026-01-01 HH:MM:SS`` local time, as the log's timestamps are read."""
    return datetime.datetime.strptime(f'2026-01-01 {clock}', '%Y-%m-%d %H:%M:%S').timestamp()


LOG = '\n'.join([
    '2026-01-01 00:00:00,000 INFO mortal.train: learner started (pid 1)',
    '2026-01-01 00:00:10,000 INFO mortal.train: param has been submitted (version 1, idle)',
    '2026-01-01 00:00:25,500 INFO mortal.train: drained 8 logs after 15.5 s; staleness mean 0.00, max 0',
    '2026-01-01 00:00:25,600 INFO mortal.train: total steps: 0 (~8,000)',
    'TRAIN:   0%|          | 1/400 [00:00<05:58,  1.11batch/s]\rTRAIN:   1%|          | 3/400 [00:01<03:18]',
    '2026-01-01 00:00:30,000 INFO mortal.train: param has been submitted (version 2)',  # not idle: no wait
    '2026-01-01 00:00:40,000 INFO mortal.train: param has been submitted (version 3, idle)',
    '2026-01-01 00:00:44,000 INFO mortal.client: drained 99 logs after 1.0 s',  # another logger: ignored
])


def test_learner_idle_counts_finished_and_ongoing_waits():
    idle = gpu.learner_idle(LOG, at('00:01:00'))
    assert idle['ready'] == pytest.approx(at('00:00:10'))
    assert idle['waits'] == [15.5] and idle['logs'] == 8
    assert idle['ongoing'] == pytest.approx(20.0)  # from the idle submission at 00:00:40 to the stop at 00:01:00
    s = gpu.idle_summary(idle, at('00:01:00'))
    assert s['window_s'] == pytest.approx(50.0) and s['wait_s'] == pytest.approx(35.5)
    assert s['idle_fraction'] == pytest.approx(35.5 / 50)
    # after the first drain (ended 00:00:25.5): 20 s of 34.5 s
    assert s['idle_fraction_after_first_drain'] == pytest.approx(20 / 34.5, abs=1e-4)


def test_learner_idle_without_a_drain_and_without_a_submission():
    text = LOG.splitlines()[1]
    idle = gpu.learner_idle(text, at('00:00:30'))
    assert idle['waits'] == [] and idle['ongoing'] == pytest.approx(20.0)
    s = gpu.idle_summary(idle, at('00:00:30'))
    assert s['idle_fraction'] == 1.0 and s['idle_fraction_after_first_drain'] is None
    assert gpu.learner_idle(LOG.splitlines()[0], at('00:00:30'))['ready'] is None


def test_trained_steps_follow_the_progress_bar():
    assert gpu.trained_steps(LOG, 400) == 3
    # a resumed learner at 4,123 steps: its bar starts at 123 of 400; a completed bar and the save after it
    text = ('x INFO mortal.train: total steps: 4,123 (~3,877)\nTRAIN: | 130/400 [\rTRAIN: | 400/400 [\r'
            'TRAIN: | 400/400 [\nx INFO mortal.train: total steps: 4,400 (~3,600)\nTRAIN: | 2/400 [')
    assert gpu.trained_steps(text, 400) == 4402
    assert gpu.trained_steps('no steps here\nTRAIN: | 5/400 [', 400) is None


def test_submitted_logs_in_the_window():
    text = ('2026-01-01 00:00:05,000 INFO mortal.client: 128 logs have been submitted\n'
            '2026-01-01 00:00:20,000 INFO mortal.client: 128 logs have been submitted\n'
            '2026-01-01 00:00:50,000 INFO mortal.client: 64 logs have been submitted\n'
            '2026-01-01 00:01:10,000 INFO mortal.client: 128 logs have been submitted\n')
    assert gpu.submitted_logs(text, at('00:00:10'), at('00:01:00')) == 192


def _gpu_sh(tmp_path, *args, bare_python=False):
    """bench/gpu.sh ``args`` with rm, mkdir, tee and python stubbed to record their arguments (nothing is run or
    removed, whatever the script does): (returncode, stderr, the stubs' calls). ``bare_python``: its checks
    (``python -c``, ``-I``, ``-``) fail, as on a machine that lacks the project's packages."""
    stubs = tmp_path / 'stubs'
    stubs.mkdir()
    calls = tmp_path / 'calls'
    for name in ('rm', 'mkdir', 'tee', 'python'):
        fail = 'case "$1" in -c|-I|-) exit 1;; esac\n' if bare_python and name == 'python' else ''
        (stubs / name).write_text(f'#!/bin/sh\necho {name} "$@" >> {calls}\n{fail}')
        (stubs / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ('OUT', 'BENCH_T0')}
    env.update(PATH=f"{stubs}:{env['PATH']}", PYTHON=str(stubs / 'python'))
    proc = subprocess.run(['bash', str(ROOT / 'bench' / 'gpu.sh'), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    return proc.returncode, proc.stderr, calls.read_text().splitlines() if calls.exists() else []


def test_gpu_sh_refuses_an_empty_dir_before_removing_anything(tmp_path):
    rc, err, calls = _gpu_sh(tmp_path, '--cpu-smoke', '--arena', '')  # e.g. an unset "$DIR": rm -rf /logs
    assert (rc, calls) == (2, [])
    assert 'bench/gpu.sh: DIR is empty' in err


def test_gpu_sh_refuses_a_second_dir(tmp_path):
    rc, err, calls = _gpu_sh(tmp_path, '--cpu-smoke', 'a', '--arena', 'b')
    assert (rc, calls) == (2, [])
    assert 'bench/gpu.sh: one DIR only, got a and b' in err


def test_gpu_sh_stops_when_dir_cannot_be_made(tmp_path):
    (tmp_path / 'a_file').write_text('x')
    env = {k: v for k, v in os.environ.items() if k not in ('OUT', 'BENCH_T0')}
    env['PYTHON'] = 'false'  # the driver must not even start
    proc = subprocess.run(['bash', str(ROOT / 'bench' / 'gpu.sh'), '--cpu-smoke', str(tmp_path / 'a_file' / 'out')],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == f"bench/gpu.sh: cannot write the results to {tmp_path / 'a_file' / 'out'}"


def test_gpu_sh_help_is_the_header_alone():
    proc = subprocess.run(['bash', str(ROOT / 'bench' / 'gpu.sh'), '--help'], capture_output=True, text=True,
                          timeout=30)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and all(line.startswith('#') for line in lines), lines
    assert lines[-1].startswith('# go into a temporary site folder on PYTHONPATH')


def test_gpu_sh_sets_up_offline(tmp_path):
    # the device's Python has no package index: scripts/setup.sh's pip calls hung or failed there, before any part ran
    (tmp_path / 'out' / 'logs').mkdir(parents=True)  # mkdir is a stub
    rc, err, calls = _gpu_sh(tmp_path, str(tmp_path / 'out'), bare_python=True)
    pips = [c for c in calls if ' -m pip ' in f' {c} ']
    assert all('--no-index' in c and 'download' not in c for c in pips), pips
    assert any(c.endswith('setup.py -q build_ext --inplace') for c in calls), calls
    assert not [c for c in calls if 'scripts/setup.sh' in c]
    driver = [c for c in calls if 'bench/gpu.py run' in c]
    assert len(driver) == 1 and '--parts all' in driver[0] and '--quick' not in driver[0], calls


def test_gpu_sh_passes_quick_sweep_and_sizes_to_the_driver(tmp_path):
    rc, err, calls = _gpu_sh(tmp_path, '--quick', '--sweep', '--set', 'games.4=16', str(tmp_path / 'out'))
    driver = [c for c in calls if 'bench/gpu.py run' in c]
    assert len(driver) == 1, calls
    assert ' --quick --set games.4=16 ' in driver[0] and driver[0].endswith('--parts sweep'), driver
    (tmp_path / 'x').mkdir()
    rc, err, calls = _gpu_sh(tmp_path / 'x', '--set')
    assert (rc, calls) == (2, []) and 'bench/gpu.sh: --set needs KEY=VALUE' in err


def test_sizes_overrides():
    sizes = gpu.apply_overrides(gpu.GPU_SIZES, ['games.4=16', 'clients=[1,4]', 'online_window_s=50.5'])
    assert sizes['games'] == {3: 64, 4: 16} and sizes['clients'] == (1, 4) and sizes['online_window_s'] == 50.5
    assert gpu.GPU_SIZES['games'] == {3: 64, 4: 32}  # a copy: the mode's sizes stay
    for bad, msg in (('nosuch=1', "no size 'nosuch'"), ('games.5=1', "games has no entry 5"),
                     ('games', 'expected KEY=VALUE'), ('budget_s.3=1', "no size 'budget_s.3'")):
        with pytest.raises(SystemExit, match=msg):
            gpu.apply_overrides(gpu.GPU_SIZES, [bad])


def test_the_trainer_peak_is_the_larger_of_warmup_and_steady():
    from bench.gpu_trainer import _max_peak
    assert _max_peak({'allocated': 5, 'reserved': 9}, {'allocated': 7, 'reserved': 8}) == {'allocated': 7,
                                                                                           'reserved': 9}
    assert _max_peak({'allocated': None, 'reserved': None}, {'allocated': None, 'reserved': None}) == {
        'allocated': None, 'reserved': None}


def test_client_counts_follow_the_cores():
    from bench.gpu_selfplay import client_counts
    assert client_counts(gpu.GPU_SIZES, 16) == [1, 2, 4, 8, 12]
    assert client_counts(gpu.GPU_SIZES, 8) == [1, 2, 4, 8]
    assert client_counts(gpu.GPU_SIZES, 1) == [1]


def test_a_sweep_count_sums_its_clients_and_says_when_no_game_finished(tmp_path):
    from bench.gpu_selfplay import _collect, _finish_entry, _rows_per_game, best_counts
    flags = tmp_path / 'flags'
    flags.mkdir()
    files = []
    recs = [  # client 0 finished one round of 32 games in 40 s; client 1 none, but 5 games ended in its 30 s window
        {'status': 'ok', 'rounds': 1, 'games': 32, 'round_s': 40.0, 'games_finished': 32, 'seconds': 41.0,
         'hanchan_per_hour': 2880.0, 'rows_per_s': 800.0, 'rows_per_forward': 24.0, 'aborted': False,
         'rows_per_game': 1000.0},
        {'status': 'ok', 'rounds': 0, 'games': 0, 'round_s': None, 'games_finished': 5, 'seconds': 30.0,
         'hanchan_per_hour': 600.0, 'rows_per_s': 700.0, 'rows_per_forward': 20.0, 'aborted': True,
         'rows_per_game': None}]
    for i, rec in enumerate(recs):
        f = tmp_path / f'client{i}.json'
        f.write_text(json.dumps({'versions': {'3': {'2': rec}}}))
        files.append(f)
        (flags / f'done.3.2.{i}').touch()
    e = _collect([], files, flags, 3, 2, 0)
    assert e['status'] == 'ok' and e['games_finished'] == 37 and e['rounds'] == 1
    assert e['hanchan_per_hour'] == 3480.0 and e['basis'] == 'games finished in the window'
    assert e['rows_per_s'] == 1500.0 and e['rows_per_forward'] == 22.0 and e['aborted'] is True
    none = {'status': 'ok', 'hanchan_per_hour': None, 'rows_per_s': 2000.0, 'seconds': 12.0, 'games_per_round': 32}
    out = {'v3': {'2': e, '4': none}, 'v4': {}}
    per_game = _rows_per_game(out)
    assert per_game == {3: 1000.0}
    _finish_entry(none, per_game[3])
    assert none['hanchan_per_hour_from_rows'] == 7200.0  # 2000 rows/s / 1000 rows per game * 3600
    assert none['note'] == 'no game finished in 12 s (rounds of 32 games): hanchan/h only estimated from rows'
    assert best_counts(out) == {3: (2, 3480.0)}
    text = gpu.table({'meta': {'mode': 'gpu', 'parts': 'all'}, 'selfplay_sweep': out})
    assert '| self-play v3, 2 client(s) | hanchan/h [games finished, basis] (rows/s) | 3,480.0 [37 games, games ' \
           'finished in the window] (1,500.0) |' in text
    assert '| self-play v3, 4 client(s) | hanchan/h [games finished, basis] (rows/s) | no game finished in 12.0 s; ' \
           'estimate from rows 7,200.0 (2,000.0) |' in text


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cpu_smoke_writes_every_figure(tmp_path):
    out = tmp_path / 'results'
    env = {k: v for k, v in os.environ.items() if k not in ('OUT', 'BENCH_T0')}
    proc = subprocess.run(['bash', str(ROOT / 'bench' / 'gpu.sh'), '--cpu-smoke', str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / 'results.json').read_text())
    assert r['errors'] == {}, r['errors']
    meta = r['meta']
    assert meta['mode'] == 'cpu-smoke' and meta['device'] == 'cpu'
    assert 0 < meta['total_s'] < meta['budget_s']
    assert r['setup']['status'] == 'skipped'

    sw = r['selfplay_sweep']
    assert sw['counts'] == [1, 2][:os.cpu_count()] and sw['network'] == '16x1'
    assert sw['order'] == sorted(sw['counts'], reverse=True)  # the largest first
    first = str(sw['order'][0])
    for v in (3, 4):
        for n in sw['counts']:
            e = sw[f'v{v}'][str(n)]
            assert e['version'] == v and e['clients'] == n, e
            if v == 3 and str(n) != first and e['status'].startswith('skipped: a round took'):
                continue  # the first count's round left too little of version 3's time for another whole round
            assert e['status'] == 'ok', e
            assert e['rows_per_s'] > 0 and len(e['per_client']) == n
            assert e['games_finished'] == sum(c['games_finished'] for c in e['per_client'])
            for c in e['per_client']:
                assert c['rows'] > 0 and c['rows_per_forward'] >= 1 and 0 < c['cpu_fraction'] <= 1.5
                assert c['peak_memory'] == {'allocated': None, 'reserved': None}
            if e['hanchan_per_hour'] is None:  # no game finished: said so, and an estimate only from rows
                assert e['games_finished'] == 0 and e['note'].startswith('no game finished in')
            else:
                assert e['games_finished'] > 0 and e['basis'] in ('whole rounds', 'games finished in the window')
    # the first v3 count's rounds run to their end (its hard limit is long): 4 whole games of hundreds of decisions
    # each per client, timed one by one as they end; the v4 counts are stopped early and have no finished game
    v3 = sw['v3'][first]
    assert v3['basis'] == 'whole rounds' and v3['rounds'] >= len(v3['per_client'])
    for c in v3['per_client']:
        assert c['games'] == 4 * c['rounds'] and c['games_finished'] >= c['games'] and c['rows_per_game'] > 100
        assert c['hanchan_per_hour'] == pytest.approx(c['games'] / (c['round_s'] * c['rounds']) * 3600, rel=0.01)
    assert v3['hanchan_per_hour'] == pytest.approx(sum(c['hanchan_per_hour'] for c in v3['per_client']), abs=0.2)
    finished = [c['rows_per_game'] for e in sw['v3'].values() for c in e.get('per_client') or []
                if c.get('rows_per_game')]  # every finished round of version 3 in the part
    per_game = sum(finished) / len(finished)
    for e in sw['v3'].values():
        if e['status'] == 'ok':
            assert e['rows_per_game_ref'] == pytest.approx(per_game, abs=0.1)
            assert e['hanchan_per_hour_from_rows'] == pytest.approx(e['rows_per_s'] / per_game * 3600, rel=0.01)

    p = r['profile']
    assert p['version'] == 3 and p['games'] == 4
    s = p['split']
    assert s['status'] == 'ok' and s['forwards'] > 0 and s['rows_per_forward'] >= 1
    assert s['cycle_ms'] == pytest.approx(s['arena_ms'] + s['engine_ms'], abs=0.01)
    assert s['engine_cpu_ms'] <= s['engine_ms'] * 1.05 and s['engine_gpu_span_ms'] is None  # CPU: no CUDA events
    assert p['profiler']['status'] == 'ok' and p['profiler']['forwards'] > 0
    assert p['profiler']['gpu_busy_ms'] is None and p['explained'].startswith(f"{s['cycle_ms']:.1f} ms per cycle")
    assert 'Self CPU' in (out / 'logs' / 'profile_ops.txt').read_text()

    t = r['trainer']
    assert t['batch_size'] == 256 and t['samples']['batches'] >= 1
    for key, amp in (('amp_off', False), ('amp_on', True)):
        assert t[key]['status'] == 'ok' and t[key]['enable_amp'] is amp
        assert t[key]['steps'] >= 2 and t[key]['steps_per_s'] > 0
        assert t[key]['steps_per_s'] == pytest.approx(t[key]['steps'] / t[key]['seconds'], rel=1e-2)
        assert t[key]['peak_memory'] == {'allocated': None, 'reserved': None}
        assert t[key]['peak_memory_warmup'] == t[key]['peak_memory_steady'] == t[key]['peak_memory']
    assert t['test_play']['status'] == 'ok' and t['test_play']['rows'] > 0

    m = r['memory']
    assert set(m['rows']) == {'trainer_amp_off', 'trainer_amp_on', 'test_play', 'client_v3', 'client_v4'}
    for row in m['rows'].values():
        assert row['allocated'] is None and row['reserved'] is None  # CPU: no CUDA counters
        assert isinstance(row['doctor_estimate'], int) and row['doctor_estimate'] > 0
    assert m['doctor_three_processes'] == m['doctor_trainer'] + m['doctor_client'] and m['device_total'] is None

    o = r['online']
    assert o['status'] == 'ok' and o['window_s'] > 0
    assert 0 <= o['idle_fraction'] <= 1
    assert o['wait_s'] == pytest.approx(sum(o['drain_waits_s']) + o['ongoing_wait_at_stop_s'], abs=0.02)
    assert o['drains'] == len(o['drain_waits_s'])
    assert o['selfplay_logs_submitted'] >= 0 and o['selfplay_hanchan_per_hour'] >= 0
    assert o['steps'] is None or o['steps_per_s'] == pytest.approx(o['steps'] / o['window_s'], rel=0.01)
    assert 'hanchan/h' in (out / 'results.md').read_text()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cpu_smoke_arena_measures_both_speculation_arms(tmp_path):
    out = tmp_path / 'results'
    env = {k: v for k, v in os.environ.items() if k not in ('OUT', 'BENCH_T0')}
    proc = subprocess.run(['bash', str(ROOT / 'bench' / 'gpu.sh'), '--cpu-smoke', '--arena', str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / 'results.json').read_text())
    assert r['errors'] == {} and r['meta']['parts'] == 'arena'
    assert 'selfplay_sweep' not in r and 'online' not in r  # only the arena part ran
    a = r['arena_speculation']
    assert a['games'] == 4 and a['network'] == '16x1'
    for arm, flag in (('off', False), ('on', True)):
        e = a[arm]
        assert e['status'] == 'ok' and e['speculate_passes'] is flag and e['games'] == 4 and e['version'] == 3
        assert e['rows'] > 400 and e['forwards'] > 0 and 1 <= e['rows_per_forward'] <= 16  # 4 games, 4 seats
        assert e['model_floor_ratio'] == pytest.approx(e['model_games_per_s'] / e['floor_games_per_s'], rel=1e-3)
    assert 'speculated' not in a['off'] and a['on']['speculated'] >= a['on']['speculated_used'] >= 0
    assert a['games_per_s_on_over_off'] == pytest.approx(
        a['on']['model_games_per_s'] / a['off']['model_games_per_s'], rel=1e-2)
    assert 'speculate on' in (out / 'results.md').read_text()


def test_the_arena_table_names_a_failed_arm_and_leaves_out_the_default_parts():
    results = {'meta': {'mode': 'gpu', 'parts': 'arena', 'total_s': 200.0, 'budget_s': 470},
               'setup': {'status': 'ok', 'seconds': 40.0}, 'errors': {},
               'arena_speculation': {'games': 128, 'network': '192x40',
                                     'off': {'status': 'ok', 'rows_per_forward_80': 92.1, 'model_floor_ratio': 0.5},
                                     'on': {'status': 'failed: out of time (see logs/arena_on.log)'}}}
    text = gpu.table(results)
    assert 'self-play' not in text and 'trainer' not in text and 'online' not in text
    assert '| arena v3 192x40, 128 games, speculate off | rows per forward (useful) while >= 80% run; games/s vs ' \
           'floor | 92.10 (92.10); 0.500 |' in text
    assert 'speculate on | rows per forward (useful) while >= 80% run; games/s vs floor | failed: out of time ' \
           '(see logs/arena_on.log) |' in text
    assert '| arena | games/s speculate on / off | - |' in text


def test_the_table_names_the_status_of_a_failed_or_skipped_default_part():
    # results.md showed dashes for these (as for a part still running); their status was only in results.json
    results = {'meta': {'mode': 'gpu', 'parts': 'all', 'total_s': 470.0, 'budget_s': 470},
               'setup': {'status': 'ok', 'seconds': 40.0},
               'errors': {'profile': 'Traceback ...\nTimeoutError: only 5 s of the budget left'},
               'profile': {'status': 'failed: TimeoutError: only 5 s of the budget left', 'part_s': 0.1},
               'selfplay_sweep': {
                   'v3': {'1': {'status': 'ok', 'hanchan_per_hour': 1234.5, 'rows_per_s': 678.9, 'games_finished': 32,
                                'basis': 'whole rounds'}},
                   'v4': {'1': {'status': 'failed: RuntimeError: a client ended | or overran its hard limit\n'
                                          'second line (see logs/sweep_client*.log)'},
                          '2': {'status': "skipped: 3 s left of version 4's time"}}},
               'trainer': {'batch_size': 256, 'amp_off': {'status': 'ok', 'steps_per_s': 3.25},
                           'amp_on': {'status': 'failed (exit -9; see logs/trainer.log)'}},
               'memory': {'status': 'skipped: torch sees no CUDA device (see setup)', 'part_s': 0.0},
               'online': {'status': 'failed: TimeoutError: the learner did not submit its parameters in time'}}
    rows = gpu.table(results).splitlines()
    assert "| profile | one client's cycle | failed: TimeoutError: only 5 s of the budget left |" in rows
    cell = '| self-play v{} | hanchan/h [games finished, basis] (rows/s) | {} |'
    assert cell.format('3, 1 client(s)', '1,234.5 [32 games, whole rounds] (678.9)') in rows
    # one line of the status, its '|' escaped, so the row stays one row of three cells
    assert cell.format('4, 1 client(s)', 'failed: RuntimeError: a client ended \\| or overran its hard limit') in rows
    assert cell.format('4, 2 client(s)', "skipped: 3 s left of version 4's time") in rows
    assert '| trainer amp_off | steps/s at batch 256 | 3.25 |' in rows
    assert '| trainer amp_on | steps/s at batch 256 | failed (exit -9; see logs/trainer.log) |' in rows
    assert '| memory | GiB allocated / reserved / doctor | skipped: torch sees no CUDA device (see setup) |' in rows
    assert '| online - s | learner idle fraction (after 1st drain) | failed: TimeoutError: the learner did not ' \
           'submit its parameters in time |' in rows
    assert '| online, - clients | self-play hanchan/h beside the learner, steps trained (per s) | failed: ' \
           'TimeoutError: the learner did not submit its parameters in time |' in rows
    assert '| profile | FAILED | TimeoutError: only 5 s of the budget left |' in rows


def test_the_table_shows_dashes_for_a_part_that_has_not_ended():
    results = {'meta': {'mode': 'gpu', 'parts': 'all', 'total_s': 60.0, 'budget_s': 470},
               'setup': {'status': 'ok', 'seconds': 40.0}, 'errors': {},
               'selfplay_sweep': {'v3': {'1': {'status': 'ok', 'hanchan_per_hour': 1000.0, 'rows_per_s': 500.0,
                                               'games_finished': 8, 'basis': 'whole rounds'},
                                         '2': {'status': 'ok', 'rows_per_s': 400.0}}}}
    rows = gpu.table(results).splitlines()
    cell = '| self-play v3, {} client(s) | hanchan/h [games finished, basis] (rows/s) | {} |'
    assert cell.format(1, '1,000.0 [8 games, whole rounds] (500.0)') in rows
    assert cell.format(2, '- (400.0)') in rows
    assert not [r for r in rows if r.startswith('| profile')]
    assert '| trainer amp_on | steps/s at batch None | - |' in rows
    assert not [r for r in rows if r.startswith('| memory')]
    assert '| online, - clients | self-play hanchan/h beside the learner, steps trained (per s) | -, - (-/s) |' in rows


def test_plan_counts_measures_what_fits_with_a_whole_round_each():
    from bench.gpu_selfplay import plan_counts, sweep_order
    # the largest first (the box's figure), then 1 (the reference), then nearest the geometric middle of 1..12 (3.46)
    assert sweep_order([1, 2, 4, 8, 12]) == [12, 1, 4, 2, 8]
    assert sweep_order([1, 2]) == [2, 1] and sweep_order([1]) == [1]
    sizes = dict(gpu.GPU_SIZES, count_overhead_s=2.0, round_slowdown=1.3, hard_max_s=60.0)
    # a 40 s round at 12 clients: a later count needs 40 * 1.3 + 2 = 54 s; 120 s hold two counts of 120/2 - 2 = 58 s
    plan, skipped = plan_counts([1, 4, 2, 8], 12, 40.0, 120.0, sizes, 3)
    assert plan == {1: (58.0, 58.0), 4: (58.0, 58.0)}
    assert set(skipped) == {2, 8}
    assert skipped[2] == "skipped: a round took 40 s with 12 client(s); the 120 s left of version 3's time held 2 " \
                         "of the 4 later counts"
    # a 10 s round: all four fit (15 s each), each with (300 / 4 - 2) s
    plan, skipped = plan_counts([1, 4, 2, 8], 12, 10.0, 300.0, sizes, 4)
    assert plan == {n: (73.0, 73.0) for n in (1, 2, 4, 8)} and skipped == {}
    # no round ended at the first count: equal shares, each at most hard_max_s, the box of the mode
    plan, skipped = plan_counts([1, 4], 8, None, 100.0, sizes, 4)
    assert plan == {1: (48.0, 25.0), 4: (48.0, 25.0)} and skipped == {}
    plan, _ = plan_counts([1, 4], 8, None, 300.0, sizes, 3)
    assert plan == {1: (60.0, 20.0), 4: (60.0, 20.0)}
    # not even one fits; nor with the time already over
    plan, skipped = plan_counts([1], 2, 100.0, 50.0, sizes, 3)
    assert plan == {} and skipped[1].startswith('skipped: a round took 100 s with 2 client(s); the 50 s left')
    plan, skipped = plan_counts([1], 2, 100.0, -5.0, sizes, 3)
    assert plan == {} and 'the 0 s left' in skipped[1]


def test_device_wheels_pin_what_pyproject_pins():
    # the device installs these wheels with --no-deps: a pin of pyproject.toml that moves must move here too
    import re
    import tomllib
    script = (ROOT / 'scripts' / 'device_wheels.sh').read_text()
    wheels = dict(re.findall(r'([A-Za-z][\w-]*)==([\w.]+)', script[script.index('WHEELS=('):script.index(')\n')]))
    deps = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['dependencies']
    pinned = dict(re.match(r'([\w-]+)==([\w.]+)$', d).groups() for d in deps if re.match(r'[\w-]+==[\w.]+$', d))
    assert pinned == {'mjai': '0.2.1', 'riichienv': '0.4.11'}
    assert {k: wheels.get(k) for k in pinned} == pinned
    # mjai imports loguru; pydantic needs its core and typing helpers (--no-deps brings none of them)
    assert {'loguru', 'pydantic', 'pydantic-core', 'annotated-types', 'typing-inspection', 'typing-extensions',
            'toml', 'setuptools'} <= set(wheels)


@pytest.mark.slow
def test_step_bench_counts_the_kernels_of_each_part(tmp_path, monkeypatch, capsys):
    """bench/gpu_trainer.py step: the real train_batch, its parts timed and their kernel-launching ops counted; the
    Brain's forward is 6 ops plus 17 a residual block (40 at 32x2, 686 at 192x40: docs/performance_gpu.md).

    In this process (a subprocess would spend most of its time importing torch again): what the bench patches for
    its process (its phase clocks, the probe) and the RNG it seeds are put back after the test."""
    import tempfile
    import torch
    import mortal.train as tr
    from bench import gpu_trainer
    from mortal.learning import intake
    import mortal.model.networks as networks
    for owner, name in ((tr.Trainer, '_load_probe'), (intake, 'batch_on_device'), (tr, 'learner_loss'),
                        (tr, 'optimizer_step'), (torch.Tensor, 'backward'), (networks, '_stem'),
                        (networks.Mish, 'forward')):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))  # its work folder
    with torch.random.fork_rng():
        assert gpu_trainer.main(['step', '--profile', '--phases', '--channels', '16', '--blocks', '1', '--batch', '8',
                                 '--steps', '2', '--warmup', '1', '--threads', '1', '--dense-stem']) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    kernels = rec['kernels_per_step']
    assert kernels['forward: Brain'] == 6 + 17 * 1
    # the four loss terms that are off here (CQL, offline CQL, anchor, counterfactual) add no kernel: 4 fewer
    # than when each added a zero
    assert kernels['forward: DQN'] == 14 and kernels['loss terms'] == 11
    assert kernels['loss sums + q stats (host syncs)'] == 44
    assert set(rec['phases_ms']) == set(kernels) - {'all'} and rec['samples_per_s'] > 0


@pytest.mark.slow
def test_step_bench_online_runs_the_embedded_learner(tmp_path, monkeypatch, capsys):
    """bench/gpu_trainer.py step --online: the learner with the embedded config's anchor, offline mix of 64 and
    saves every 20 steps, its probe built from the fixture logs (their 2,018 decisions), CPU ms per online sample."""
    import logging
    import tempfile
    import torch
    import mortal.train as tr
    from bench import gpu_trainer
    monkeypatch.setattr(tr.Trainer, '_load_probe', tr.Trainer._load_probe)
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    level = logging.getLogger('mortal').level
    try:
        with torch.random.fork_rng():
            assert gpu_trainer.main(['step', '--online', '--channels', '16', '--blocks', '1', '--batch', '8',
                                     '--steps', '20', '--warmup', '0', '--threads', '1', '--version', '3']) == 0
    finally:
        logging.getLogger('mortal').setLevel(level)
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec['probe_size'] == 2018 and rec['steps'] == 20 and rec['cpu_ms_per_online_sample'] > 0
    state = torch.load(next(tmp_path.glob('step-*/online/mortal.pth')), weights_only=False)
    assert state['steps'] == 20  # the save of step 20 ran
