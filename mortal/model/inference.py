"""A frozen CPU inference copy of ``Brain`` + ``DQN``: the same q-values up to float rounding, cheaper
(sparse stem, folded BatchNorms, one-``exp`` Mish; docs/performance_forward.md). No oracle Brain."""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

# _stem: the compiled sparse first convolution, None when it is not built (networks' import serves both)
from mortal.model.networks import ACTION_SPACE, DQN, Brain, ResBlock, _stem, mish

#: True when the first convolution runs from the nonzero inputs (``mortal.model._stem`` is built).
HAVE_SPARSE_STEM = _stem is not None

logger = logging.getLogger(__name__)
_warned_dense = False


def supports(brain, dqn) -> bool:
    """Whether ``FrozenQ`` can stand in for this pair: a non-oracle ``Brain`` and a ``DQN`` of one version."""
    return (isinstance(brain, Brain) and isinstance(dqn, DQN) and not brain.is_oracle
            and brain.version == dqn.version)


def module_tensors(*modules: nn.Module) -> list[Tensor]:
    """Every parameter and buffer of ``modules``, in order (the tensors ``weights_key`` watches)."""
    return [t for m in modules for t in (*m.parameters(), *m.buffers())]


def weights_key(tensors: list[Tensor]) -> tuple:
    """A key that changes when one of ``tensors`` is written in place or gets new storage."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


def _bn_affine(bn: nn.BatchNorm1d) -> tuple[Tensor, Tensor]:
    """Eval-mode BatchNorm as ``x * scale + shift`` per channel (float32, detached)."""
    scale = bn.weight.detach() / torch.sqrt(bn.running_var + bn.eps)
    shift = bn.bias.detach() - bn.running_mean * scale
    return scale.float().clone(), shift.float().clone()


def _fold(conv: nn.Conv1d, bn: nn.BatchNorm1d | None) -> tuple[Tensor, Tensor | None]:
    """Weight and bias of ``bn(conv(x))`` as one convolution (``bn`` None: the conv's own)."""
    w = conv.weight.detach().float().clone()
    b = None if conv.bias is None else conv.bias.detach().float().clone()
    if bn is None:
        return w, b
    scale, shift = _bn_affine(bn)
    w = w * scale[:, None, None]
    b = shift if b is None else b * scale + shift
    return w.contiguous(), b


# Below this many rows a width-3 convolution runs as one matrix product and two shifted adds (oneDNN's per-call cost
# dominates there; docs/performance_forward.md).
_SMALL_BATCH = 32


class _Conv3:
    """A width-3, padding-1 convolution ``(N, C, 34) -> (N, O, 34)`` with its (folded) weight and bias."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        self.weight, self.bias = weight.contiguous(), bias
        o, c = weight.shape[:2]
        self.out_channels = o
        self.taps = weight.permute(2, 0, 1).reshape(3 * o, c).contiguous()  # row k * O + o: tap k of output o
        self.bias_col = None if bias is None else bias[:, None]

    def __call__(self, x: Tensor) -> Tensor:
        if x.shape[0] >= _SMALL_BATCH:
            return F.conv1d(x, self.weight, self.bias, padding=1)
        o = self.out_channels
        y = torch.matmul(self.taps, x)  # (N, 3 O, 34): each tap's product at every column
        out = y[:, o:2 * o].clone() if self.bias_col is None else y[:, o:2 * o] + self.bias_col
        out[..., 1:] += y[:, :o, :-1]  # tap 0 reads the column to the left
        out[..., :-1] += y[:, 2 * o:, 1:]  # tap 2 the one to the right
        return out


def _lin(layer: nn.Linear) -> tuple[Tensor, Tensor | None]:
    return layer.weight.detach().float().clone(), None if layer.bias is None else layer.bias.detach().float().clone()


class _Stem:
    """The first convolution (no bias), BatchNorm folded (version 1)."""

    def __init__(self, conv: nn.Conv1d, bn: nn.BatchNorm1d | None, sparse: bool):
        self.weight, self.bias = _fold(conv, bn)
        self.out_channels, self.in_channels = self.weight.shape[:2]
        self.sparse = sparse and _stem is not None
        global _warned_dense
        if sparse and _stem is None and not _warned_dense:
            _warned_dense = True
            logger.warning("mortal.model._stem is not built: CPU inference runs the dense first convolution, "
                           "about half the speed of self-play's forward; run bash scripts/setup.sh (needs g++)")
        # (C, 3, O): each input channel's three taps side by side, as the compiled kernel reads them
        self.weight_cko = self.weight.permute(1, 2, 0).contiguous().numpy() if self.sparse else None

    def __call__(self, obs) -> Tensor:
        if self.sparse:
            n = len(obs)
            out = torch.empty((n, self.out_channels, 34), dtype=torch.float32)
            rows = obs if isinstance(obs, (list, tuple)) else list(obs)  # an (N, C, 34) array: its rows, no copy
            _stem.sparse_stem([np.ascontiguousarray(o, dtype=np.float32) for o in rows], self.weight_cko,
                              out.numpy(), self.in_channels, self.out_channels)
        else:
            x = obs if isinstance(obs, np.ndarray) and obs.dtype == np.float32 else np.stack(obs).astype(np.float32,
                                                                                                   copy=False)
            out = F.conv1d(torch.from_numpy(x), self.weight, padding=1)
        if self.bias is not None:
            out += self.bias[:, None]
        return out


class _Block:

    def __init__(self, block: ResBlock, version: int):
        u = block.res_unit
        self.pre_actv = block.pre_actv
        if self.pre_actv:  # BN, act, conv, BN, act, conv
            self.bn1 = _bn_affine(u[0])
            self.conv1 = _Conv3(*_fold(u[2], u[3]))
            self.conv2 = _Conv3(*_fold(u[5], None))
        else:  # conv, BN, act, conv, BN
            self.conv1 = _Conv3(*_fold(u[0], u[1]))
            self.conv2 = _Conv3(*_fold(u[3], u[4]))
        mlp = block.ca.shared_mlp
        self.ca1, self.ca2 = _lin(mlp[0]), _lin(mlp[2])
        self.act = _act(version)
        # the attention's hidden layer has 2 units a row: one fused op beats the one-exp form's seven
        self.ca_act = (lambda x: F.relu(x)) if version == 1 else F.mish

    def __call__(self, h: Tensor) -> Tensor:
        if self.pre_actv:
            r = mish(torch.addcmul(self.bn1[1][:, None], h, self.bn1[0][:, None]))
        else:
            r = h
        r = self.act(self.conv1(r))
        r = self.conv2(r)
        # channel attention: one shared MLP over the mean- and max-pooled vectors, stacked
        pooled = torch.cat((r.mean(dim=-1), r.amax(dim=-1)))
        g_mean, g_max = F.linear(self.ca_act(F.linear(pooled, *self.ca1)), *self.ca2).chunk(2)
        r = r * (g_mean + g_max).sigmoid_().unsqueeze(-1)
        out = r.add_(h)
        return out if self.pre_actv else out.relu_()


def _act(version: int):
    return (lambda x: F.relu(x)) if version == 1 else mish


class FrozenQ:
    """``dqn(brain(obs), mask)`` in eval mode from a frozen float32 CPU copy of the weights:
    ``q_values(obs (N, C, 34), mask (N, 46) bool) -> (N, 46)`` float32; ``latent`` (v1): ``(mu, logsig)``."""

    def __init__(self, brain: Brain, dqn: DQN, *, sparse_stem: bool = True):
        if not supports(brain, dqn):
            raise ValueError("FrozenQ needs a non-oracle Brain and a DQN of the same version")
        with torch.no_grad():
            v = self.version = brain.version
            net = list(brain.encoder.net)
            blocks = [m for m in net if isinstance(m, ResBlock)]
            head_conv, flat_lin = net[-4], net[-1]
            if v >= 2:  # stem, blocks, BN, act, head conv, act, flatten, linear
                self.stem = _Stem(net[0], None, sparse_stem)
                self.final_bn = _bn_affine(net[1 + len(blocks)])
            else:  # stem, BN, act, blocks, head conv, act, flatten, linear
                self.stem = _Stem(net[0], net[1], sparse_stem)
                self.final_bn = None
            self.blocks = [_Block(b, v) for b in blocks]
            self.head = _Conv3(*_fold(head_conv, None))
            self.flat = _lin(flat_lin)
            self.act = _act(v)
            if v == 1:
                self.latent_lin = _lin(brain.latent_net[0])
                self.mu, self.logsig = _lin(brain.mu_head), _lin(brain.logsig_head)
                self.v_head, self.a_head = _lin(dqn.v_head), _lin(dqn.a_head)
            elif v in (2, 3):
                (wv, bv), (wa, ba) = _lin(dqn.v_head[0]), _lin(dqn.a_head[0])
                self.hidden = wv.shape[0]
                self.dqn_hidden = (torch.cat((wv, wa)), torch.cat((bv, ba)))
                self.v_out, self.a_out = _lin(dqn.v_head[2]), _lin(dqn.a_head[2])
            else:
                self.dqn_net = _lin(dqn.net)

    def phi(self, obs) -> Tensor:
        """The encoder's output before the Brain's last step: ``(N, 1024)`` float32."""
        h = self.stem(obs)
        if self.version == 1:
            h = h.relu_()
        for block in self.blocks:
            h = block(h)
        if self.final_bn is not None:
            h = mish(torch.addcmul(self.final_bn[1][:, None], h, self.final_bn[0][:, None]))
        h = self.act(self.head(h))
        return F.linear(h.flatten(1), *self.flat)

    def latent(self, obs) -> tuple[Tensor, Tensor]:
        """Version 1: the Brain's ``(mu, logsig)``, each ``(N, 512)``."""
        lat = F.linear(self.phi(obs), *self.latent_lin).relu_()
        return F.linear(lat, *self.mu), F.linear(lat, *self.logsig)

    def q_from_features(self, x: Tensor, mask: Tensor) -> Tensor:
        """The DQN on the Brain's output ``x`` (``(N, 512)`` for version 1, else ``(N, 1024)``)."""
        if self.version == 1:
            v, a = F.linear(x, *self.v_head), F.linear(x, *self.a_head)
        elif self.version in (2, 3):
            hid = mish(F.linear(x, *self.dqn_hidden))
            v = F.linear(hid[:, :self.hidden], *self.v_out)
            a = F.linear(hid[:, self.hidden:], *self.a_out)
        else:
            v, a = F.linear(x, *self.dqn_net).split((1, ACTION_SPACE), dim=-1)
        # the dueling combination exactly as DQN.forward
        n_legal = mask.sum(dim=-1, keepdim=True)
        a_mean = a.masked_fill(~mask, 0.0).sum(dim=-1, keepdim=True) / n_legal
        return (v + a - a_mean).masked_fill(~mask, -torch.inf)

    def q_values(self, obs, mask: Tensor) -> Tensor:
        """``(N, 46)`` q-values; version 1 uses the latent mean ``mu``."""
        if self.version == 1:
            return self.q_from_features(self.latent(obs)[0], mask)
        return self.q_from_features(mish(self.phi(obs)), mask)

