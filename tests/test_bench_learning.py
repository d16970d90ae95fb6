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
