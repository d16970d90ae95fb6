"""The learner's stem reads packed observations (mortal.features.packed_obs) directly on the CPU: the forward and the
weight gradient equal the sparse stem's on the unpacked rows bit for bit (the same nonzeros in the same order), so a
train step fed packed rows is the same step; elsewhere the rows are unpacked first."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from mortal.features import packed_obs
from mortal.learning.intake import batch_on_device
from mortal.model import networks
from mortal.model.networks import Brain, DQN, StemConv, takes_packed

from conftest import CallSpy, hanchan_observations, load_script

_stem = pytest.importorskip("mortal.model._stem")
_FORWARD_BENCH = load_script("bench/forward.py", "forward_bench")


def packed_observations(version):
    """(packed (N, row_bytes) uint8, masks (N, 46) bool) of every decision of seats 0 and 1 of a public hanchan."""
    obs, masks = hanchan_observations(version)
    return torch.from_numpy(packed_obs.pack(obs.numpy(), version)), masks


def Spy(monkeypatch):
    """Counts the sparse stem's calls on packed rows."""
    return CallSpy(monkeypatch, networks._SparseStemConv, "apply", when=lambda x, *rest: x.dtype == torch.uint8)


def _packed_case(n_in, real, rng, n=6):
    """A hand-built packed batch over ``n_in`` channels whose rows ``real`` hold floats: (packed (n, row_bytes)
    uint8, real_index (n_in,) int32, the same observations unpacked (n, n_in, 34) float32)."""
    x = (rng.random((n, n_in, 34)) < 0.1).astype(np.float32)
    x[1] = 0.0  # an all-zero sample
    x[3, :, 0] = 1.0  # both edge columns
    x[3, :, 33] = 1.0
    x[:, real] = rng.normal(size=(n, len(real), 34)).astype(np.float32)
    x[2, real, 5] = 0.0
    x[2, real, 6] = -0.0  # a negative zero is a zero, as the float path reads it
    real_index = np.full(n_in, -1, np.int32)
    real_index[real] = np.arange(len(real))
    bits = np.packbits((x != 0).reshape(n, -1), axis=1, bitorder="little")
    # junk bits under the real rows: the kernel must read those rows from the float section only
    bits_pad = (n_in * 34 + 31) // 32 * 4
    section = np.zeros((n, bits_pad), np.uint8)
    section[:, :bits.shape[1]] = bits
    packed = np.concatenate([x[:, real].reshape(n, -1).view(np.uint8), section], axis=1)
    return np.ascontiguousarray(packed), real_index, x


@pytest.mark.parametrize("n_in,n_out", [(934, 32), (40, 64), (40, 40), (17, 5), (15, 8)])
def test_packed_kernels_equal_the_float_kernels_bit_for_bit(n_in, n_out):
    """Register blocks of 96 floats (32, 64 outputs), the scalar paths (40, 5 outputs), and a last channel whose
    8-byte read would pass the row's end (15 channels: 510 bits in 64 bytes)."""
    rng = np.random.default_rng(7)
    packed, real_index, x = _packed_case(n_in, [0, 2, n_in - 1], rng)
    w = rng.normal(size=(n_in, 3, n_out)).astype(np.float32)
    out_f = np.full((6, n_out, 34), np.nan, np.float32)
    out_p = out_f.copy()
    _stem.sparse_stem(list(x), w, out_f, n_in, n_out)
    _stem.sparse_stem_packed(packed, real_index, w, out_p, n_in, n_out)
    assert np.array_equal(out_p, out_f)
    ref = F.conv1d(torch.from_numpy(x), torch.from_numpy(w).permute(2, 0, 1), padding=1).numpy()
    np.testing.assert_allclose(out_p, ref, atol=1e-4, rtol=1e-5)
    g = np.ascontiguousarray(np.pad(rng.normal(size=(6, n_out, 34)).astype(np.float32), ((0, 0), (0, 0), (1, 1)))
                             .transpose(0, 2, 1))
    dw_f = np.full((n_in, 3, n_out), np.nan, np.float32)
    dw_p = dw_f.copy()
    _stem.sparse_stem_grad(x, g, dw_f, n_in, n_out)
    _stem.sparse_stem_packed_grad(packed, real_index, g, dw_p, n_in, n_out)
    assert np.array_equal(dw_p, dw_f)


def test_packed_kernels_reject_bad_buffers():
    packed, real_index, _ = _packed_case(10, [1], np.random.default_rng(0))
    assert packed.shape == (6, 34 * 4 + 44)  # one real row, then 340 bits in 11 words
    w, out = np.zeros((10, 3, 8), np.float32), np.zeros((6, 8, 34), np.float32)
    g, dw = np.zeros((6, 36, 8), np.float32), np.zeros((10, 3, 8), np.float32)
    _stem.sparse_stem_packed(packed, real_index, w, out, 10, 8)
    _stem.sparse_stem_packed_grad(packed, real_index, g, dw, 10, 8)
    with pytest.raises(ValueError, match=r"packed must be contiguous uint8 \(N=6, 180\)"):
        _stem.sparse_stem_packed(packed[:, :-4].copy(), real_index, w, out, 10, 8)
    with pytest.raises(ValueError, match="packed must be"):
        _stem.sparse_stem_packed_grad(packed[:1].copy(), real_index, g, dw, 10, 8)
    bad = real_index.copy()
    bad[3] = 0  # a second row numbered 0
    with pytest.raises(ValueError, match=r"real_index\[3\] is 0, expected -1 or 1"):
        _stem.sparse_stem_packed(packed, bad, w, out, 10, 8)
    with pytest.raises(ValueError, match="real_index must be contiguous int32"):
        _stem.sparse_stem_packed(packed, real_index.astype(np.int64), w, out, 10, 8)
    with pytest.raises(ValueError, match="weight must be"):
        _stem.sparse_stem_packed(packed, real_index, w[:5], out, 10, 8)
    with pytest.raises(ValueError, match="dw must be"):
        _stem.sparse_stem_packed_grad(packed, real_index, g, dw[:5], 10, 8)
    with pytest.raises(ValueError, match="bad sizes"):
        _stem.sparse_stem_packed(packed, real_index, w, out, 0, 8)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_train_step_on_packed_rows_is_the_same_step(monkeypatch, version):
    """Brain + DQN (BatchNorm frozen, as the learner) on packed rows: the forward and every parameter's gradient are
    the unpacked rows' bit for bit; the stem took the packed path once."""
    packed, masks = packed_observations(version)
    packed, masks = packed[:96], masks[:96]
    brain, dqn = _FORWARD_BENCH.trained_like(version, 32, 2)
    brain.freeze_bn(True).train()
    dqn.train()
    actions = masks.float().argmax(-1, keepdim=True)
    target = torch.linspace(-1.0, 1.0, packed.shape[0])[:, None]
    params = [*brain.parameters(), *dqn.parameters()]

    def step(obs):
        for p in params:
            p.grad = None
        out = brain(obs)
        q = dqn(out[0] if isinstance(out, tuple) else out, masks)
        F.mse_loss(q.gather(1, actions), target).backward()
        return q.detach(), [None if p.grad is None else p.grad.clone() for p in params]

    spy = Spy(monkeypatch)
    q_packed, g_packed = step(packed)
    assert spy.calls == 1
    q_float, g_float = step(packed_obs.unpack(packed, version))
    assert spy.calls == 1
    assert torch.equal(q_packed, q_float)
    assert brain.encoder.net[0].weight.grad.abs().max() > 1e-4  # a gradient that says something
    for (name, _), a, b in zip([*brain.named_parameters(), *dqn.named_parameters()], g_packed, g_float):
        assert (a is None) == (b is None), name
        assert a is None or torch.equal(a, b), name


def test_packed_rows_elsewhere_are_unpacked_first(monkeypatch):
    """Without the kernel, under bf16 autocast, or with a gradient penalty the stem unpacks and runs as before;
    a row of another width, or a stem no version has, is refused by name."""
    packed, _ = packed_observations(3)
    packed = packed[:16]
    x = packed_obs.unpack(packed, 3)
    stem = Brain(conv_channels=32, num_blocks=2, version=3).encoder.net[0]
    w = stem.weight.detach()
    spy = Spy(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert stem(packed).dtype == torch.bfloat16
    assert spy.calls == 0
    # backward with create_graph: the dense weight gradient, itself differentiable (equal to the float rows')
    g1, = torch.autograd.grad(stem(packed).square().sum(), stem.weight, create_graph=True)
    g2, = torch.autograd.grad(stem(x).square().sum(), stem.weight, create_graph=True)
    torch.testing.assert_close(g1, g2)
    assert spy.calls == 1
    monkeypatch.setattr(networks, "_stem", None)
    torch.testing.assert_close(stem(packed), F.conv1d(x, w, padding=1))
    assert spy.calls == 1
    with pytest.raises(ValueError, match=r"expected \(B, 13900\) uint8 rows of version 3"):
        stem(packed[:, :-4])
    with pytest.raises(ValueError, match="packed observations need a stem of"):
        StemConv(40, 8, kernel_size=3, padding=1, bias=False)(packed)


def test_oracle_brain_unpacks_its_public_rows():
    packed, _ = packed_observations(3)
    packed = packed[:8]
    brain = Brain(conv_channels=32, num_blocks=2, version=3, is_oracle=True).eval()
    invisible = torch.zeros((8, brain.encoder.net[0].in_channels - 934, 34))
    with torch.no_grad():
        assert torch.equal(brain(packed, invisible), brain(packed_obs.unpack(packed, 3), invisible))


def test_intake_keeps_packed_rows_only_when_asked():
    packed, masks = packed_observations(3)
    n = 8
    actions = masks[:n].float().argmax(-1)
    batch = (packed[:n], actions, masks[:n], torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.float64),
             torch.zeros(n, dtype=torch.int64), None, None)
    kept = batch_on_device(batch, torch.device("cpu"), 3, keep_packed=True)[0]
    assert kept.dtype == torch.uint8 and torch.equal(kept, packed[:n])
    unpacked = batch_on_device(batch, torch.device("cpu"), 3)[0]
    assert torch.equal(unpacked, packed_obs.unpack(packed[:n], 3))
    # the offline mix's rows join while packed
    extra = iter([(packed[n:2 * n], actions, masks[:n], *batch[3:6])])
    both = batch_on_device(batch, torch.device("cpu"), 3, offline_stream=extra, keep_packed=True)[0]
    assert torch.equal(both, packed[:2 * n])


def test_takes_packed_only_for_the_eager_float_cpu_learner(monkeypatch):
    cpu = torch.device("cpu")
    assert takes_packed(cpu, amp=False, compiled=False)
    assert not takes_packed(cpu, amp=True, compiled=False)
    assert not takes_packed(cpu, amp=False, compiled=True)
    assert not takes_packed(torch.device("cuda", 0), amp=False, compiled=False)
    monkeypatch.setattr(networks, "_stem", None)
    assert not takes_packed(cpu, amp=False, compiled=False)
