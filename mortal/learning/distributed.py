"""Offline training on several processes (``torchrun``, DistributedDataParallel) for ``mortal.train``.

``python mortal/train.py`` run by ``torchrun --nproc_per_node K`` finds torchrun's environment (``WORLD_SIZE``,
``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``); :func:`setup` then joins the process group (gloo on
CPU, nccl when ``[control] device`` is cuda, each rank on ``cuda:LOCAL_RANK``) and returns a :class:`Distributed`.
Without that environment, or with ``WORLD_SIZE=1``, it returns :data:`SINGLE`, which changes nothing: no process
group, the bare models, the same results as before.

What K ranks do (the trainer asks its ``dist`` at each of these points):

* the file list: rank 0 builds (or loads) ``[dataset] file_index`` and sends it to the others
  (:meth:`Distributed.from_main`); each rank trains on its own strided slice of it (:func:`shard_files`);
* gradients: the three models are wrapped in ``DistributedDataParallel`` (:meth:`Distributed.wrap`), so each
  backward pass averages the gradients over the ranks (the global batch is K x ``batch_size``); on the micro-steps
  of gradient accumulation the averaging is deferred to the step that updates (:meth:`Distributed.no_sync`);
  clipping and the GradScaler then see the same averaged gradients on every rank;
* the end of an epoch: ranks hold different numbers of batches; every step all ranks agree whether each still has
  one (:func:`lockstep`), and all stop at the first step where one has none, so none waits in a collective that
  the others never join;
* BatchNorm: DDP sends rank 0's running statistics to the others before each forward pass (``broadcast_buffers``),
  so the statistics saved are rank 0's; :meth:`Distributed.sync_buffers` copies them to all ranks at the end;
* saving, TensorBoard, progress lines and test play happen on rank 0 only; the loss sums that TensorBoard shows are
  averaged over the ranks first (:meth:`Distributed.average`). The other ranks log warnings and errors only.

Online training stays one learner (as Mortal): ``mortal.train`` refuses ``online = true`` under torchrun
(:func:`requested`). A rank that dies makes torchrun stop the others; without torchrun, a collective gives up after
:data:`TIMEOUT` (long enough for rank 0's test play, during which the others wait).
"""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import timedelta
from typing import Iterable, Iterator, Mapping

import torch

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)

# How long a rank waits in a collective (and at the start for the others) before it gives up: the other ranks wait
# in one while rank 0 test-plays.
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


def requested(env: Mapping[str, str] = os.environ) -> bool:
    """Whether ``env`` asks for more than one process (``WORLD_SIZE`` > 1). Raises ValueError as :func:`world_size`."""
    return world_size(env) > 1


def shard_files(files: list, rank: int, size: int) -> list:
    """The files of rank ``rank`` of ``size``: every ``size``-th one from position ``rank`` (``files[rank::size]``),
    so that shards differ by at most one file and each takes a share of every part of the (sorted) list.

    Raises ValueError when there are fewer files than ranks (a rank would have nothing to train on)."""
    if len(files) < size:
        raise ValueError(f'{len(files)} log files cannot be shared by {size} training processes: '
                         f'each needs at least one')
    return list(files[rank::size])


def lockstep(batches: Iterable, all_have) -> Iterator:
    """The items of ``batches`` for as long as every rank has one: before each, ``all_have(mine: bool) -> bool``
    says whether all ranks have one (a collective, so it is called exactly once per step on every rank, and once
    more, with False, when this rank runs out). Stops at the first step where any rank has none."""
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


class Single:
    """One process (no torchrun): every method leaves things as they are. ``rank`` 0, ``size`` 1."""

    rank = 0
    size = 1
    is_main = True

    def device(self, name: str) -> torch.device:
        """The training device: ``torch.device(name)`` (``[control] device``)."""
        return torch.device(name)

    def writer(self, log_dir: str):
        """A ``SummaryWriter`` of ``log_dir`` (``[control] tensorboard_dir``); a :class:`NullWriter` on ranks other
        than 0."""
        if not self.is_main:
            return NullWriter()
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter(log_dir)

    def wrap(self, models: tuple) -> tuple:
        """The modules that train: ``models`` themselves."""
        return tuple(models)

    def no_sync(self, wrapped: tuple, sync: bool):
        """A context for one forward + backward pass; nothing to defer here."""
        return contextlib.nullcontext()

    def from_main(self, make):
        """``make()``."""
        return make()

    def shard(self, files: list) -> list:
        """All of ``files``."""
        return files

    def batches(self, batches: Iterable) -> Iterable:
        """``batches`` as they are."""
        return batches

    def average(self, values: dict) -> dict:
        """``values`` as they are."""
        return values

    def sync_buffers(self, models) -> None:
        """Nothing to copy."""

    def close(self) -> None:
        """Nothing to leave."""


SINGLE = Single()


class Distributed(Single):
    """One rank of ``size`` in a joined process group (made by :func:`setup`); ``device_type`` 'cuda' or 'cpu'."""

    def __init__(self, rank: int, size: int, local_rank: int, device_type: str):
        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.is_main = rank == 0
        self.device_type = device_type

    def device(self, name: str) -> torch.device:
        """``cuda:LOCAL_RANK`` when ``name`` is a cuda device (each rank its own GPU), else ``torch.device(name)``."""
        dev = torch.device(name)
        return torch.device('cuda', self.local_rank) if dev.type == 'cuda' else dev

    def _dev(self) -> torch.device:
        return torch.device('cuda', self.local_rank) if self.device_type == 'cuda' else torch.device('cpu')

    def wrap(self, models: tuple) -> tuple:
        """``DistributedDataParallel`` of each of ``models`` (already on this rank's device, checkpoint loaded):
        rank 0's parameters and buffers are copied to all ranks here."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        ids = [self.local_rank] if self.device_type == 'cuda' else None
        return tuple(DDP(m, device_ids=ids) for m in models)  # buffers: sent from rank 0 before each forward

    def no_sync(self, wrapped: tuple, sync: bool):
        """Around one forward + backward pass: when ``sync`` is False (an accumulation micro-step), the gradients
        stay local and are averaged with the next synced pass's (DDP's ``no_sync``)."""
        stack = contextlib.ExitStack()
        if not sync:
            for m in wrapped:
                stack.enter_context(m.no_sync())
        return stack

    def from_main(self, make):
        """``make()`` on rank 0, sent to every rank (a picklable value)."""
        import torch.distributed as dist
        box = [make() if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._dev() if self.device_type == 'cuda' else None)
        return box[0]

    def shard(self, files: list) -> list:
        """This rank's :func:`shard_files` of ``files``."""
        return shard_files(files, self.rank, self.size)

    def _all_have(self, mine: bool) -> bool:
        import torch.distributed as dist
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=self._dev())
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def batches(self, batches: Iterable) -> Iterator:
        """:func:`lockstep` of ``batches`` over the ranks."""
        return lockstep(batches, self._all_have)

    def average(self, values: dict) -> dict:
        """The dict of floats ``values`` averaged over the ranks (same keys on every rank, a collective)."""
        import torch.distributed as dist
        keys = list(values)  # the same order on every rank: the trainer's dicts are built alike
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self._dev())
        dist.all_reduce(t)
        return {k: v / self.size for k, v in zip(keys, t.tolist())}

    def sync_buffers(self, models) -> None:
        """Copy rank 0's buffers (BatchNorm statistics) of each of ``models`` (the bare modules) to every rank."""
        import torch.distributed as dist
        for m in models:
            for buf in m.buffers():
                dist.broadcast(buf, src=0)

    def close(self) -> None:
        """Leave the process group."""
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def setup(device: str, env: Mapping[str, str] = os.environ, *, timeout: timedelta = TIMEOUT) -> Single:
    """:data:`SINGLE` without torchrun (``WORLD_SIZE`` unset or 1); else join the process group of ``env``
    (``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) with nccl when ``device`` (``[control] device``)
    is cuda (and make ``cuda:LOCAL_RANK`` this process's device), gloo otherwise, and return its
    :class:`Distributed`. Ranks other than 0 log warnings and errors only from here on.

    Raises ValueError for a bad ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``; what ``init_process_group`` raises, e.g.
    when the other ranks do not come within ``timeout``."""
    size = world_size(env)
    if size == 1:
        return SINGLE
    try:
        rank, local_rank = int(env.get('RANK', '')), int(env.get('LOCAL_RANK', env.get('RANK', '')))
    except ValueError:
        raise ValueError(f"WORLD_SIZE={size} needs RANK and LOCAL_RANK (start the trainer with torchrun)") from None
    if not 0 <= rank < size:
        raise ValueError(f'RANK={rank} is outside 0..{size - 1}')
    import torch.distributed as dist
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
