"""MortalEngine: greedy/Boltzmann/top-p selection checked against analytic distributions.

Stand-in modules put the q-values in the observation itself (brain = flatten,
dqn = first 46 features, illegal -> -inf), so each row of a batch can carry
its own fixed q-values.
"""

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from mortal.play.engine import MortalEngine, sample_top_p

A = 46
# Chi-square critical values at p = 0.001 by degrees of freedom (scipy.stats.chi2.ppf(0.999, dof)).
CHI2_CRIT_0001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}


class FlattenBrain(nn.Module):
    def forward(self, obs, invisible_obs=None):
        return obs.flatten(1)


class QFromPhi(nn.Module):
    def forward(self, phi, mask):
        return phi[:, :A].masked_fill(~mask, -torch.inf)


def make_engine(**kw):
    kw.setdefault("version", 3)
    return MortalEngine(FlattenBrain(), QFromPhi(), **kw)


def batch(q, mask, n):
    """n copies of one row: obs (2, 34) float32 carrying q in its first 46 entries."""
    obs = np.zeros((2, 34), np.float32)
    obs.reshape(-1)[:A] = q
    return [obs] * n, [np.asarray(mask, bool)] * n


def row(values):
    """q (46,) and mask (46,) with the given {index: q} legal, everything else illegal."""
    q = np.full(A, -7.0, np.float32)  # illegal q is overwritten by the mask anyway
    mask = np.zeros(A, bool)
    for i, v in values.items():
        q[i], mask[i] = v, True
    return q, mask


def chi_square(counts, probs, n):
    """Pearson statistic over the categories with expected count > 0, and its dof."""
    support = probs > 0
    expected = probs[support] * n
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    return stat, int(support.sum()) - 1


def softmax(x):
    z = np.exp(np.asarray(x, np.float64) - np.max(x))
    return z / z.sum()


def test_greedy_when_epsilon_zero():
    rng = np.random.default_rng(0)
    n = 300
    q = rng.normal(size=(n, A)).astype(np.float32)
    masks = rng.random((n, A)) < 0.3
    masks[np.arange(n), rng.integers(0, A, n)] = True
    obs = [np.concatenate([qi, np.zeros(68 - A, np.float32)]).reshape(2, 34) for qi in q]
    engine = make_engine(seed=1)
    actions, q_values, masks_out, is_greedy = engine.react_batch(obs, list(masks))
    assert actions == [int(np.argmax(np.where(m, qi, -np.inf))) for qi, m in zip(q, masks)]
    assert is_greedy == [True] * n and masks_out == masks.tolist()
    assert all(type(a) is int for a in actions) and type(q_values[0][0]) is float
    qv = np.array(q_values)
    assert np.all(qv[~masks] == -np.inf)
    np.testing.assert_array_equal(qv[masks], q[masks])


def test_boltzmann_matches_softmax():
    # eps = 1: every sample explores; plain sampling (top_p = 1) at temp 0.5.
    legal = {3: 1.0, 9: 0.8, 17: 0.5, 34: 0.3, 41: 0.0, 45: -0.5}
    q, mask = row(legal)
    n = 40000
    engine = make_engine(boltzmann_epsilon=1, boltzmann_temp=0.5, top_p=1, seed=7)
    actions, _, _, is_greedy = engine.react_batch(*batch(q, mask, n))
    assert not any(is_greedy)
    counts = np.bincount(actions, minlength=A)
    expected = np.zeros(A)
    expected[list(legal)] = softmax(np.array(list(legal.values())) / 0.5)
    assert counts[~mask].sum() == 0
    stat, dof = chi_square(counts, expected, n)
    assert dof == 5 and stat < CHI2_CRIT_0001[dof], (stat, counts[mask], expected[mask] * n)


def test_top_p_excludes_tail():
    # Probabilities 0.45, 0.25, 0.15, 0.10, 0.05 (q = log p, temp 1). With top_p = 0.75
    # the mass before each action is 0, .45, .70, .85, .95: the first three stay
    # (<= 0.75) and are renormalised to 0.45/.85, 0.25/.85, 0.15/.85.
    p = [0.45, 0.25, 0.15, 0.10, 0.05]
    idx = [0, 38, 41, 43, 45]
    q, mask = row({i: math.log(v) for i, v in zip(idx, p)})
    n = 30000
    engine = make_engine(boltzmann_epsilon=1, boltzmann_temp=1, top_p=0.75, seed=3)
    actions, *_ = engine.react_batch(*batch(q, mask, n))
    counts = np.bincount(actions, minlength=A)
    assert counts[43] == 0 and counts[45] == 0 and counts[~mask].sum() == 0
    expected = np.zeros(A)
    expected[[0, 38, 41]] = np.array([0.45, 0.25, 0.15]) / 0.85
    stat, dof = chi_square(counts, expected, n)
    assert dof == 2 and stat < CHI2_CRIT_0001[dof], (stat, counts[[0, 38, 41]])


def test_epsilon_mixture():
    # eps = 0.3: P(a) = 0.7 [a = argmax] + 0.3 softmax(q / 2)_a.
    legal = {5: 2.0, 6: 1.0, 30: 0.0, 37: -1.0}
    q, mask = row(legal)
    n = 40000
    engine = make_engine(boltzmann_epsilon=0.3, boltzmann_temp=2, seed=11)
    actions, _, _, is_greedy = engine.react_batch(*batch(q, mask, n))
    actions, is_greedy = np.array(actions), np.array(is_greedy)
    assert np.all(actions[is_greedy] == 5)
    k = int(is_greedy.sum())
    sigma = math.sqrt(n * 0.3 * 0.7)
    assert abs(k - 0.7 * n) < 4.5 * sigma, k
    expected = np.zeros(A)
    expected[list(legal)] = 0.3 * softmax(np.array(list(legal.values())) / 2)
    expected[5] += 0.7
    counts = np.bincount(actions, minlength=A)
    stat, dof = chi_square(counts, expected, n)
    assert dof == 3 and stat < CHI2_CRIT_0001[dof], (stat, counts[mask], expected[mask] * n)


def test_tiny_temperature_is_greedy_like():
    q, mask = row({2: 0.50, 7: 0.49, 44: 0.3})
    engine = make_engine(boltzmann_epsilon=1, boltzmann_temp=1e-4, seed=5)
    actions, _, _, is_greedy = engine.react_batch(*batch(q, mask, 2000))
    assert set(actions) == {2} and not any(is_greedy)


def test_explore_respects_per_row_masks():
    rng = np.random.default_rng(4)
    n = 2000
    masks = rng.random((n, A)) < 0.2
    masks[:, 45] |= ~masks.any(axis=1)
    obs = [np.zeros((2, 34), np.float32)] * n  # all q = 0: uniform over legal actions
    for top_p in (1, 0.5):
        engine = make_engine(boltzmann_epsilon=1, top_p=top_p, seed=9)
        actions, q_values, _, _ = engine.react_batch(obs, list(masks))
        assert all(masks[i, a] for i, a in enumerate(actions))
        assert np.all(np.isneginf(np.array(q_values)[~masks]))


def test_sample_top_p_edges():
    logits = torch.tensor([[0.0, 3.0, -torch.inf, 1.0]])
    assert sample_top_p(logits, 0).tolist() == [1]  # p <= 0: argmax
    g = torch.Generator().manual_seed(0)
    draws = sample_top_p(logits.expand(500, 4), 1e-6, g)
    assert set(draws.tolist()) == {1}  # tiny p: only the most likely action


def test_seed_reproducible():
    q, mask = row({i: 0.1 * i for i in range(0, 30, 3)})
    obs, masks = batch(q, mask, 200)
    runs = [make_engine(boltzmann_epsilon=0.5, seed=s).react_batch(obs, masks) for s in (1, 1, 2)]
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[2][0]


class LatentBrain(nn.Module):
    """Version 1 shape: returns (mu, logsig)."""

    def forward(self, obs, invisible_obs=None):
        mu = obs.flatten(1)
        return mu, torch.full_like(mu, 2.0)


def test_version1_latent():
    q, mask = row({1: 1.0, 2: 0.9, 3: 0.8})
    obs, masks = batch(q, mask, 400)
    det = MortalEngine(LatentBrain(), QFromPhi(), version=1)
    assert set(det.react_batch(obs, masks)[0]) == {1}  # mu is used
    sto = MortalEngine(LatentBrain(), QFromPhi(), version=1, stochastic_latent=True, seed=0)
    actions = sto.react_batch(obs, masks)[0]
    assert set(actions) == {1, 2, 3}  # exp(2)-scale noise reorders the q-values


def test_oracle_obs_reaches_brain():
    class OracleBrain(nn.Module):
        def forward(self, obs, invisible_obs=None):
            assert invisible_obs is not None
            return (obs + invisible_obs).flatten(1)

    q, mask = row({4: 0.0, 8: 0.0})
    obs, masks = batch(q, mask, 3)
    hidden = np.zeros((2, 34), np.float32)
    hidden[0, 8] = 1.0
    engine = MortalEngine(OracleBrain(), QFromPhi(), version=1, is_oracle=True)
    assert engine.react_batch(obs, masks, [hidden] * 3)[0] == [8, 8, 8]


def test_attributes_and_errors():
    engine = make_engine(name="trainee", enable_quick_eval=False)
    assert (engine.engine_type, engine.name, engine.version, engine.is_oracle) == (
        "mortal", "trainee", 3, False)
    assert engine.enable_quick_eval is False and engine.enable_rule_based_agari_guard is False
    assert engine.react_batch([], []) == ([], [], [], [])
    q, mask = row({0: 1.0})
    obs, masks = batch(q, mask, 2)
    with pytest.raises(ValueError, match="2 observations but 1 masks"):
        engine.react_batch(obs, masks[:1])
    with pytest.raises(ValueError, match="sample 1 has no legal action"):
        engine.react_batch(obs, [mask, np.zeros(A, bool)])


class LinearQ(nn.Module):
    def __init__(self, c):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(c * 34, A)

    def forward(self, phi, mask):
        return self.fc(phi).masked_fill(~mask, -torch.inf)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
def test_real_observations_and_amp(fixture_logs, device):
    """obs/masks from PlayerState.encode_obs(3) on a real log; with and without AMP."""
    from mjai.mlibriichi.state import PlayerState

    state = PlayerState(0)
    obs, masks = [], []
    for line in fixture_logs[0].read_text().splitlines():
        if state.update(line).can_act:
            o, m = state.encode_obs(3, False)
            obs.append(o)
            masks.append(m)
    assert len(obs) > 100 and obs[0].shape == (934, 34)
    for amp in (False, True):
        engine = MortalEngine(FlattenBrain(), LinearQ(934), version=3, enable_amp=amp,
                              device=device, boltzmann_epsilon=0.2, boltzmann_temp=0.5,
                              top_p=0.9, seed=0)
        actions, q_values, masks_out, _ = engine.react_batch(obs, masks)
        assert all(m[a] for a, m in zip(actions, masks))
        assert all(math.isfinite(v) == bool(b)
                   for qs, ms in zip(q_values, masks_out) for v, b in zip(qs, ms))
        json.dumps([q for qs in q_values for q in qs if math.isfinite(q)])  # log-ready floats


def test_with_project_model():
    model = pytest.importorskip("mortal.model.networks")
    brain = model.Brain(conv_channels=16, num_blocks=1, version=3)
    dqn = model.DQN(version=3)
    rng = np.random.default_rng(0)
    obs = [rng.random((934, 34), dtype=np.float32) for _ in range(5)]
    masks = [rng.random(A) < 0.5 for _ in range(5)]
    for m in masks:
        m[0] = True
    engine = MortalEngine(brain, dqn, version=3, boltzmann_epsilon=0.5, seed=0)
    actions, q_values, _, _ = engine.react_batch(obs, masks)
    assert all(m[a] for a, m in zip(actions, masks))
    assert not brain.training and not dqn.training
