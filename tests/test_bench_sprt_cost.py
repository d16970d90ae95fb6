"""bench/sprt_cost.py: the Wilson interval by hand and the resampled SPRT against the fixed rule."""

import json

import pytest

from conftest import load_script
from mortal.learning.gate import Sprt


def _module():
    return load_script('bench/sprt_cost.py', 'sprt_cost')


def test_wilson_by_hand():
    lo, hi = _module().wilson(5, 10)
    # p = 0.5, n = 10: centre 0.5, half-width 1.96 * sqrt(0.025 + 0.0096) / 1.384 = 0.2634
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)


def test_simulate_counts_decisions_and_games():
    mod = _module()
    # two kinds of deals, +0.25 and -0.25 around the mean; planted -0.5 makes every deal a gain of 0.25-0.75
    r = mod.simulate([0.25, -0.25] * 50, -0.5, runs=20, max_deals=100, chunk_deals=10, sprt=Sprt(0.05),
                     confidence=0.95, seed=0)
    assert r['sprt_better'] == 20 and r['fixed_better'] == 20
    assert set(r['sprt_deals']) == {10}  # decided at the first look
    same = mod.simulate([0.25, -0.25] * 50, 0.0, runs=20, max_deals=100, chunk_deals=10, sprt=Sprt(0.05),
                        confidence=0.95, seed=0)
    assert same['sprt_better'] <= 2 and all(10 <= n <= 100 for n in same['sprt_deals'])


def test_main_reads_a_learning_result(tmp_path, capsys):
    mod = _module()
    result = tmp_path / 'result.json'
    units = {str(10000 + i): [1, 2, 3, 4] if i % 2 else [2, 2, 3, 3] for i in range(40)}
    result.write_text(json.dumps({'units': {'final': units}}))
    assert mod.main(['--units', str(result), '--runs', '10', '--plant', '-0.05']) == 0
    out = capsys.readouterr().out
    assert 'per-deal paired differences: 40 deals, mean +0.000' in out and '| -0.050 |' in out
    with pytest.raises(SystemExit):
        mod.main(['--units', str(result), '--label', 'best'])


def test_against_pairs_two_models_deal_by_deal_and_stops_at_either_verdict(tmp_path, capsys):
    mod = _module()
    result = tmp_path / 'result.json'
    final = {str(10000 + i): [1, 2, 3, 4] if i % 2 else [2, 2, 3, 3] for i in range(40)}
    best = {str(10000 + i): [1, 1, 3, 4] for i in range(40)}  # 2.25 on every deal
    result.write_text(json.dumps({'units': {'final': final, 'best': best}}))
    assert mod.main(['--units', str(result), '--against', 'best', '--runs', '10', '--plant', '-0.5']) == 0
    out = capsys.readouterr().out
    # every deal: 2.5 - 2.25 = +0.25, sd 0
    assert 'per-deal paired differences: 40 deals, mean +0.250 ± 0.000, sd 0.000' in out
    # a planted -0.5 is decided better at the first look (16 deals): without a record to finish, the trainer
    # plays 16 of the 750 deals, 0.02 of the fixed test play (with a record it would be 1.00)
    assert out.rstrip().endswith('| 0.02 |')
    r = mod.simulate([0.25] * 40, -0.5, runs=5, max_deals=100, chunk_deals=10, sprt=Sprt(0.05), confidence=0.95,
                     seed=0, record=False)
    assert r['trainer_deals'] == [10] * 5
    with pytest.raises(SystemExit):
        mod.main(['--units', str(result), '--against', 'start'])
