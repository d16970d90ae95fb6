"""The frozen CPU inference copy (mortal.model.inference) against the modules' own forward.

Tolerance asserted everywhere: the same -inf pattern, and on the legal entries
|q_frozen - q_ref| <= 1e-5 + 1e-5 |q_ref| (float32 sums in another order; measured about 3e-8 on these models,
docs/performance_forward.md). Greedy actions must be identical.
"""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from mortal.model import inference
from mortal.model.inference import FrozenQ
from mortal.model.networks import DQN, Brain
from mortal.play.engine import MortalEngine

from conftest import DATA_DIR, load_script

ATOL = RTOL = 1e-5
LOG = DATA_DIR / "riichienv_selfplay_hanchan.jsonl"
_FORWARD_BENCH = load_script("bench/forward.py", "forward_bench")


def real_observations(version, seats=range(4)):
    """Every decision of a public hanchan for ``seats``, encoded at ``version``: (obs list, mask list), by the
    bench's own encoder loop (``bench/forward.py``)."""
    return _FORWARD_BENCH.real_observations(version, logs=[LOG], seats=seats)


_OBS = {}


def observations(version):
    if version not in _OBS:  # encoded once per version for the whole file
        _OBS[version] = real_observations(version, seats=(0, 1) if version != 4 else (0,))
    return _OBS[version]


def model(version, channels=32, blocks=2, seed=0):
    """A Brain + DQN in eval mode with BatchNorm statistics and affine weights far from their defaults (a folded
    default BN is the identity and would prove nothing)."""
    torch.manual_seed(seed)
    brain, dqn = Brain(conv_channels=channels, num_blocks=blocks, version=version), DQN(version=version)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in brain.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 2 + 0.2)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
        if version in (2, 3):  # q-values of order 1, not 0.1: the relative tolerance is exercised too
            dqn.a_head[2].weight.mul_(10.0)
    return brain.eval(), dqn.eval()


def reference_q(brain, dqn, obs, masks):
    with torch.inference_mode():
        out = brain(torch.from_numpy(np.stack(obs)))
        return dqn(out[0] if isinstance(out, tuple) else out, torch.from_numpy(np.stack(masks)))


def assert_q_close(q, ref):
    q, ref = torch.as_tensor(q), torch.as_tensor(ref)
    assert torch.equal(torch.isfinite(q), torch.isfinite(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(q[fin], ref[fin], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
@pytest.mark.parametrize("sparse", [True, False])
def test_frozen_q_equals_reference_on_real_observations(version, sparse):
    obs, masks = observations(version)
    assert len(obs) > 100
    brain, dqn = model(version)
    before = {k: v.clone() for k, v in brain.state_dict().items()}
    ref = reference_q(brain, dqn, obs, masks)
    frozen = FrozenQ(brain, dqn, sparse_stem=sparse)
    mask_t = torch.from_numpy(np.stack(masks))
    with torch.inference_mode():
        q = frozen.q_values(obs, mask_t)
        # below 32 rows the small convolutions run as matrix products: batches of 12, as the quickstart's
        q_small = torch.cat([frozen.q_values(obs[i:i + 12], mask_t[i:i + 12]) for i in range(0, len(obs), 12)])
    for got in (q, q_small):
        assert_q_close(got, ref)
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
    # the training modules are untouched
    assert all(torch.equal(before[k], v) for k, v in brain.state_dict().items())
    assert not brain.training


def test_sparse_stem_is_built():
    """scripts/setup.sh builds it (setup.py); without it CPU self-play runs the dense first convolution."""
    assert inference.HAVE_SPARSE_STEM, "mortal.model._stem is not built: run bash scripts/setup.sh"


def test_sparse_stem_kernel_matches_conv1d():
    """The compiled first convolution against F.conv1d: real-valued and negative inputs, all-zero samples, both
    edge columns, an output width that is not a multiple of 8 (the scalar path), an (N, C, 34) array input."""
    stem = pytest.importorskip("mortal.model._stem")
    rng = np.random.default_rng(0)
    for n_in, n_out in ((934, 32), (40, 24), (17, 5)):
        x = (rng.random((6, n_in, 34)) < 0.1).astype(np.float32)
        x[1] = 0.0
        x[2, :3] = rng.normal(size=(3, 34))  # real-valued rows
        x[3, :, 0] = 1.0
        x[3, :, 33] = -2.5
        w = torch.randn(n_out, n_in, 3)
        ref = F.conv1d(torch.from_numpy(x), w, padding=1)
        out = np.empty((6, n_out, 34), np.float32)
        stem.sparse_stem(list(x), w.permute(1, 2, 0).contiguous().numpy(), out, n_in, n_out)
        torch.testing.assert_close(torch.from_numpy(out), ref, atol=1e-4, rtol=1e-5)
        assert np.all(out[1] == 0.0)


def test_sparse_stem_kernel_rejects_bad_buffers():
    stem = pytest.importorskip("mortal.model._stem")
    w = np.zeros((10, 3, 8), np.float32)
    out = np.zeros((1, 8, 34), np.float32)
    with pytest.raises(ValueError, match="observation 0 must be contiguous float32"):
        stem.sparse_stem([np.zeros((10, 34), np.float64)], w, out, 10, 8)
    with pytest.raises(ValueError, match="observation 0"):
        stem.sparse_stem([np.zeros((9, 34), np.float32)], w, out, 10, 8)
    with pytest.raises(ValueError, match="weight"):
        stem.sparse_stem([np.zeros((10, 34), np.float32)], w[:5], out, 10, 8)
    with pytest.raises(ValueError, match="out"):
        stem.sparse_stem([np.zeros((10, 34), np.float32)] * 2, w, out, 10, 8)


def test_dense_fallback_when_kernel_missing(monkeypatch):
    """Without the compiled module the frozen copy runs the dense convolution, same q-values."""
    monkeypatch.setattr(inference, "_stem", None)
    obs, masks = observations(3)
    brain, dqn = model(3)
    frozen = FrozenQ(brain, dqn)
    assert not frozen.stem.sparse
    with torch.inference_mode():
        assert_q_close(frozen.q_values(obs, torch.from_numpy(np.stack(masks))),
                       reference_q(brain, dqn, obs, masks))


@pytest.mark.parametrize("version", [1, 3, 4])
def test_engine_greedy_actions_identical(version):
    obs, masks = observations(version)
    brain, dqn = model(version)
    fast = MortalEngine(brain, dqn, version=version)
    slow = MortalEngine(brain, dqn, version=version, frozen_cpu=False)
    assert fast.frozen_cpu and not slow.frozen_cpu
    for i in range(0, len(obs), 96):  # the batch sizes self-play sees
        a_fast, q_fast, m_fast, g_fast = fast.react_batch(obs[i:i + 96], masks[i:i + 96])
        a_slow, q_slow, m_slow, g_slow = slow.react_batch(np.stack(obs[i:i + 96]), masks[i:i + 96])
        assert a_fast == a_slow and m_fast == m_slow and g_fast == g_slow
        assert_q_close(q_fast, q_slow)
    # one row at a time (a lone decision)
    assert fast.react_batch(obs[:1], masks[:1])[0] == slow.react_batch(obs[:1], masks[:1])[0]


def test_engine_v1_stochastic_latent_draws_as_reference():
    """Version 1 with a sampled latent: the same seeded draws on both paths."""
    obs, masks = observations(1)
    brain, dqn = model(1)
    kw = dict(version=1, stochastic_latent=True, seed=7)
    q_fast = MortalEngine(brain, dqn, **kw).react_batch(obs[:50], masks[:50])[1]
    q_slow = MortalEngine(brain, dqn, frozen_cpu=False, **kw).react_batch(obs[:50], masks[:50])[1]
    assert_q_close(q_fast, q_slow)


def test_engine_rebuilds_its_copy_after_a_weight_update():
    """The client loads new weights into the same modules (load_state_dict) and a learner steps them in place:
    the engine's frozen copy must follow, not answer with the old weights."""
    obs, masks = observations(3)
    obs, masks = obs[:64], masks[:64]
    brain, dqn = model(3, seed=0)
    engine = MortalEngine(brain, dqn, version=3)
    q_old = engine.react_batch(obs, masks)[1]
    new_brain, new_dqn = model(3, seed=5)
    brain.load_state_dict(new_brain.state_dict())
    dqn.load_state_dict(new_dqn.state_dict())
    q_new = engine.react_batch(obs, masks)[1]
    assert_q_close(q_new, reference_q(new_brain, new_dqn, obs, masks))
    assert not np.allclose(np.nan_to_num(q_new), np.nan_to_num(q_old), atol=1e-3)
    with torch.no_grad():  # an optimizer-style in-place step on one BatchNorm statistic
        brain.encoder.net[1].res_unit[0].running_mean.add_(1.0)
    assert_q_close(engine.react_batch(obs, masks)[1], reference_q(brain, dqn, obs, masks))


def test_frozen_path_only_where_it_applies():
    brain, dqn = model(3)
    obs, masks = observations(3)
    engine = MortalEngine(brain, dqn, version=3)
    engine.react_batch(obs[:4], masks[:4])
    assert engine._frozen is not None
    brain.train()  # modules back in train mode (batch statistics): their own forward, not the eval-mode copy
    with torch.inference_mode():
        ref = dqn(brain(torch.from_numpy(np.stack(obs[:40]))), torch.from_numpy(np.stack(masks[:40])))
    assert_q_close(engine.react_batch(obs[:40], masks[:40])[1], ref)
    brain.eval()
    assert not MortalEngine(brain, dqn, version=3, enable_amp=True).frozen_cpu
    assert not MortalEngine(brain, dqn, version=3, frozen_cpu=False).frozen_cpu
    oracle = Brain(conv_channels=16, num_blocks=1, version=3, is_oracle=True)
    assert not inference.supports(oracle, dqn)
    assert not inference.supports(brain, DQN(version=4))
    assert not inference.supports(torch.nn.Identity(), dqn)
    with pytest.raises(ValueError, match="non-oracle Brain"):
        FrozenQ(oracle, dqn)


def test_mish_matches_torch():
    x = torch.cat((torch.linspace(-30, 30, 10001), torch.tensor([-1e4, 1e4, 0.0, -0.0])))
    torch.testing.assert_close(inference.mish(x), F.mish(x), atol=1e-6, rtol=4e-7)
    assert torch.isnan(inference.mish(torch.tensor([float("nan")]))).all()
