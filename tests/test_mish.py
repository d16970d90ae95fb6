"""The learner's Mish (mortal.model.networks.Mish): on the CPU the forward and gradient come from one exp, equal to
``F.mish``'s up to float rounding; a train step's gradients through Brain + DQN are the ``nn.Mish`` ones; the
gradient is itself differentiable; elsewhere ``F.mish`` runs."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from mortal.model import networks
from mortal.model.networks import DQN, Brain, Mish

from conftest import load_script

_FORWARD_BENCH = load_script("bench/forward.py", "forward_bench")
GRID = torch.cat((torch.linspace(-40, 40, 16001), torch.tensor([-1e4, 1e4, 0.0, -0.0, 19.99, 20.0, 20.01])))


def grad_of(fn, x):
    x = x.clone().requires_grad_()
    fn(x).sum().backward()
    return x.grad


def test_values_by_hand():
    # mish(0) = 0; mish'(0) = tanh(ln 2) = 3/5; mish(1) = tanh(ln(1 + e)) = (e^2 + 2e) / (e^2 + 2e + 2)
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    y = Mish()(x)
    e = torch.e
    torch.testing.assert_close(y.detach(), torch.tensor([0.0, (e * e + 2 * e) / (e * e + 2 * e + 2)]))
    y[0].backward()
    assert x.grad[0].item() == pytest.approx(0.6, abs=1e-7)


def test_forward_and_gradient_equal_f_mish():
    for dtype, tol in ((torch.float32, 4e-7), (torch.float64, 1e-14)):
        x = GRID.to(dtype)
        torch.testing.assert_close(Mish()(x.clone().requires_grad_()).detach(), F.mish(x), atol=1e-6, rtol=tol)
        torch.testing.assert_close(grad_of(Mish(), x), grad_of(F.mish, x), atol=1e-6, rtol=max(tol, 1e-6))
    nan = torch.tensor([float("nan")], requires_grad=True)
    y = Mish()(nan)
    y.backward()
    assert torch.isnan(y).all() and torch.isnan(nan.grad).all()


def test_gradcheck_and_second_derivative():
    x = torch.linspace(-12, 12, 97, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(networks._MishFn.apply, (x,))
    assert torch.autograd.gradgradcheck(networks._MishFn.apply, (x,))


def test_train_step_gradients_equal_nn_mish():
    """Every parameter's gradient of a TD-style loss through Brain + DQN, against the same modules with nn.Mish."""
    brain, dqn = _FORWARD_BENCH.trained_like(3, 32, 2)
    brain.freeze_bn(True).train()
    dqn.train()
    torch.manual_seed(0)
    obs = (torch.rand(64, 934, 34) < 0.1).float()
    masks = torch.rand(64, 46) < 0.5
    masks[:, 0] = True
    target = torch.linspace(-1.0, 1.0, 64)[:, None]
    params = [*brain.parameters(), *dqn.parameters()]

    def grads():
        for p in params:
            p.grad = None
        q = dqn(brain(obs), masks)
        F.mse_loss(q[:, :1], target).backward()
        return [p.grad.clone() for p in params]

    ours = grads()
    swapped = 0
    for model in (brain, dqn):
        for mod in list(model.modules()):
            for name, child in mod.named_children():
                if type(child) is Mish:
                    setattr(mod, name, nn.Mish(inplace=True))
                    swapped += 1
    assert swapped == 2 * (2 + 1) + 1 + 1 + 1 + 2  # each block: 2 + its attention's; body, head, Brain; 2 heads
    for a, b in zip(ours, grads()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_no_grad_and_other_dtypes_take_their_paths(monkeypatch):
    calls = []
    monkeypatch.setattr(networks._MishFn, "apply", lambda x: calls.append(x) or F.mish(x))
    x = torch.linspace(-3, 3, 7)
    with torch.no_grad():
        torch.testing.assert_close(Mish()(x.clone().requires_grad_()), F.mish(x))
    half = x.to(torch.bfloat16).requires_grad_()
    assert Mish()(half).dtype == torch.bfloat16
    assert not calls
    Mish()(x.clone().requires_grad_())
    assert len(calls) == 1


# ---- the compiled kernels (mortal.model._stem.mish_forward / mish_backward) ----

INF, NAN = float("inf"), float("nan")
# the dense grid and the extremes; 16,011 values, so the AVX2 loop (8 at a time) ends in a scalar tail of 3
KGRID = torch.cat((GRID, torch.tensor([NAN, INF, -INF])))


def _stem_or_skip():
    return pytest.importorskip("mortal.model._stem")


def kernel(x, g=None, simd=True):
    """The kernels' mish(x), and g * mish'(x) when g is given, on float32 copies."""
    stem = _stem_or_skip()
    x = x.float().contiguous()
    y = torch.empty_like(x)
    stem.mish_forward(x.numpy(), y.numpy(), simd)
    if g is None:
        return y
    dx = torch.empty_like(x)
    stem.mish_backward(x.numpy(), g.float().contiguous().numpy(), dx.numpy(), simd)
    return y, dx


def test_kernel_equals_f_mish_on_grid_and_extremes():
    y, dx = kernel(KGRID, torch.ones_like(KGRID))
    fin = torch.isfinite(KGRID)
    # against F.mish in float64 rounded to float32: the vector exp is within ~2 ulp (1.2e-7 relative each) and four
    # more roundings follow, so 1e-6 relative (8 ulp) on the value. The gradient crosses zero near x = -1.19, where
    # n / (n + 2) and the negative second term cancel (in F.mish's formula too): 2e-7 absolute there, 1e-6 relative.
    x64 = KGRID[fin].double().requires_grad_()
    ref = F.mish(x64)
    ref.sum().backward()
    torch.testing.assert_close(y[fin], ref.detach().float(), rtol=1e-6, atol=1e-30)
    torch.testing.assert_close(dx[fin], x64.grad.float(), rtol=1e-6, atol=2e-7)
    # and F.mish's own float32 value and autograd gradient (which carry their own rounding: 1e-6 absolute)
    x32 = KGRID[fin].clone().requires_grad_()
    F.mish(x32).sum().backward()
    torch.testing.assert_close(y[fin], F.mish(KGRID[fin]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dx[fin], x32.grad, rtol=1e-6, atol=1e-6)
    # by hand: mish(0) = 0, mish'(0) = tanh(ln 2) = 3/5; above the clamp mish(x) = x, mish'(x) = 1
    at = lambda v: (KGRID == v).nonzero()[0, 0]  # noqa: E731
    assert y[at(0.0)].item() == 0.0 and dx[at(0.0)].item() == pytest.approx(0.6, abs=1e-7)
    for v in (20.0, 20.01, 1e4):
        assert y[at(v)].item() == pytest.approx(v, rel=1e-7) and dx[at(v)].item() == 1.0
    # very negative: e^x underflows to 0, so mish(-1e4) = -0.0 and its gradient 0
    assert y[at(-1e4)].item() == 0.0 and torch.signbit(y[at(-1e4)]) and dx[at(-1e4)].item() == 0.0
    # NaN propagates; mish(inf) = inf with gradient 1 (the limit; F.mish's is 0 * inf = NaN); -inf * 0 is NaN
    nan_at, inf_at = len(KGRID) - 3, len(KGRID) - 2
    assert torch.isnan(y[nan_at]) and torch.isnan(dx[nan_at]) and y[inf_at].item() == INF and dx[inf_at].item() == 1.0
    assert torch.isnan(y[-1]) and torch.isnan(dx[-1]) and torch.isnan(F.mish(KGRID[-1:])).all()


def test_kernel_scalar_path_equals_avx2_and_tails():
    torch.manual_seed(0)
    g = torch.randn(len(KGRID))
    y, dx = kernel(KGRID, g)
    ys, dxs = kernel(KGRID, g, simd=False)
    torch.testing.assert_close(ys, y, rtol=1e-6, atol=1e-7, equal_nan=True)
    torch.testing.assert_close(dxs, dx, rtol=1e-6, atol=1e-7, equal_nan=True)
    for size in range(0, 18):  # every tail length, and arrays shorter than one vector
        x = torch.randn(size) * 10
        gx = torch.randn(size)
        y, dx = kernel(x, gx)
        ref = x.clone().requires_grad_()
        F.mish(ref).backward(gx)
        torch.testing.assert_close(y, F.mish(x), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(dx, ref.grad, rtol=1e-6, atol=1e-6)


def test_kernel_bad_inputs_raise_value_error():
    stem = _stem_or_skip()
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="mish_forward"):
        stem.mish_forward(x, np.zeros(9, np.float32))
    with pytest.raises(ValueError, match="mish_forward"):
        stem.mish_forward(x.astype(np.float64), np.zeros(10, np.float64))
    with pytest.raises(ValueError):  # not contiguous
        stem.mish_forward(np.zeros(20, np.float32)[::2], x)
    with pytest.raises(ValueError):  # read-only output
        ro = np.zeros(10, np.float32)
        ro.flags.writeable = False
        stem.mish_forward(x, ro)
    with pytest.raises(ValueError, match="mish_backward"):
        stem.mish_backward(x, np.zeros(11, np.float32), np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="mish_backward"):
        stem.mish_backward(x, x, np.zeros(10, np.int32))


def test_mish_fn_takes_the_kernels_where_they_apply(monkeypatch):
    stem = _stem_or_skip()
    calls = []

    class Spy:  # the module's functions, counted
        def __getattr__(self, name):
            return lambda *a: calls.append(name) or getattr(stem, name)(*a)

    monkeypatch.setattr(networks, "_stem", Spy())
    x = torch.linspace(-5, 5, 37, requires_grad=True)
    Mish()(x).sum().backward()  # the gradient of sum() is an expanded (non-contiguous) scalar
    assert calls == ["mish_forward", "mish_backward"]
    torch.testing.assert_close(x.grad, grad_of(F.mish, x.detach()), rtol=1e-6, atol=1e-6)
    calls.clear()
    with torch.no_grad():
        networks.mish(x)
    assert calls == ["mish_forward"]
    calls.clear()
    # create_graph: the differentiable torch gradient; its gradient is mish'' (against F.mish's double backward)
    for fn in (Mish(), F.mish):
        x.grad = None
        (d,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
        d.sum().backward()
        if fn is F.mish:
            torch.testing.assert_close(second, x.grad, rtol=1e-5, atol=1e-5)
        second = x.grad.clone()
    assert calls == ["mish_forward"]
    calls.clear()
    # not contiguous, float64, or no kernel: the torch code, the same values
    xt = torch.randn(8, 6).t().requires_grad_()
    Mish()(xt).sum().backward()
    assert calls == []
    torch.testing.assert_close(xt.grad, grad_of(F.mish, xt.detach()), rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(networks, "_stem", None)
    torch.testing.assert_close(networks.mish(x.detach()), F.mish(x.detach()), rtol=4e-7, atol=1e-6)
