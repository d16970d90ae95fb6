"""bench/selfplay_rows.py: the quickstart's client round in fresh processes, one tree against another."""

import re
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_this_tree_against_itself_plays_the_same_rows():
    # the same tree, weights and deals on both sides: the games, hence the rows, are identical
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "selfplay_rows.py"), "--against", str(ROOT),
                          "--pairs", "1", "--seeds", "1", "--old-seeds", "1"],
                         check=True, capture_output=True, text=True, timeout=300).stdout
    runs = re.findall(r"pair 1 (old|new): (\d+) games, (\d+) rows in [\d.]+ s = (\d+) rows/s", out)
    assert [r[0] for r in runs] == ["old", "new"]
    assert [int(r[1]) for r in runs] == [4, 4]
    assert runs[0][2] == runs[1][2] and int(runs[0][2]) > 4 * 100  # a hanchan asks far more than 100 decisions
    assert re.search(r"new/old rows/s: median \d+\.\d\d \(pairs", out)


def test_the_embedded_round_is_a_quarter_of_train_games():
    sys.path.insert(0, str(ROOT / "bench"))
    import selfplay_rows
    from mortal.tools.quickstart_config import PRESETS
    assert selfplay_rows.embedded_seeds() * 4 == PRESETS["full"]["train_games"] == 64
