"""RewardCalculator with GRP weights set so that the rank matrix is known by hand."""

import numpy as np
import pytest
import torch

from mortal.config_schema import GrpNetwork
from mortal.data.grp import Grp
from mortal.model.networks import GRP
from mortal.data.reward import RewardCalculator, load_grp

from conftest import DATA_DIR

PTS = [6.0, 4.0, 2.0, 0.0]


def _fixed_grp(bias):
    grp = GRP()
    with torch.no_grad():
        grp.fc[-1].weight.zero_()
        grp.fc[-1].bias.copy_(torch.as_tensor(bias, dtype=torch.float64))
    return grp


@pytest.fixture(scope="module")
def game():
    return Grp.load_log((DATA_DIR / "riichienv_selfplay_hanchan.jsonl").read_text())


def test_uniform_grp_gives_zero_until_the_final_rank(game):
    calc = RewardCalculator(_fixed_grp(torch.zeros(24)), PTS)
    # Uniform over the 24 orders -> every seat 1/4 per rank -> E[pt] = 3 before each kyoku.
    # Seat 3 finished first (rank 0): last kyoku reward 6 - 3; seat 0 last: 0 - 3.
    r3 = calc.calc_delta_pt(3, game.feature, game.rank_by_player)
    r0 = calc.calc_delta_pt(0, game.feature, game.rank_by_player)
    assert r3.dtype == np.float64 and r3.shape == (12,)
    np.testing.assert_allclose(r3, [0] * 11 + [3.0], atol=1e-12)
    np.testing.assert_allclose(r0, [0] * 11 + [-3.0], atol=1e-12)


def test_confident_grp(game):
    # Permutation 0 of itertools.permutations is (0, 1, 2, 3): seat p at rank p.
    bias = torch.full((24,), -50.0)
    bias[0] = 50.0
    calc = RewardCalculator(_fixed_grp(bias), PTS)
    matrix = calc.calc_grp(game.feature)
    assert matrix.shape == (12, 4, 4)
    np.testing.assert_allclose(matrix[0].numpy(), np.eye(4), atol=1e-12)
    # Seat 2 is predicted 3rd (2 pts) throughout and finished 2nd (4 pts): +2 in the last kyoku.
    np.testing.assert_allclose(calc.calc_delta_pt(2, game.feature, game.rank_by_player),
                               [0] * 11 + [2.0], atol=1e-12)
    # uniform_init: first prediction 3 pts instead of 2 -> first kyoku reward 2 - 3.
    calc_u = RewardCalculator(_fixed_grp(bias), PTS, uniform_init=True)
    np.testing.assert_allclose(calc_u.calc_delta_pt(2, game.feature, game.rank_by_player),
                               [-1.0] + [0] * 10 + [2.0], atol=1e-12)


def test_rewards_sum_to_final_minus_first_prediction(game):
    torch.manual_seed(0)
    calc = RewardCalculator(GRP(), PTS)
    for seat in range(4):
        r = calc.calc_delta_pt(seat, game.feature, game.rank_by_player)
        first = float(calc.calc_grp(game.feature[:1])[0, seat] @ torch.tensor(PTS, dtype=torch.float64))
        assert r.sum() == pytest.approx(PTS[game.rank_by_player[seat]] - first)


def test_delta_points(game):
    calc = RewardCalculator(_fixed_grp(torch.zeros(24)), PTS)
    d = calc.calc_delta_points(0, game.feature, game.final_scores)
    assert d[-1] == 2400 - 10700 and d[0] == 21000 - 25000


def test_load_grp_from_checkpoint(tmp_path, game):
    torch.manual_seed(1)
    grp = GRP()
    torch.save({"model": grp.state_dict(), "optimizer": {}, "steps": 3, "timestamp": 0.0}, tmp_path / "grp.pth")
    loaded = load_grp(tmp_path / "grp.pth", GrpNetwork(hidden_size=64, num_layers=2))
    a = RewardCalculator(grp, PTS).calc_delta_pt(1, game.feature, game.rank_by_player)
    b = RewardCalculator(loaded, PTS).calc_delta_pt(1, game.feature, game.rank_by_player)
    np.testing.assert_array_equal(a, b)


def test_bad_arguments():
    with pytest.raises(ValueError):
        RewardCalculator(None, PTS)
    with pytest.raises(ValueError):
        RewardCalculator(GRP(), [1, 2, 3])


def test_points_reward_on_a_known_kyoku(game):
    # [env] reward = 'points': the score change x (max(pts) - min(pts)) / 30000 = 6 / 30000 = 2e-4 pt a point.
    calc = RewardCalculator(None, PTS, reward="points")  # no GRP needed
    assert calc.points_scale == pytest.approx(2e-4)
    r0 = calc.kyoku_rewards(0, game.feature, game.rank_by_player, game.final_scores)
    assert r0.dtype == np.float64 and r0.shape == (12,)
    # seat 0: E1 25000 -> 21000 (-4000 points = -0.8 pt); last kyoku 10700 -> final 2400 (-8300 = -1.66 pt)
    assert r0[0] == pytest.approx(-0.8) and r0[-1] == pytest.approx(-1.66)
    # the rewards sum to (final score - 25000) x scale: 2400 - 25000 = -22600 -> -4.52 pt
    assert r0.sum() == pytest.approx(-4.52)
    # Mortal's pts [3, 1, -1, -3] span the same 6 pt: the same scale
    mortal = RewardCalculator(None, [3, 1, -1, -3], reward="points")
    np.testing.assert_allclose(mortal.calc_points_reward(0, game.feature, game.final_scores), r0)


def test_kyoku_rewards_dispatch_and_reward_errors(game):
    grp = _fixed_grp(torch.zeros(24))
    calc = RewardCalculator(grp, PTS)  # default 'grp', Mortal's
    np.testing.assert_array_equal(calc.kyoku_rewards(3, game.feature, game.rank_by_player, game.final_scores),
                                  calc.calc_delta_pt(3, game.feature, game.rank_by_player))
    with pytest.raises(ValueError, match="needs a GRP"):
        RewardCalculator(None, PTS, reward="grp")
    with pytest.raises(ValueError, match="reward must be one of"):
        RewardCalculator(grp, PTS, reward="score")
