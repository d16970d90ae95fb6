"""The learner's Mish (mortal.model.networks.Mish): on the CPU the forward and gradient come from one exp, equal to
``F.mish``'s up to float rounding; a train step's gradients through Brain + DQN are the ``nn.Mish`` ones; the
gradient is itself differentiable; elsewhere ``F.mish`` runs."""

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
