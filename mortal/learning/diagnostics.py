"""The trainer's instruments (``diag/*``, docs/operations.md): Q's bias against its target and spread per batch,
the greedy policy's drift from the baseline's on a fixed probe set."""

from __future__ import annotations

import contextlib
import logging
import os
from glob import glob

import numpy as np
import torch
from torch import Tensor

from mortal.features.packed_obs import pack, row_bytes, unpack
from mortal.model.checkpoint import atomic_torch_save, load_checkpoint

logger = logging.getLogger('mortal.diagnostics')  # the name before the package split (log format)

BATCH_KEYS = ('q_minus_target', 'q_minus_target_greedy', 'q_gap', 'q_spread', 'taken_greedy')
HISTOGRAM_STRIDE = 128  # Mortal keeps every 128th q value to keep event files small
PROBE_SIZE = 2048  # positions of the policy-drift probe (packed: ~14 KB each at version 3, on disk and in memory)
PROBE_FILES = 16  # the logs a probe is built from
# The probe is measured once at least PROBE_EVERY x its size rows were trained since its last measure (and always at
# the save before a test play, where the guard reads it): one eval forward of its rows against a forward and backward
# (about 2.5 forwards, measured on 2 cores) of 20x as many, about 2% of the training's network time.
PROBE_EVERY = 20


@torch.no_grad()
def batch_q_stats(q_out: Tensor, masks: Tensor, actions: Tensor, q_target: Tensor) -> Tensor:
    """``(2, len(BATCH_KEYS))`` float64 (float32 on mps) sums and counts of one batch for ``diag/*``, on the device;
    gap and spread count rows with 2+ legal actions. ``q_out (B, 46)`` (``-inf`` illegal), ``masks (B, 46)``."""
    q = q_out.float()
    masks = masks.to(torch.bool)
    rows = torch.arange(q.shape[0], device=q.device)
    err = q[rows, actions] - q_target.float()
    greedy = q.argmax(-1) == actions
    legal = masks.sum(-1)
    multi = legal >= 2
    top2 = q.topk(2, dim=-1).values  # a one-action row's second is -inf: left out by multi below
    n = legal.float()
    mean = q.masked_fill(~masks, 0.0).sum(-1) / n
    std = ((q - mean.unsqueeze(-1)).masked_fill(~masks, 0.0).pow(2).sum(-1) / n).sqrt()
    every = torch.ones_like(greedy)
    # masked sums rather than boolean indexing, which waits for the device; in BATCH_KEYS order
    values = torch.stack((err, err, top2[:, 0] - top2[:, 1], std, greedy.float()))
    counted = torch.stack((every, greedy, multi, multi, every))
    acc = torch.float32 if q.device.type == 'mps' else torch.float64  # mps has no float64
    return torch.stack((torch.where(counted, values, 0.0).sum(-1), counted.sum(-1).to(values.dtype))).to(acc)


@contextlib.contextmanager
def eval_mode(*modules):
    """eval() for a measurement, then each module's own training flag back (a Brain keeps frozen BN frozen)."""
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)


def check_probe(data: dict, version: int) -> None:
    """Raise ValueError naming the field unless ``data`` holds a probe of ``version``: ``packed (N, row_bytes)``
    uint8 with N >= 1, ``masks (N, 46)`` bool with a legal action in each row, ``ranks (N,)`` int64 in 0..3."""
    packed, masks, ranks = data.get('packed'), data.get('masks'), data.get('ranks')
    if not isinstance(packed, Tensor) or packed.dtype != torch.uint8 or packed.dim() != 2 \
            or packed.shape[1] != row_bytes(version) or packed.shape[0] == 0:
        raise ValueError(f'packed: expected (N >= 1, {row_bytes(version)}) uint8 rows of version {version}')
    n = packed.shape[0]
    if not isinstance(masks, Tensor) or masks.dtype != torch.bool or tuple(masks.shape) != (n, 46) \
            or not bool(masks.any(-1).all()):
        raise ValueError(f'masks: expected ({n}, 46) bool with a legal action in each row')
    if not isinstance(ranks, Tensor) or ranks.dtype != torch.int64 or tuple(ranks.shape) != (n,) \
            or not bool(((ranks >= 0) & (ranks <= 3)).all()):
        raise ValueError(f'ranks: expected ({n},) int64 in 0..3')


class Probe:
    """Fixed offline positions for policy drift and the next-rank loss: ``packed (N, row_bytes)`` uint8
    observations of ``version`` (``mortal.features.packed_obs``: a ninth of the float rows, bit-exact), ``masks
    (N, 46)`` bool, ``ranks (N,)`` int64, ``baseline_greedy (N,)`` int64 or None."""

    def __init__(self, packed: Tensor, masks: Tensor, ranks: Tensor, version: int):
        self.packed, self.masks, self.ranks, self.version = packed, masks, ranks, version
        self.baseline_greedy = None

    def __len__(self) -> int:
        return self.packed.shape[0]

    def obs(self, start: int = 0, stop: int | None = None, device='cpu') -> Tensor:
        """Rows ``start:stop`` as ``(n, C, 34)`` float32 on ``device``, unpacked there (a ninth of the bytes moved)."""
        return unpack(self.packed[start:stop].to(device), self.version)

    @classmethod
    def load_or_build(cls, probe_file: str, *, version: int, globs, size: int):
        """Load ``probe_file`` or build it (every k-th sample, at most ``size``) from the first ``PROBE_FILES`` logs;
        None (logged) when no log yields a sample. A probe of float rows (written before the rows were packed) is
        packed and written again."""
        if os.path.exists(probe_file):
            try:
                data = load_checkpoint(probe_file)
                if data.get('version') == version:
                    if 'packed' not in data:  # 127 KB a row: pack it once
                        data['packed'] = torch.from_numpy(pack(data.pop('obs').numpy(), version))
                        atomic_torch_save(data, probe_file)
                    check_probe(data, version)
                    return cls(data['packed'], data['masks'], data['ranks'], version)
                logger.info('probe %s is of version %r: rebuilding for version %d', probe_file,
                            data.get('version'), version)
            except Exception as ex:  # a damaged probe is rebuilt, never fatal
                logger.warning('probe %s unreadable (%s): rebuilding', probe_file, ex)
        files = sorted({f for pattern in globs for f in glob(pattern, recursive=True)})[:PROBE_FILES]
        if not files:
            logger.info('no probe: [dataset] globs match no log')
            return None
        from mortal.data.dataloader import FileDatasetsIter
        # it keeps no reward, so the one that needs no GRP
        data = FileDatasetsIter(version, files, None, None, reward='points', file_batch_size=len(files))
        samples = list(data)
        if not samples:
            logger.info('no probe: the %d probe logs yielded no sample', len(files))
            return None
        stride = max(1, -(-len(samples) // size))
        kept = samples[::stride][:size]
        packed = torch.from_numpy(pack(np.stack([s[0] for s in kept]), version))
        masks = torch.stack([torch.from_numpy(s[2]) for s in kept]).to(torch.bool)
        ranks = torch.tensor([int(s[5]) for s in kept], dtype=torch.int64)
        atomic_torch_save({'version': version, 'packed': packed, 'masks': masks, 'ranks': ranks}, probe_file)
        logger.info('probe of %d positions from %d logs written to %s', len(kept), len(files), probe_file)
        return cls(packed, masks, ranks, version)

    @torch.no_grad()
    def _pass(self, brain, dqn, aux_net, device, batch: int = 512):
        """One eval-mode pass: ``(greedy (N,) int64, mean next-rank CE in nats or None without ``aux_net``)``."""
        heads = [m for m in (dqn, aux_net) if m is not None]
        with eval_mode(brain, *heads):
            greedy, total = [], 0.0
            for i in range(0, len(self), batch):
                phi = brain(self.obs(i, i + batch, device))
                greedy.append(dqn(phi, self.masks[i:i + batch].to(device)).argmax(-1).cpu())
                if aux_net is not None:
                    logits, = aux_net(phi)
                    total += torch.nn.functional.cross_entropy(
                        logits.float(), self.ranks[i:i + batch].to(device), reduction='sum').item()
        return torch.cat(greedy), total / len(self) if aux_net is not None else None

    def set_baseline(self, brain, dqn, device) -> None:
        """Record the baseline's greedy actions, which ``measure`` compares against."""
        self.baseline_greedy = self._pass(brain, dqn, None, device)[0]

    def measure(self, brain, dqn, aux_net, device) -> tuple:
        """``(drift, next_rank_loss)``: fraction of positions whose greedy action differs from the baseline's, and
        the mean next-rank CE (nats; None without ``aux_net``), after ``set_baseline``."""
        greedy, loss = self._pass(brain, dqn, aux_net, device)
        return (greedy != self.baseline_greedy).float().mean().item(), loss


def learner_probe(cfg, version: int, state_file: str, device, baseline=None):
    """The online learner's probe (``probe.pth`` beside ``state_file``) with ``baseline``'s greedy actions; None when
    no log yields a sample."""
    from mortal.model.checkpoint import load_model_pair
    probe_file = os.path.join(os.path.dirname(os.path.abspath(state_file)), 'probe.pth')
    probe = Probe.load_or_build(probe_file, version=version, globs=cfg.dataset.globs, size=PROBE_SIZE)
    if probe is None:
        return None
    if baseline is None:
        baseline = (m.to(device) for m in load_model_pair(cfg.baseline.train.state_file)[:2])
    probe.set_baseline(*baseline, device)
    return probe


class Instruments:
    """The learner's instruments over one ``save_every`` window, written at each save (the probe's less often:
    ``PROBE_EVERY``); ``last``: the ``diag/*`` values of the last write (the guards read them)."""

    def __init__(self, *, save_every: int, batch_size: int, device, probe: Probe | None = None):
        self.window = None  # the sum of batch_q_stats since the last write, on the device
        self.probe = probe
        self.last = {}
        self.q = torch.zeros((save_every, batch_size), device=device)
        self.q_target = torch.zeros((save_every, batch_size), device=device)
        self.batches = 0  # of this window
        self.rows = 0  # rows trained (online and offline) since the probe's last measure

    @torch.no_grad()
    def add(self, q_stats: Tensor, q: Tensor, q_target: Tensor, rows: int) -> None:
        """One batch of ``rows`` rows: ``batch_q_stats`` of its online rows, ``q (n,)`` and ``q_target (n,)`` of their
        taken actions."""
        self.rows += rows
        self.window = q_stats.clone() if self.window is None else self.window.add_(q_stats)
        slot = self.batches % self.q.shape[0]
        n = q.shape[0]
        self.q[slot, :n] = q.float()
        self.q_target[slot, :n] = q_target
        self.batches += 1

    def write(self, writer, steps: int, *, trained: tuple, device, test_play: bool = False) -> None:
        """Write the window at ``steps`` and start a new one; ``trained``: (brain, dqn, aux_net). The probe is
        measured before a test play (``test_play``) or once ``PROBE_EVERY`` x its size rows were trained."""
        writer.add_histogram('q_predicted', self.q.cpu().numpy().flatten()[::HISTOGRAM_STRIDE], steps)
        writer.add_histogram('q_target', self.q_target.cpu().numpy().flatten()[::HISTOGRAM_STRIDE], steps)
        self.batches = 0
        # the means of the keys that saw at least one row
        self.last = {} if self.window is None else {
            k: s / c for k, s, c in zip(BATCH_KEYS, *self.window.tolist()) if c}
        for key, value in self.last.items():
            writer.add_scalar(f'diag/{key}', value, steps)
        self.window = None
        if self.probe is not None and (test_play or self.rows >= PROBE_EVERY * len(self.probe)):
            self.rows = 0
            drift, loss = self.probe.measure(*trained, device)
            self.last['policy_drift'] = drift
            writer.add_scalar('diag/policy_drift', drift, steps)
            writer.add_scalar('diag/next_rank_loss_probe', loss, steps)
