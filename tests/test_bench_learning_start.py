"""bench/learning_start.py (start-curve): the plateau rule, the curve's table, the prefixes of the shared games."""

import os

import pytest

from conftest import load_script

arms = load_script('bench/learning_arms.py', 'learning_arms')
curve = load_script('bench/learning_start.py', 'bench_learning_start')


@pytest.mark.parametrize('points, gain, picked', [
    # 96 -> 384 gains (6.0 - 5.7) / 6.0 = 5% >= 2%; 384 -> 1536 gains (5.7 - 5.65) / 5.7 = 0.9% < 2%: 384
    ([(1536, 5.65), (96, 6.0), (384, 5.7)], 0.02, (384, True)),
    # the same curve with a 0.5% rule: every step gains more, so the largest, not flattened
    ([(96, 6.0), (384, 5.7), (1536, 5.65)], 0.005, (1536, False)),
    # a point that gets worse (overfitting noise) counts as no gain: 96 -> 384 rises
    ([(96, 6.0), (384, 6.1), (1536, 5.0)], 0.02, (96, True)),
    # exactly 2% is a gain (0.5 -> 0.49, the fraction exact in binary: 0.01 = 0.02 x 0.5): the next step's 1% is not
    ([(96, 0.5), (384, 0.49), (1536, 0.4851)], 0.02, (384, True)),
    ([(96, 6.0)], 0.02, (96, False)),
])
def test_pick_count(points, gain, picked):
    assert curve.pick_count(points, gain) == picked


def test_curve_table_rows_and_pick():
    rows = [{'games': 384, 'val_loss': 5.7, 'best_epoch': 3, 'epochs': 3, 'grp_ce': 2.61, 'play_s': 240,
             'grp_s': 30, 'offline_s': 600},
            {'games': 96, 'val_loss': 6.0, 'best_epoch': 2, 'epochs': 3, 'grp_ce': 3.05, 'play_s': 60, 'grp_s': 6,
             'offline_s': 150},
            {'games': 1536, 'val_loss': 5.65, 'best_epoch': 2, 'epochs': 3, 'grp_ce': 2.45, 'play_s': 960,
             'grp_s': 90, 'offline_s': 2400}]
    lines = curve.curve_table(rows, 0.02)
    assert lines[0].startswith('| hanchan | offline val loss |') and lines[1].startswith('|---|')
    # sorted by hanchan; gain to next: (6.0 - 5.7) / 6.0 = +5.0%, (5.7 - 5.65) / 5.7 = +0.9%; minutes = s / 60
    assert lines[2] == '| 96 | 6.0000 | 2 / 3 | +5.0% | 3.050 | 1.0 | 0.1 | 2.5 |'
    assert lines[3] == '| 384 | 5.7000 | 3 / 3 | +0.9% | 2.610 | 4.0 | 0.5 | 10.0 |'
    assert lines[4] == '| 1536 | 5.6500 | 2 / 3 | - | 2.450 | 16.0 | 1.5 | 40.0 |'
    assert lines[5].startswith('\npicked: 384 hanchan (the next point gains less than 2%')


def test_link_logs_takes_the_first_deals_and_every_validation_log(tmp_path):
    src, dst = tmp_path / 'src', tmp_path / 'dst'
    for split, key, nonces in (('train', 7, range(4)), ('val', 8, range(2))):
        (src / split).mkdir(parents=True)
        for nonce in nonces:
            for s in 'abcd':
                (src / split / f'{nonce}_{key}_{s}.json.gz').write_bytes(b'x')
    (src / 'train' / '0_9_a.json.gz').write_bytes(b'x')  # another key: not this bootstrap's
    # 8 hanchan = deals 0 and 1, 4 rotations each; all 8 validation logs
    assert arms.link_logs(src, dst, 8, 7) == 16
    assert sorted(p.name for p in (dst / 'train').iterdir()) == [f'{n}_7_{s}.json.gz' for n in (0, 1) for s in 'abcd']
    assert len(list((dst / 'val').iterdir())) == 8
    assert os.path.realpath(dst / 'train' / '1_7_d.json.gz') == str((src / 'train' / '1_7_d.json.gz').resolve())
    assert arms.link_logs(src, dst, 12, 7) == 4  # deal 2 added; the links already there are kept


def test_play_seconds_from_the_prefix_write_times(tmp_path):
    (tmp_path / 'train').mkdir()
    for nonce, t in enumerate((1000.0, 1010.0, 1020.0, 1300.0)):
        for s in 'ab':
            path = tmp_path / 'train' / f'{nonce}_7_{s}.json.gz'
            path.write_bytes(b'x')
            os.utime(path, (t - (s == 'a'), t - (s == 'a')))
    # the first 12 hanchan = deals 0-2, written 1000-1020: span 20 s over 2 intervals, 3 deals -> 30 s
    assert curve.play_seconds(tmp_path, 12) == pytest.approx(30.0)
    assert curve.play_seconds(tmp_path, 4) == 0.0


def test_a_curve_refuses_another_reward_model_before_playing(tmp_path, monkeypatch):
    """Points trained with the GRP of 384 hanchan: adding 768 without --reward-games 384 would train it with
    another reward model, whose validation loss does not compare; refused before any game is played."""
    import json
    (tmp_path / 'curve').mkdir()
    (tmp_path / 'curve' / 'curve.json').write_text(json.dumps(
        {'reward_games': 384, 'points': {'384': {'games': 384, 'val_loss': 4.2}}}))

    def no_games(*a, **k):
        raise AssertionError('no game may be played')
    monkeypatch.setattr(curve, 'shared_logs', no_games)
    kw = dict(version=3, val_games=64, max_epochs=3, gain=0.02, progress=False, log=print)
    with pytest.raises(SystemExit, match='--reward-games 384'):
        curve.start_curve(tmp_path, [384, 768], **kw)
    with pytest.raises(SystemExit, match='not one of'):
        curve.start_curve(tmp_path, [96, 768], reward_games=384, **kw)
    with pytest.raises(SystemExit, match='multiple of 4'):
        curve.start_curve(tmp_path, [96, 770], **kw)
