"""mortal/learning/gate.py: paired differences, CIs, the SPRT and the test-play verdict, with values computed by
hand."""

import math
import random

import pytest

from mortal.learning import gate


def test_z_value_and_mean_ci_by_hand():
    assert gate.z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert gate.z_value(0.90) == pytest.approx(1.644854, abs=1e-6)
    # values 1, 2, 3, 6: mean 3, sample variance (4 + 1 + 0 + 9) / 3 = 14/3, sd/sqrt(4) = 1.0801
    mean, ci = gate.mean_and_ci([1, 2, 3, 6], 0.95)
    assert mean == 3 and ci == pytest.approx(1.959964 * math.sqrt(14 / 3 / 4), rel=1e-6)
    assert math.isnan(gate.mean_and_ci([1.0])[1]) and math.isnan(gate.mean_and_ci([])[0])
    with pytest.raises(ValueError):
        gate.z_value(1.0)


def test_paired_differences_by_deal_and_against_a_constant():
    units = {10000: [1, 2, 3, 4], 10001: [1, 1, 2, 2], 10002: [4, 4, 4, 4]}
    record = {10000: [2, 2, 3, 3], 10001: [3, 3, 3, 3], 10002: [1, 2, 3, 4]}
    # per deal: 2.5 - 2.5, 1.5 - 3, 4 - 2.5
    assert gate.paired_differences(units, record) == [0.0, -1.5, 1.5]
    assert gate.paired_differences(units, 2.5) == [0.0, -1.0, 1.5]
    # a record of fewer deals pairs on the common ones
    assert gate.paired_differences(units, {10001: [2, 2, 2, 2]}) == [-0.5]
    # no deal in common: the record's mean rank (2.0) stands for every deal
    assert gate.paired_differences({10005: [3, 3, 3, 3]}, {10001: [2, 2, 2, 2]}) == [1.0]


def test_reference_of_records():
    assert gate.reference_of({'avg_rank': 4.0, 'avg_pt': -135.0}) == 2.5  # fresh: the baseline itself
    assert gate.reference_of({'avg_rank': 2.3, 'avg_pt': 9.0}) == 2.3  # Mortal's record, no deals
    assert gate.reference_of({'avg_rank': 2.3, 'avg_pt': 9.0, 'deals': {7: [1, 2]}}) == {7: [1, 2]}


def test_sprt_llr_and_bounds_by_hand():
    s = gate.Sprt(delta=0.05, alpha=0.05, beta=0.05, min_deals=2)
    assert s.upper == pytest.approx(math.log(19)) and s.lower == pytest.approx(-math.log(19))
    # improvements 0.25, 0.5, 0, 0.25: sum 1.0, variance 0.125 / 3; LLR = 0.05 / (0.125/3) * (1.0 - 4 * 0.025)
    diffs = [-0.25, -0.5, 0.0, -0.25]
    assert s.llr(diffs) == pytest.approx(1.2 * 0.9)
    assert s.verdict(diffs) is None  # 1.08 is within (-2.94, 2.94)
    assert s.llr([0.5]) == 0.0
    # identical players: every difference 0, the variance floor makes H0 certain at once
    assert s.verdict([0.0] * 8) == 'not better'
    with pytest.raises(ValueError):
        gate.Sprt(delta=0)
    with pytest.raises(ValueError):
        gate.Sprt(alpha=0.5)


def _planted(shift, n, seed):
    """Per-deal paired differences: a realistic spread (sd about 0.55 avg rank, the measured one of a 4-game
    deal of two near-equal models) around ``shift``."""
    rng = random.Random(seed)
    return [shift + rng.gauss(0, 0.55) for _ in range(n)]


def _run(sprt, diffs):
    for k in range(8, len(diffs) + 1, 8):
        v = sprt.verdict(diffs[:k])
        if v is not None:
            return v, k
    return 'undecided', len(diffs)


def test_sprt_accepts_and_rejects_planted_differences():
    s = gate.Sprt(delta=0.05)
    better = [_run(s, _planted(-0.10, 5000, seed)) for seed in range(20)]
    worse = [_run(s, _planted(+0.10, 5000, seed)) for seed in range(20)]
    equal = [_run(s, _planted(0.0, 5000, seed)) for seed in range(40)]
    assert all(v == 'better' for v, _ in better)
    assert all(v == 'not better' for v, _ in worse)
    # alpha = 0.05: an equal model is called better in about 1 run of 20; at most 5 of 40 here (seeded)
    assert sum(v == 'better' for v, _ in equal) <= 5
    # a clearly worse model is rejected much sooner than a full 750-deal (3,000-game) test play
    assert max(k for _, k in worse) < 750


def _player(table):
    """play(first, count) giving ``table[nonce]`` for each deal, recording the calls."""
    calls = []

    def play(first, count):
        calls.append((first, count))
        return {n: list(table[n]) for n in range(first, first + count)}
    return play, calls


def test_run_test_play_paired_rule():
    record = {n: [1, 2, 3, 4] for n in range(100, 108)}  # 2.5 on each deal
    play, calls = _player({n: [1, 1, 2, 3] if n % 2 else [1, 2, 2, 3] for n in range(100, 108)})
    v = gate.run_test_play(play, nonce_start=100, deals=8, reference=record, rule='paired')
    # per deal: 1.75 - 2.5 = -0.75 (odd) and 2.0 - 2.5 = -0.5 (even): mean -0.625, sd 0.1336
    assert calls == [(100, 8)] and v.games == 32
    assert v.diff == pytest.approx(-0.625)
    assert v.ci == pytest.approx(1.959964 * math.sqrt((8 * 0.125 ** 2) / 7 / 8), rel=1e-5)
    assert v.better and not v.worse and v.sprt is None
    assert 'paired diff to best.pth -0.625' in v.describe() and v.describe().endswith(': better')
    constant = gate.run_test_play(play, nonce_start=100, deals=8, reference=2.5, rule='paired')
    assert constant.against == 'avg rank 2.500' and constant.diff == pytest.approx(-0.625)
    # the same results against themselves are not better
    same = gate.run_test_play(play, nonce_start=100, deals=8, reference=v.units, rule='paired')
    assert same.diff == 0 and not same.better and not same.worse


def test_run_test_play_sprt_stops_early_when_worse_and_finishes_the_record_when_better():
    record = {n: [1, 2, 3, 4] for n in range(0, 64)}
    worse_play, calls = _player({n: [4, 4, 3, 4] if n % 3 else [2, 3, 4, 4] for n in range(64)})
    v = gate.run_test_play(worse_play, nonce_start=0, deals=64, reference=record, rule='sprt',
                           sprt=gate.Sprt(0.05), chunk_deals=8)
    assert calls == [(0, 8)]  # decided after the first look (8 deals = 32 games)
    assert v.sprt == 'not better' and v.decided_games == 32 and v.games == 32 and not v.better
    # stopped early: "worse" is the mirrored SPRT's verdict (H1 worse by 0.05), clearly reached here
    assert v.worse and gate.Sprt(0.05).llr([-d for d in gate.paired_differences(v.units, record)]) > math.log(19)
    # a mildly worse challenger (+0.5 / -0.25 a deal) stopped after 64 of 128 deals: its CI (+0.125 ± 0.093)
    # would call it worse, the mirrored SPRT (LLR 2.24 < log 19) does not
    long_record = {n: [1, 2, 3, 4] for n in range(128)}
    mild, _ = _player({n: [3, 3, 3, 3] if n % 2 else [2, 2, 2, 3] for n in range(128)})
    m = gate.run_test_play(mild, nonce_start=0, deals=128, reference=long_record, rule='sprt',
                           sprt=gate.Sprt(0.05), chunk_deals=8)
    assert m.games == 256 and m.sprt == 'not better' and m.diff - m.ci > 0 and not m.worse
    better_play, calls = _player({n: [1, 1, 2, 2] if n % 3 else [1, 2, 3, 3] for n in range(64)})
    v = gate.run_test_play(better_play, nonce_start=0, deals=64, reference=record, rule='sprt',
                           sprt=gate.Sprt(0.05), chunk_deals=8)
    # by hand: after 8 deals (3 gains of 0.25, 5 of 1.0) LLR = 0.05 / 0.1507 * (5.75 - 0.2) = 1.84, undecided;
    # after 16 (6 and 10) LLR = 0.05 / 0.1406 * (11.5 - 0.4) = 3.95 >= log(19) = 2.94: better at 64 games
    assert v.sprt == 'better' and v.better and v.decided_games == 64 and v.llr == pytest.approx(3.9467, abs=1e-3)
    assert calls == [(n, 8) for n in range(0, 64, 8)] and v.games == 256  # the whole record


def test_run_test_play_mortal_rule():
    play, _ = _player({0: [1, 2, 3, 4]})
    seen = []
    v = gate.run_test_play(play, nonce_start=0, deals=1, reference=2.5, rule='mortal',
                           mortal_better=lambda units: seen.append(units) or True)
    assert v.better and seen == [{0: [1, 2, 3, 4]}]


def test_run_test_play_sprt_against_a_replayed_reference_stops_at_either_verdict():
    # fresh deals: best.pth is replayed chunk by chunk; "better" ends the test play too (no record to complete)
    better_play, calls = _player({n: [1, 1, 2, 2] if n % 3 else [1, 2, 3, 3] for n in range(64)})
    replay, replayed = _player({n: [1, 2, 3, 4] for n in range(64)})
    v = gate.run_test_play(better_play, nonce_start=0, deals=64, reference=replay, rule='sprt',
                           sprt=gate.Sprt(0.05), chunk_deals=8)
    # the same gains as against the fixed record above: better after 16 deals (LLR 3.95)
    assert v.sprt == 'better' and v.better and v.decided_games == 64 and v.games == 64
    assert calls == replayed == [(0, 8), (8, 8)] and v.against == 'best.pth replayed'
    assert v.llr == pytest.approx(3.9467, abs=1e-3) and not v.worse
