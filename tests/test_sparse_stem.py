"""The Brain's first convolution from the input's nonzeros in training (mortal.model.networks.StemConv): the forward
and the weight gradient of a whole train step equal the dense convolution's up to float rounding, the dense path is
kept wherever the sparse one does not apply, and the state_dict keys are Mortal's."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from mortal.model import networks
from mortal.model.networks import DQN, Brain, StemConv

from conftest import CallSpy, hanchan_observations, load_script

_stem = pytest.importorskip("mortal.model._stem")
_FORWARD_BENCH = load_script("bench/forward.py", "forward_bench")


def Spy(monkeypatch):
    """Counts the sparse path's calls."""
    return CallSpy(monkeypatch, networks._SparseStemConv, "apply")


def test_stem_is_the_sparse_conv_with_mortals_keys():
    brain = Brain(conv_channels=32, num_blocks=2, version=3)
    assert type(brain.encoder.net[0]) is StemConv
    # the same module with a plain Conv1d stem (today's Mortal): identical keys and shapes, loads both ways
    plain = Brain(conv_channels=32, num_blocks=2, version=3)
    plain.encoder.net[0] = nn.Conv1d(934, 32, kernel_size=3, padding=1, bias=False)
    keys = [(k, tuple(v.shape)) for k, v in brain.state_dict().items()]
    assert keys == [(k, tuple(v.shape)) for k, v in plain.state_dict().items()]
    assert keys[0] == ("encoder.net.0.weight", (32, 934, 3))
    plain.load_state_dict(brain.state_dict(), strict=True)
    brain.load_state_dict(plain.state_dict(), strict=True)
    assert torch.equal(brain.encoder.net[0].weight, plain.encoder.net[0].weight)


def test_sparse_forward_equals_conv1d_on_real_observations(monkeypatch):
    spy = Spy(monkeypatch)
    x = hanchan_observations(3)[0]
    assert 0.05 < (x != 0).float().mean() < 0.2  # the sparsity the kernel is for
    stem = Brain(conv_channels=32, num_blocks=2, version=3).encoder.net[0]
    ref = F.conv1d(x, stem.weight.detach(), padding=1)
    for ctx in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with ctx():
            out = stem(x)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert spy.calls == 3


@pytest.mark.parametrize("version", [1, 3])
def test_train_step_gradients_equal_dense(monkeypatch, version):
    """Every parameter's gradient of a TD-style loss through Brain + DQN (BatchNorm frozen, as the learner)."""
    obs, masks = hanchan_observations(version)
    obs, masks = obs[:128], masks[:128]
    brain, dqn = _FORWARD_BENCH.trained_like(version, 32, 2)
    brain.freeze_bn(True).train()
    dqn.train()
    actions = masks.float().argmax(-1, keepdim=True)  # the first legal action of each row
    target = torch.linspace(-1.0, 1.0, obs.shape[0])[:, None]
    params = [*brain.parameters(), *dqn.parameters()]

    def grads():
        for p in params:
            p.grad = None
        out = brain(obs)
        q = dqn(out[0] if isinstance(out, tuple) else out, masks)
        F.mse_loss(q.gather(1, actions), target).backward()
        return [None if p.grad is None else p.grad.clone() for p in params]  # v1: logsig_head has none

    spy = Spy(monkeypatch)
    sparse = grads()
    assert spy.calls == 1
    monkeypatch.setattr(networks, "_stem", None)
    dense = grads()
    assert spy.calls == 1
    stem_grad = brain.encoder.net[0].weight.grad
    assert stem_grad.abs().max() > 1e-4  # a gradient that says something
    assert sum(g is not None for g in sparse) >= len(params) - 2
    for (name, _), g_sparse, g_dense in zip([*brain.named_parameters(), *dqn.named_parameters()], sparse, dense):
        assert (g_sparse is None) == (g_dense is None), name
        if g_dense is None:
            continue
        scale = g_dense.abs().max().item()
        torch.testing.assert_close(g_sparse, g_dense, atol=1e-5 * scale, rtol=1e-4, msg=name)


def test_dense_fallback_where_sparse_does_not_apply(monkeypatch):
    spy = Spy(monkeypatch)
    x = hanchan_observations(3)[0][:16]
    stem = Brain(conv_channels=32, num_blocks=2, version=3).encoder.net[0]
    w = stem.weight.detach()
    # an input that needs its gradient: the dense path gives it
    xg = x.clone().requires_grad_(True)
    stem(xg).square().sum().backward()
    x_ref = x.clone().requires_grad_(True)
    F.conv1d(x_ref, w, padding=1).square().sum().backward()
    torch.testing.assert_close(xg.grad, x_ref.grad)
    assert spy.calls == 0
    # float64, a non-contiguous input, bf16 autocast: dense
    assert stem.double()(x.double()).dtype == torch.float64
    stem.float()
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)
    torch.testing.assert_close(stem(xt), F.conv1d(x, w, padding=1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert stem(x).dtype == torch.bfloat16
    assert spy.calls == 0
    # without the compiled kernel: dense, the same values
    monkeypatch.setattr(networks, "_stem", None)
    torch.testing.assert_close(stem(x), F.conv1d(x, w, padding=1))
    assert spy.calls == 0
    monkeypatch.undo()
    spy = Spy(monkeypatch)
    stem(x)
    assert spy.calls == 1  # the same input with the kernel does take the sparse path


@pytest.mark.parametrize("n_in,n_out", [(934, 32), (40, 64), (40, 40), (17, 5)])
def test_weight_gradient_kernel_matches_conv1d(n_in, n_out):
    """Real-valued and negative inputs, an all-zero sample, both edge columns; one and two 96-float register blocks
    (32 and 64 outputs), and output counts not a multiple of 32 (40, 5: the scalar path)."""
    rng = np.random.default_rng(1)
    x = (rng.random((6, n_in, 34)) < 0.1).astype(np.float32)
    x[1] = 0.0
    x[2, :3] = rng.normal(size=(3, 34))
    x[3, :, 0] = 1.0
    x[3, :, 33] = -2.5
    w = torch.randn(n_out, n_in, 3, requires_grad=True)
    g = torch.randn(6, n_out, 34)
    F.conv1d(torch.from_numpy(x), w, padding=1).backward(g)
    dw = np.full((n_in, 3, n_out), np.nan, np.float32)
    _stem.sparse_stem_grad(x, F.pad(g, (1, 1)).transpose(1, 2).contiguous().numpy(), dw, n_in, n_out)
    torch.testing.assert_close(torch.from_numpy(dw).permute(2, 0, 1), w.grad, atol=1e-4, rtol=1e-5)


def test_weight_gradient_kernel_rejects_bad_buffers():
    x, g, dw = np.zeros((2, 10, 34), np.float32), np.zeros((2, 36, 8), np.float32), np.zeros((10, 3, 8), np.float32)
    _stem.sparse_stem_grad(x, g, dw, 10, 8)
    with pytest.raises(ValueError, match="x must be"):
        _stem.sparse_stem_grad(x.astype(np.float64), g, dw, 10, 8)
    with pytest.raises(ValueError, match="g must be"):
        _stem.sparse_stem_grad(x, g[:1], dw, 10, 8)
    with pytest.raises(ValueError, match="dw must be"):
        _stem.sparse_stem_grad(x, g, dw[:5], 10, 8)
    with pytest.raises(ValueError, match="bad sizes"):
        _stem.sparse_stem_grad(x, g, dw, 0, 8)


@pytest.mark.parametrize("kwargs", [dict(padding=0), dict(padding=1, stride=2), dict(padding=2, dilation=2),
                                    dict(padding=1, padding_mode="circular"), dict(kernel_size=5, padding=2),
                                    dict(padding=1, groups=2)])
def test_other_conv_shapes_run_dense(monkeypatch, kwargs):
    # StemConv is a Conv1d: built with another shape it is that convolution (the kernel knows 3 taps, padding 1 only)
    spy = Spy(monkeypatch)
    torch.manual_seed(0)
    x = hanchan_observations(3)[0][:8, :40].contiguous()
    stem = StemConv(40, 32, **{"kernel_size": 3, "bias": False, **kwargs})
    torch.testing.assert_close(stem(x), nn.Conv1d.forward(stem, x))
    assert spy.calls == 0


def test_torch_func_transforms_run_dense():
    # vmap and torch.func.grad over a StemConv work as over a Conv1d (the autograd.Function would raise there)
    torch.manual_seed(0)
    x = hanchan_observations(3)[0][:12].reshape(3, 4, 934, 34)
    stem = StemConv(934, 32, kernel_size=3, padding=1, bias=False)
    w = stem.weight.detach()
    torch.testing.assert_close(torch.func.vmap(stem)(x), F.conv1d(x.flatten(0, 1), w, padding=1).view(3, 4, 32, 34))
    grad = torch.func.grad(lambda p: torch.func.functional_call(stem, p, (x[0],)).square().sum())
    w_ref = w.clone().requires_grad_(True)
    F.conv1d(x[0], w_ref, padding=1).square().sum().backward()
    torch.testing.assert_close(grad({"weight": w})["weight"], w_ref.grad)


def test_double_backward_equals_dense():
    # a gradient penalty (backward with create_graph): the weight gradient's own gradient is the dense one's
    torch.manual_seed(0)
    x = hanchan_observations(3)[0][:16].contiguous()
    stem = StemConv(934, 32, kernel_size=3, padding=1, bias=False)

    def penalty_grad(conv, w):
        g, = torch.autograd.grad(conv(w).square().sum(), w, create_graph=True)
        return torch.autograd.grad(g.square().sum(), w)[0]
    w_ref = stem.weight.detach().clone().requires_grad_(True)
    torch.testing.assert_close(penalty_grad(lambda w: stem(x), stem.weight),
                               penalty_grad(lambda w: F.conv1d(x, w, padding=1), w_ref), rtol=1e-3, atol=1e-3)
