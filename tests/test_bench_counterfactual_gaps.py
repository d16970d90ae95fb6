"""bench/counterfactual_gaps.py: the paired values of the branches in self-play logs, by decision kind."""

import gzip
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import counterfactual_gaps as cg  # noqa: E402
from test_counterfactual import _first_discard_of_kyoku, _with_counterfactuals  # noqa: E402

from mortal.data.gameplay import GameplayLoader  # noqa: E402


def test_action_kind_follows_mortals_action_index():
    from mortal.features.action import action_kind
    assert [action_kind(i) for i in (0, 33, 36, 37, 38, 40, 41, 42, 43, 44, 45)] == [
        "discard", "discard", "discard", "riichi", "chi", "chi", "pon", "kan", "hora", "ryukyoku", "pass"]
    with pytest.raises(ValueError, match="0-45"):
        action_kind(46)


def test_summary_by_hand():
    res = cg.summary({"pon -> pass": [1.0, 2.0, 3.0], "discard -> discard": [-0.5]})
    r = res["pon -> pass"]
    # mean 2, sd 1, t(0.975, 2) = 4.302653: 4.302653 / sqrt(3) = 2.484138
    assert (r["n"], r["mean"], r["positive"]) == (3, 2.0, 1.0)
    assert r["ci"] == pytest.approx(2.484138, abs=1e-6)
    assert res["discard -> discard"] == {"n": 1, "mean": -0.5, "ci": 0.0, "positive": 0.0}
    assert list(res) == ["pon -> pass", "discard -> discard"]  # most branches first


def test_gaps_of_a_log_with_points_reward(tmp_path):
    from test_counterfactual import RIICHIENV
    from mortal.features.action import action_kind
    plain = GameplayLoader(3, player_names=["0"]).load_log(RIICHIENV.read_text())[0]
    a = _first_discard_of_kyoku(plain, 0)
    text, _, written = _with_counterfactuals({a: ("other", {"next": [1, 0, 0, 30000, 20000, 25000, 25000]})})
    path = tmp_path / "x.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(text)
    import toml
    config = toml.load(ROOT / "config.example.toml")
    config["env"].update(reward="points", pts=[6.0, 4.0, 2.0, 0.0])
    config["control"]["version"] = 3
    out = cg.gaps(config, [path])
    kind = f"discard -> {action_kind(written[a])}"
    # seat 0 after E1: 21000 real, 30000 in the branch: +9000 x 6 / 30000 = +1.8 pt (as the loader's test)
    assert out == {kind: [pytest.approx(1.8)]}
