"""Offline training under ``torchrun`` (DDP): each rank trains a strided slice of rank 0's file index; ranks stop
together (``lockstep``); BatchNorm statistics, saving and test play are rank 0's. Without torchrun: ``SINGLE``."""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import timedelta
from typing import Iterable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)

# A rank's wait in a collective; long enough for rank 0's test play, during which the others wait.
TIMEOUT = timedelta(hours=1)


def world_size(env: Mapping[str, str] = os.environ) -> int:
    """``WORLD_SIZE`` of ``env`` (torchrun sets it), 1 when unset. Raises ValueError when it is not an integer >= 1."""
    raw = env.get('WORLD_SIZE', '').strip()
    if not raw:
        return 1
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f'WORLD_SIZE={raw!r} is not a number of processes (an integer >= 1)')
    return size


def shard_files(files: list, rank: int, size: int) -> list:
    """``files[rank::size]``: shards differ by at most one file. Raises ValueError for fewer files than ranks."""
    if len(files) < size:
        raise ValueError(f'{len(files)} log files cannot be shared by {size} training processes: '
                         f'each needs at least one')
    return list(files[rank::size])


def lockstep(batches: Iterable, all_have) -> Iterator:
    """The items of ``batches`` while every rank has one; ``all_have(mine) -> bool``: a collective, once per step
    (and once more with False when this rank runs out)."""
    it = iter(batches)
    while True:
        batch = next(it, None)
        if not all_have(batch is not None):
            if batch is not None:
                logger.info('another process ran out of batches: stopping with this one\'s left untrained')
            return
        yield batch


class NullWriter:
    """A SummaryWriter that writes nothing (ranks other than 0)."""

    def __getattr__(self, name):
        if name.startswith(('add_', 'flush', 'close')):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


class Distributed:
    """This process's rank of ``size`` in the process group :func:`setup` joined; ``device_type`` 'cuda' or 'cpu'.
    ``SINGLE`` is the one process without torchrun: there every method leaves things as they are."""

    def __init__(self, rank: int, size: int, local_rank: int, device_type: str):
        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.is_main = rank == 0
        # where the collectives' tensors live: nccl needs this rank's GPU
        self.dev = torch.device('cuda', local_rank) if device_type == 'cuda' else torch.device('cpu')

    def device(self, name: str) -> torch.device:
        """``cuda:LOCAL_RANK`` when ranks share ``name``, a cuda device (each rank its own GPU), else ``name``."""
        dev = torch.device(name)
        return torch.device('cuda', self.local_rank) if self.size > 1 and dev.type == 'cuda' else dev

    def writer(self, log_dir: str):
        """A SummaryWriter of ``log_dir``; a NullWriter on ranks other than 0."""
        if not self.is_main:
            return NullWriter()
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter(log_dir)

    def wrap(self, models: tuple) -> tuple:
        """DDP of each of ``models`` (on this rank's device, loaded); rank 0's parameters are copied to all."""
        if self.size == 1:
            return tuple(models)
        ids = [self.local_rank] if self.dev.type == 'cuda' else None
        return tuple(DDP(m, device_ids=ids) for m in models)  # buffers: sent from rank 0 before each forward

    def no_sync(self, wrapped: tuple, sync: bool):
        """Around one forward + backward: with ``sync`` False the gradients stay local (DDP's ``no_sync``)."""
        stack = contextlib.ExitStack()
        if not sync and self.size > 1:
            for m in wrapped:
                stack.enter_context(m.no_sync())
        return stack

    def from_main(self, make):
        """``make()`` on rank 0, sent to every rank (a picklable value)."""
        if self.size == 1:
            return make()
        box = [make() if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self.dev if self.dev.type == 'cuda' else None)
        return box[0]

    def _all_have(self, mine: bool) -> bool:
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=self.dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def batches(self, batches: Iterable) -> Iterable:
        """:func:`lockstep` of ``batches`` over the ranks."""
        return batches if self.size == 1 else lockstep(batches, self._all_have)

    def average(self, values: dict) -> dict:
        """The dict of floats ``values`` averaged over the ranks (same keys on every rank, a collective)."""
        if self.size == 1:
            return values
        keys = list(values)  # the same order on every rank: the trainer's dicts are built alike
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.dev)
        dist.all_reduce(t)
        return {k: v / self.size for k, v in zip(keys, t.tolist())}

    def sync_buffers(self, models) -> None:
        """Copy rank 0's buffers (BatchNorm statistics) of each of ``models`` (the bare modules) to every rank."""
        for m in models if self.size > 1 else ():
            for buf in m.buffers():
                dist.broadcast(buf, src=0)

    def close(self) -> None:
        """Leave the process group."""
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()


SINGLE = Distributed(0, 1, 0, 'cpu')


def setup(device: str, env: Mapping[str, str] = os.environ, *, timeout: timedelta = TIMEOUT) -> Distributed:
    """``SINGLE`` without torchrun; else join the process group (nccl for cuda, else gloo) as ``Distributed``.
    Raises ValueError for a bad ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``, or what ``init_process_group`` raises."""
    size = world_size(env)
    if size == 1:
        return SINGLE
    try:
        rank, local_rank = int(env.get('RANK', '')), int(env.get('LOCAL_RANK', env.get('RANK', '')))
    except ValueError:
        raise ValueError(f"WORLD_SIZE={size} needs RANK and LOCAL_RANK (start the trainer with torchrun)") from None
    if not 0 <= rank < size:
        raise ValueError(f'RANK={rank} is outside 0..{size - 1}')
    device_type = torch.device(device).type
    backend = 'gloo'
    if device_type == 'cuda':
        torch.cuda.set_device(local_rank)
        backend = 'nccl'
    dist.init_process_group(backend, rank=rank, world_size=size, timeout=timeout)
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    logger.info('distributed training: %d processes (%s)', size, backend)
    return Distributed(rank, size, local_rank, device_type)
