"""Neural networks of the trainer: ``Brain``, ``DQN``, ``AuxNet`` and ``GRP``. Every submodule and parameter name
follows Mortal's ``mortal/model.py`` so that Mortal checkpoints load with ``strict=True``."""

from itertools import permutations

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence

from mjai.mlibriichi.consts import ACTION_SPACE, GRP_SIZE
from mortal.features import packed_obs
from mortal.features.obs import check_version, obs_shape, oracle_obs_shape

try:
    from mortal.model import _stem
except ImportError:  # the optional compiled module is not built: the stem runs the dense convolution
    _stem = None
# torch >= 2.1 (pyproject): is_autocast_enabled takes a device type from 2.4; without torch.compiler.is_compiling
# (2.1, 2.2) a compiled Brain breaks its graph at the kernel and runs it eagerly, still correct
try:
    torch.is_autocast_enabled("cpu")
    _cpu_autocast = lambda: torch.is_autocast_enabled("cpu")  # noqa: E731
except TypeError:
    _cpu_autocast = torch.is_autocast_cpu_enabled
_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
# torch.func transforms (vmap, grad) refuse an autograd.Function without setup_context: torch's ops run there
_in_functorch = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def _plain_eager() -> bool:
    """Whether the CPU kernels below may stand in for torch's ops: no CPU autocast, compile, tracing or torch.func."""
    return not _cpu_autocast() and not _is_compiling() and not torch.jit.is_tracing() and not _in_functorch()


_BN_MOMENTUM = 0.01
_N_TILES = 34
_PHI_DIM = 1024


def parameter_count(module: nn.Module) -> int:
    """Number of trainable scalars in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


_MISH_CLAMP = 20.0  # above it e^x (e^x + 2) / (e^x (e^x + 2) + 2) is 1.0 in float32


def _mish_kernel(x: Tensor) -> bool:
    """Whether ``_stem``'s Mish kernels take ``x``: built, float32, contiguous, on the CPU."""
    return (_stem is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
            and hasattr(_stem, "mish_forward"))


def mish(x: Tensor) -> Tensor:
    """``F.mish(x)`` as ``x * n / (n + 2)``, ``n = e^x (e^x + 2)`` (within 4e-7 relative, ~2.5x faster on CPU), any
    shape; float32 contiguous CPU tensors outside autograd take the compiled kernel (one pass)."""
    if _mish_kernel(x) and not (x.requires_grad and torch.is_grad_enabled()):
        y = torch.empty_like(x)
        _stem.mish_forward(x.detach().numpy(), y.numpy())
        return y
    e = x.clamp(max=_MISH_CLAMP).exp_()
    n = e.add(2.0).mul_(e)
    return n.div_(n + 2.0).mul_(x)


class _MishFn(torch.autograd.Function):
    """``mish(x)`` and its gradient ``n / (n + 2) + 4 x e (1 + e) / (n + 2)^2`` (``e = e^x``, ``n = e (e + 2)``), each
    from one ``exp``: on the CPU 0.75x ``F.mish``'s forward and backward (torch's kernel takes ``exp``, ``log1p`` and
    ``tanh``; docs/performance.md, session 21); float32 contiguous CPU tensors take the compiled kernels (one pass
    each; docs/performance_forward.md). The same function up to float rounding."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)  # x only, as F.mish: the memory mortal.tools.doctor counts
        return mish(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        if _mish_kernel(x) and grad.dtype == torch.float32 and not torch.is_grad_enabled():
            g = grad.contiguous()  # the gradient of a sum() is an expanded scalar
            dx = torch.empty_like(x)
            _stem.mish_backward(x.detach().numpy(), g.numpy(), dx.numpy())
            return dx
        e = x.clamp(max=_MISH_CLAMP).exp()
        if torch.is_grad_enabled():  # backward with create_graph: every op from x, so the gradient is differentiable
            n = e * (e + 2.0)
            return grad * (n / (n + 2.0) + 4.0 * x * e * (e + 1.0) / (n + 2.0).square())
        n = e.add(2.0).mul_(e)
        n2 = n + 2.0
        d = x.mul(e).mul_(e.add_(1.0)).mul_(4.0).div_(n2).div_(n2)
        return d.add_(n.div_(n2)).mul_(grad)


class Mish(nn.Mish):
    """``nn.Mish`` (no parameters, the same module tree). On the CPU in float32/float64 it computes ``mish`` from one
    ``exp``, and its gradient from the same (``_MishFn``); anywhere else (CUDA, autocast, compile) ``F.mish``."""

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and _plain_eager():
            return _MishFn.apply(x) if x.requires_grad and torch.is_grad_enabled() else mish(x)
        return super().forward(x)


def _activation(version: int) -> nn.Module:
    # In-place is safe at every use site: each activation consumes a fresh tensor.
    return nn.ReLU(inplace=True) if version == 1 else Mish(inplace=True)


def _batch_norm(channels: int, version: int) -> nn.BatchNorm1d:
    eps = 1e-3 if version >= 3 else 1e-5
    return nn.BatchNorm1d(channels, eps=eps, momentum=_BN_MOMENTUM)


def _conv3(c_in: int, c_out: int, bias: bool = False) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel_size=3, padding=1, bias=bias)


class _SparseStemConv(torch.autograd.Function):
    """``conv1d(x, weight, padding=1)`` on the CPU, and its weight gradient, from x's nonzero entries
    (``mortal.model._stem``; docs/performance_forward.md). ``x``: ``(N, C, 34)`` float32 (``version`` None), or packed
    observations ``(N, row_bytes)`` uint8 of feature ``version`` (``mortal.features.packed_obs``), read in place: the
    same nonzeros in the same order, so the same output and weight gradient bit for bit. No gradient for ``x``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, version: int | None = None) -> Tensor:
        out = torch.empty((x.shape[0], weight.shape[0], _N_TILES), dtype=torch.float32)
        # (C, 3, O): each input channel's three taps side by side, as the kernel reads them
        w = weight.detach().permute(1, 2, 0).contiguous().numpy()
        if version is None:
            _stem.sparse_stem(x.numpy(), w, out.numpy(), x.shape[1], weight.shape[0])
        else:
            lay = packed_obs.layout(version)
            _stem.sparse_stem_packed(x.numpy(), lay.real_index, w, out.numpy(), lay.channels, weight.shape[0])
        ctx.save_for_backward(x)
        ctx.version = version
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (x,) = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return None, None, None
        version, o = ctx.version, grad_out.shape[1]
        if grad_out.requires_grad:  # backward with create_graph: the dense weight gradient, itself differentiable
            dense = x if version is None else packed_obs.unpack(x, version)
            return None, torch.nn.grad.conv1d_weight(dense, (o, dense.shape[1], 3), grad_out, padding=1), None
        g = F.pad(grad_out.float(), (1, 1)).transpose(1, 2).contiguous()  # (N, 36, O): positions -1 .. 34
        lay = None if version is None else packed_obs.layout(version)
        c = x.shape[1] if lay is None else lay.channels
        dw = torch.empty((c, 3, o), dtype=torch.float32)
        if lay is None:
            _stem.sparse_stem_grad(x.numpy(), g.numpy(), dw.numpy(), c, o)
        else:
            _stem.sparse_stem_packed_grad(x.numpy(), lay.real_index, g.numpy(), dw.numpy(), c, o)
        return None, dw.permute(2, 0, 1).contiguous(), None


#: in_channels of a Brain's stem -> the feature version whose packed observations it takes
_PACKED_VERSION = {obs_shape(v)[0]: v for v in (1, 2, 3, 4)}


def takes_packed(device: torch.device, *, amp: bool, compiled: bool) -> bool:
    """Whether a trainer on ``device`` may feed a Brain packed observations (``mortal.features.packed_obs``) for its
    stem to read directly: the CPU kernel is built, eager float32 (no AMP, no compile). Elsewhere unpack first."""
    return device.type == "cpu" and not amp and not compiled and hasattr(_stem, "sparse_stem_packed")


class StemConv(nn.Conv1d):
    """The first convolution (``Conv1d(C, O, 3, padding=1)``, no bias; the same parameters and state_dict keys).
    On the CPU, float32, eager, for an input ``(N, C, 34)`` that needs no gradient it runs from the input's nonzero
    entries (forward and weight gradient, about 10% of a real observation); anywhere else ``F.conv1d``. It also takes
    packed observations ``(N, row_bytes)`` uint8 (``mortal.features.packed_obs``), read directly on the CPU, else
    unpacked first."""

    def _sparse(self, device: torch.device, dtype: torch.dtype) -> bool:
        # the kernel is this shape's convolution only: another kernel size, padding, stride, ... runs dense
        w = self.weight
        return (_stem is not None and self.bias is None and self.kernel_size == (3,) and self.padding == (1,)
                and self.stride == self.dilation == (1,) and self.groups == 1 and self.padding_mode == "zeros"
                and device.type == "cpu" and w.device.type == "cpu" and dtype == w.dtype == torch.float32
                and _plain_eager())

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.uint8:
            version = _PACKED_VERSION.get(self.in_channels)
            if version is None:
                raise ValueError(f"packed observations need a stem of {sorted(_PACKED_VERSION)} input channels, "
                                 f"this one has {self.in_channels}")
            if (self._sparse(x.device, torch.float32) and hasattr(_stem, "sparse_stem_packed") and x.dim() == 2
                    and x.shape[1] == packed_obs.row_bytes(version) and x.is_contiguous()):
                return _SparseStemConv.apply(x, self.weight, version)
            x = packed_obs.unpack(x, version)  # ValueError for another width
        if (x.dim() == 3 and x.shape[1:] == (self.in_channels, _N_TILES) and not x.requires_grad
                and x.is_contiguous() and self._sparse(x.device, x.dtype)):
            return _SparseStemConv.apply(x, self.weight)
        return super().forward(x)


class ChannelAttention(nn.Module):
    """Squeeze-and-excitation: ``(N, C, 34)`` scaled per channel by a gate from mean and max pooling."""

    def __init__(self, channels: int, version: int, ratio: int = 16):
        super().__init__()
        hidden = channels // ratio
        if hidden < 1:
            raise ValueError(f"conv_channels={channels} is too small for channel attention (needs >= {ratio})")
        self.shared_mlp = nn.Sequential(
            nn.Linear(channels, hidden),
            _activation(version),
            nn.Linear(hidden, channels),
        )
        for layer in (self.shared_mlp[0], self.shared_mlp[2]):
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        gate = self.shared_mlp(x.mean(dim=-1)) + self.shared_mlp(x.amax(dim=-1))
        return x * gate.sigmoid().unsqueeze(-1)


class ResBlock(nn.Module):
    """Two 3-wide convolutions + channel attention with identity skip, ``(N, C, 34) -> (N, C, 34)``."""

    def __init__(self, channels: int, version: int):
        super().__init__()
        self.pre_actv = version >= 2
        if self.pre_actv:
            self.res_unit = nn.Sequential(
                _batch_norm(channels, version),
                _activation(version),
                _conv3(channels, channels),
                _batch_norm(channels, version),
                _activation(version),
                _conv3(channels, channels),
            )
        else:
            self.res_unit = nn.Sequential(
                _conv3(channels, channels),
                _batch_norm(channels, version),
                _activation(version),
                _conv3(channels, channels),
                _batch_norm(channels, version),
            )
            self.actv = _activation(version)
        self.ca = ChannelAttention(channels, version)

    def forward(self, x: Tensor) -> Tensor:
        out = self.ca(self.res_unit(x)) + x
        return out if self.pre_actv else self.actv(out)


class ResNet(nn.Module):
    """Stem conv, residual blocks, 32-channel head conv, Linear: ``(N, in_channels, 34)`` -> ``(N, 1024)``."""

    def __init__(self, in_channels: int, conv_channels: int, num_blocks: int, version: int):
        super().__init__()
        blocks = [ResBlock(conv_channels, version) for _ in range(num_blocks)]
        stem = StemConv(in_channels, conv_channels, kernel_size=3, padding=1, bias=False)
        if version >= 2:
            body = [stem, *blocks, _batch_norm(conv_channels, version), _activation(version)]
        else:
            body = [stem, _batch_norm(conv_channels, version), _activation(version), *blocks]
        head = [
            _conv3(conv_channels, 32, bias=True),
            _activation(version),
            nn.Flatten(),
            nn.Linear(32 * _N_TILES, _PHI_DIM),
        ]
        self.net = nn.Sequential(*body, *head)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class Brain(nn.Module):
    """Observation encoder (Mortal's ``Brain``): ``obs (N, C, 34) float32`` (+ ``invisible_obs`` iff ``is_oracle``)
    -> ``phi (N, 1024)`` (versions 2-4) or ``(mu, logsig)`` each ``(N, 512)`` (version 1). ``freeze_bn(True)``
    keeps BatchNorms on their running statistics after ``.train()``."""

    def __init__(self, *, conv_channels: int, num_blocks: int, is_oracle: bool = False, version: int = 1):
        super().__init__()
        version = check_version(version)
        self.is_oracle = is_oracle
        self.version = version
        in_channels = obs_shape(version)[0]
        if is_oracle:
            in_channels += oracle_obs_shape(version)[0]
        self.encoder = ResNet(in_channels, conv_channels, num_blocks, version)
        if version == 1:
            self.latent_net = nn.Sequential(nn.Linear(_PHI_DIM, 512), nn.ReLU(inplace=True))
            self.mu_head = nn.Linear(512, 512)
            self.logsig_head = nn.Linear(512, 512)
        self.actv = _activation(version)
        self._freeze_bn = False

    def forward(self, obs: Tensor, invisible_obs: Tensor | None = None):
        if self.is_oracle:
            if invisible_obs is None:
                raise ValueError("an oracle Brain needs invisible_obs")
            if obs.dtype == torch.uint8:  # packed rows (mortal.features.packed_obs) are public only: unpacked to join
                obs = packed_obs.unpack(obs, self.version)
            obs = torch.cat((obs, invisible_obs), dim=1)
        phi = self.encoder(obs)
        if self.version == 1:
            latent = self.latent_net(phi)
            return self.mu_head(latent), self.logsig_head(latent)
        return self.actv(phi)

    def train(self, mode: bool = True):
        """Set training mode; with frozen BN, BatchNorm layers stay in eval mode."""
        super().train(mode)
        if self._freeze_bn:
            for mod in self.modules():
                if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                    mod.eval()
        return self

    def freeze_bn(self, value: bool):
        """Freeze (True) or release (False) BatchNorm running statistics; returns self."""
        self._freeze_bn = bool(value)
        return self.train(self.training)


class AuxNet(nn.Module):
    """Auxiliary heads: ``phi (N, 1024)`` -> one ``(N, d)`` logits tensor per d in ``dims`` (Mortal: rank, (4,))."""

    def __init__(self, dims=(4,)):
        super().__init__()
        self.dims = tuple(int(d) for d in dims)
        self.net = nn.Linear(_PHI_DIM, sum(self.dims), bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        return self.net(x).split(self.dims, dim=-1)


def _mlp_head(hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(_PHI_DIM, hidden), Mish(inplace=True), nn.Linear(hidden, out))


class DQN(nn.Module):
    """Dueling Q head ``(phi (N, D), mask (N, 46) bool) -> q (N, 46)``, illegal ``-inf``; D 512 at v1, else 1024."""

    def __init__(self, *, version: int = 1):
        super().__init__()
        self.version = check_version(version)
        if self.version == 1:
            self.v_head = nn.Linear(512, 1)
            self.a_head = nn.Linear(512, ACTION_SPACE)
        elif self.version in (2, 3):
            hidden = 512 if self.version == 2 else 256
            self.v_head = _mlp_head(hidden, 1)
            self.a_head = _mlp_head(hidden, ACTION_SPACE)
        else:
            self.net = nn.Linear(_PHI_DIM, 1 + ACTION_SPACE)
            nn.init.zeros_(self.net.bias)

    def forward(self, phi: Tensor, mask: Tensor) -> Tensor:
        if self.version == 4:
            v, a = self.net(phi).split((1, ACTION_SPACE), dim=-1)
        else:
            v, a = self.v_head(phi), self.a_head(phi)
        mask = mask.to(torch.bool)
        n_legal = mask.sum(dim=-1, keepdim=True)
        a_mean = a.masked_fill(~mask, 0.0).sum(dim=-1, keepdim=True) / n_legal
        return (v + a - a_mean).masked_fill(~mask, -torch.inf)


class GRP(nn.Module):
    """Global Reward Predictor (float64): a GRU over each game prefix's kyoku rows ``[grand_kyoku, honba, kyotaku,
    s0..s3 / 10000]`` into an MLP -> logits over the 24 ``itertools.permutations(range(4))`` rank orders."""

    def __init__(self, hidden_size: int = 64, num_layers: int = 2):
        super().__init__()
        self.rnn = nn.GRU(input_size=GRP_SIZE, hidden_size=hidden_size, num_layers=num_layers, batch_first=True)
        width = hidden_size * num_layers
        self.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(inplace=True), nn.Linear(width, 24))
        perms = torch.tensor(list(permutations(range(4))), dtype=torch.int64)
        self.register_buffer("perms", perms)  # (24, 4); both buffers are in Mortal's GRP state dict
        self.register_buffer("perms_t", perms.t().contiguous())  # (4, 24)
        self.double()

    def forward(self, inputs: list[Tensor]) -> Tensor:
        """``inputs``: list of N >= 1 tensors ``(L_i, 7)`` float64, L_i >= 1 -> logits ``(N, 24)`` float64."""
        lengths = torch.tensor([t.shape[0] for t in inputs], dtype=torch.int64)
        padded = pad_sequence(inputs, batch_first=True)
        packed = pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False)
        _, h_n = self.rnn(packed)  # (num_layers, N, hidden)
        return self.fc(h_n.transpose(0, 1).flatten(1))

    def calc_matrix(self, logits: Tensor) -> Tensor:
        """``logits (N, 24)`` -> ``(N, 4, 4)``: [n, p, r] = P(seat p finishes at rank r) (rows, columns sum to 1)."""
        probs = logits.softmax(dim=-1)
        # one_hot[k, p, r] = 1 iff permutation k puts seat p at rank r.
        one_hot = F.one_hot(self.perms, 4).to(probs.dtype)
        return torch.einsum("nk,kpr->npr", probs, one_hot)

    def get_label(self, rank_by_player: Tensor) -> Tensor:
        """``rank_by_player (N, 4)`` integer (0 = first) -> permutation index ``(N,)`` int64; ValueError otherwise."""
        ranks = rank_by_player.to(device=self.perms.device, dtype=torch.int64)
        if ranks.dim() != 2 or ranks.shape[1] != 4:
            raise ValueError(f"rank_by_player must be (N, 4), got {tuple(ranks.shape)}")
        hits = (ranks.unsqueeze(1) == self.perms.unsqueeze(0)).all(dim=-1)  # (N, 24)
        found = hits.any(dim=-1)
        if not bool(found.all()):
            bad = ranks[~found][0].tolist()
            raise ValueError(f"rank_by_player row {bad} is not a permutation of 0-3")
        return hits.to(torch.int64).argmax(dim=-1)
