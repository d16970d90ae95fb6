"""Packed observations, ``(C, 34)`` float32 at about a tenth of the size: the rows ``REAL_ROWS[version]``
as float32, then one bit per element (nonzero; row-major, little bit order), padded to 4 bytes; bit-exact."""

from __future__ import annotations

import functools

import numpy as np

from mortal.features.obs import check_version, obs_shape
from mortal.features.sp.calc import _core

_pack_obs = getattr(_core, "pack_obs", None)  # None: the optional compiled core is not built

#: True when ``pack_into`` runs in the compiled core.
HAVE_FAST_PACK = _pack_obs is not None


def _rows(*spans) -> tuple:  # (first, last) or single rows
    return tuple(r for s in spans for r in (range(s[0], s[1] + 1) if isinstance(s, tuple) else [s]))


#: Rows that may hold values other than 0.0/1.0, per version (0-based), found by encoding every decision of
#: tests/data at each version (``obs_v4.ROW_TABLE`` names them); ``pack_into`` refuses a non-0/1 value elsewhere.
REAL_ROWS = {
    1: _rows((7, 10), 720),
    2: _rows((7, 46), (55, 58), 61, (759, 775), 888),
    3: _rows((7, 46), (55, 58), 61, 165, (358, 360), (553, 555), (748, 767), 880),
    4: _rows((7, 14), (23, 24), 27, 131, (324, 326), (519, 521), (714, 722), 835, (889, 890), (961, 1011)),
}

_ONE_BITS = np.uint32(0x3F800000)  # float32 1.0


class NotPackableError(ValueError):
    """An observation with a value other than 0.0/1.0 outside ``REAL_ROWS``; ``row``, ``col``, ``value``."""

    def __init__(self, version: int, row: int, col: int, value: float):
        self.row, self.col, self.value = row, col, value
        super().__init__(f"feature version {version}: row {row} column {col} holds {value!r}, but the packed "
                         f"format keeps only 0.0/1.0 outside mortal.features.packed_obs.REAL_ROWS")


class Layout:
    """The packed format of one version: ``channels``, ``real_rows``, ``real_index`` (per channel its row among
    ``real_rows`` or -1, int32), ``real_bytes``, ``bit_bytes``, ``row_bytes``."""

    def __init__(self, version: int):
        self.version = check_version(version)
        self.channels = obs_shape(version)[0]
        self.real_rows = np.asarray(REAL_ROWS[version], dtype=np.int64)
        self.elements = self.channels * 34
        self.real_bytes = len(self.real_rows) * 34 * 4
        self.bit_bytes = (self.elements + 7) // 8
        self.row_bytes = self.real_bytes + (self.bit_bytes + 3) // 4 * 4
        # per channel: its row in the real section (0, 1, ... in channel order), -1 for a 0/1 row (the stem's kernel)
        self.real_index = np.full(self.channels, -1, dtype=np.int32)
        self.real_index[self.real_rows] = np.arange(len(self.real_rows), dtype=np.int32)
        flags = np.zeros(self.channels, dtype=np.bool_)
        flags[self.real_rows] = True
        self.real_flags = flags.astype(np.uint8).tobytes()
        self.binary = np.repeat(~flags, 34)  # per element: must be 0/1
        self.binary_mask = np.packbits(self.binary, bitorder="little").tobytes()
        self._torch = {}

    def torch_consts(self, device):
        """(real row indices, ``(256, 8)`` float32 table of each byte's bits, little order) on ``device`` (cached)."""
        import torch
        key = str(device)
        if key not in self._torch:
            bits = (torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1
            self._torch[key] = (torch.as_tensor(self.real_rows, device=device),
                                bits.to(device=device, dtype=torch.float32))
        return self._torch[key]


@functools.lru_cache(maxsize=None)
def layout(version: int) -> Layout:
    """The ``Layout`` of feature ``version`` (1-4; ``UnsupportedVersionError`` otherwise)."""
    return Layout(version)


def row_bytes(version: int) -> int:
    """Bytes of one packed observation of ``version`` (see the module docstring)."""
    return layout(version).row_bytes


def _refuse(lay: Layout, obs: np.ndarray, flat: int):
    row, col = divmod(int(flat), 34)
    raise NotPackableError(lay.version, row, col, float(obs[row, col]))


def pack_into(obs: np.ndarray, out: np.ndarray, index: int, version: int) -> None:
    """Pack ``obs`` (``(C, 34)`` float32, C-contiguous) into row ``index`` of ``out`` (``(N, row_bytes)``
    uint8). Raises ``NotPackableError`` (row left partly written) or ValueError (shape, dtype, index)."""
    lay = layout(version)
    if obs.dtype != np.float32 or obs.shape != (lay.channels, 34) or not obs.flags.c_contiguous:
        raise ValueError(f"pack_into: expected a C-contiguous ({lay.channels}, 34) float32 array, "
                         f"got {obs.dtype} {obs.shape}")
    if _pack_obs is not None:
        bad = _pack_obs(obs, lay.real_flags, lay.binary_mask, out, index)
        if bad >= 0:
            _refuse(lay, obs, bad)
        return
    if out.dtype != np.uint8 or out.ndim != 2 or out.shape[1] != lay.row_bytes or not 0 <= index < out.shape[0]:
        raise ValueError(f"pack_into: row {index} does not fit an output of {out.dtype} {out.shape}")
    u = obs.view(np.uint32).reshape(-1)
    nonzero = u != 0
    bad = nonzero & (u != _ONE_BITS) & lay.binary
    if bad.any():
        _refuse(lay, obs, np.flatnonzero(bad)[0])
    row = out[index]
    row[:lay.real_bytes] = obs[lay.real_rows].view(np.uint8).reshape(-1)
    row[lay.real_bytes:lay.real_bytes + lay.bit_bytes] = np.packbits(nonzero, bitorder="little")
    row[lay.real_bytes + lay.bit_bytes:] = 0


def packer(version: int):
    """``pack_into`` bound to ``version``: ``packer(v)(obs, out, index)``, fewer checks per call."""
    lay = layout(version)
    if _pack_obs is None:
        return functools.partial(pack_into, version=version)
    fast, flags, mask, f32 = _pack_obs, lay.real_flags, lay.binary_mask, np.dtype(np.float32)

    def pack_fast(obs, out, index):
        if obs.dtype != f32 or not obs.flags.c_contiguous:
            raise ValueError(f"pack_into: expected a C-contiguous float32 array, got {obs.dtype}")
        bad = fast(obs, flags, mask, out, index)
        if bad >= 0:
            _refuse(lay, obs, bad)
    return pack_fast


def pack(obs: np.ndarray, version: int) -> np.ndarray:
    """``(N, C, 34)`` float32 -> ``(N, row_bytes(version))`` uint8 (``pack_into`` per row; raises as it does)."""
    obs = np.ascontiguousarray(obs, dtype=np.float32)
    out = np.empty((obs.shape[0], row_bytes(version)), dtype=np.uint8)
    for i in range(obs.shape[0]):
        pack_into(obs[i], out, i, version)
    return out


def unpack(packed, version: int):
    """``(B, C, 34)`` float32 of ``packed`` ``(B, row_bytes)`` uint8 rows (numpy or torch, same device), bit-exact."""
    import torch
    lay = layout(version)
    as_numpy = isinstance(packed, np.ndarray)
    x = torch.from_numpy(packed) if as_numpy else packed
    if x.dtype != torch.uint8 or x.dim() != 2 or x.shape[1] != lay.row_bytes:
        raise ValueError(f"unpack: expected (B, {lay.row_bytes}) uint8 rows of version {version}, "
                         f"got {x.dtype} {tuple(x.shape)}")
    if x.shape[0] == 0:  # torch cannot view 0 rows as floats (a 0 stride) nor infer their -1 width
        obs = torch.zeros((0, lay.channels, 34), dtype=torch.float32, device=x.device)
        return obs.numpy() if as_numpy else obs
    x = x.contiguous()
    rows, table = lay.torch_consts(x.device)
    b = x.shape[0]
    real = x[:, :lay.real_bytes].view(torch.float32).view(b, len(lay.real_rows), 34)
    bits = x[:, lay.real_bytes:lay.real_bytes + lay.bit_bytes]
    if x.device.type == 'cpu':  # numpy's unpackbits and one conversion: 5x the table lookup below on the CPU
        flat = np.unpackbits(bits.numpy(), axis=1, count=lay.elements, bitorder='little')
        obs = torch.from_numpy(flat).view(b, lay.channels, 34).to(torch.float32)
    else:  # each byte looked up as its 8 floats: one pass on the device
        flat = torch.nn.functional.embedding(bits.to(torch.int32), table).view(b, -1)[:, :lay.elements]
        obs = flat.contiguous().view(b, lay.channels, 34)
    obs.index_copy_(1, rows, real)
    return obs.numpy() if as_numpy else obs
