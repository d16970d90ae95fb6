"""Training samples from mjai logs (Mortal's ``dataloader.py``): ``(obs (C, 34) float32, action int64, mask (46,)
bool, steps_to_done int64, kyoku_reward float64 pts, player_rank int64, cf_action int64 (-1: none), cf_delta
float32)``; in batch mode ``obs`` is packed ``(B, row_bytes)`` uint8. Workers start from a forkserver."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import random
import sys
import threading

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from mortal.config import Config, typed
from mortal.entry import LOG_FORMAT
from mortal.data.gameplay import GameplayLoader
from mortal.data.mjai_log import DEFAULT_MAX_LOG_BYTES
from mortal.features.packed_obs import unpack
from mortal.util.lifetime import die_with_parent
from mortal.data.reward import RewardCalculator, load_grp

logger = logging.getLogger('mortal.dataloader')  # the name before the package split (log format)


def _game_columns(game, reward_calc: RewardCalculator) -> tuple | None:
    """One seat's ``Gameplay`` as sample columns (obs packed), None when the seat had no decision."""
    n = len(game)
    if n == 0:
        return None
    obs = game.take("packed_obs")
    actions = game.take("actions")
    masks = game.take("masks")
    at_kyoku = game.take("at_kyoku").astype(np.int64)
    dones = game.take("dones")
    apply_gamma = game.take("apply_gamma")
    grp = game.grp
    player_id = game.player_id
    cf_actions = game.take("cf_actions")
    cf_records = game.take("cf_records")

    feature = grp.take_feature()
    rewards = reward_calc.kyoku_rewards(player_id, feature, grp.take_rank_by_player(), grp.take_final_scores())
    if len(rewards) < at_kyoku[-1] + 1:
        raise AssertionError(f"{len(rewards)} kyoku rewards but a sample at kyoku {at_kyoku[-1]}")

    scores_seq = np.concatenate((np.rint(feature[:, 3:] * 1e4), [grp.take_final_scores()]))
    # the seat's rank before each kyoku and at the end; stable, so ties go to the lower seat
    player_ranks = (-scores_seq).argsort(-1, kind="stable").argsort(-1, kind="stable")[:, player_id].astype(np.int64)

    steps_to_done = np.zeros(n, dtype=np.int64)
    for i in range(n - 2, -1, -1):
        if not dones[i]:
            steps_to_done[i] = steps_to_done[i + 1] + int(apply_gamma[i])

    # a counterfactual branch's kyoku outcome minus the real one, 0 without a branch
    cf_deltas = np.zeros(n, dtype=np.float32)
    has = np.flatnonzero(cf_actions >= 0)
    if len(has):
        cf_deltas[has] = reward_calc.counterfactual_deltas(
            player_id, feature, grp.take_rank_by_player(), grp.take_final_scores(), at_kyoku[has],
            [cf_records[i] for i in has])
    return obs, actions, masks, steps_to_done, rewards[at_kyoku], player_ranks[at_kyoku + 1], cf_actions, cf_deltas


class FileDatasetsIter(IterableDataset):
    """Samples from gzip (or plain) mjai logs (the module docstring gives the tuple).

    ``file_list`` is shuffled in place each epoch; ``sample_ids`` adds ``[file, pass, index, count]`` int64;
    ``trained`` (``{path: {pass: indices or None}}``) is left out; ``batch_size`` B yields B-row numpy batches.
    Bad files are skipped with a warning and counted in ``skipped``."""

    def __init__(self, version, file_list, pts, grp, *, file_batch_size=20, reserve_ratio=0,
                 player_names=None, num_epochs=1, enable_augmentation=False, augmented_first=False,
                 max_log_bytes=DEFAULT_MAX_LOG_BYTES, sample_ids=False, trained=None, batch_size=None, reward="grp"):
        super().__init__()
        self.reward = reward
        self.version = version
        self.batch_size = None if batch_size is None else int(batch_size)
        self.buffer = None
        self.file_list = list(file_list)
        self.files = tuple(self.file_list)  # the order sample_ids refer to (file_list is sharded and shuffled)
        self._file_ids = {p: i for i, p in reversed(list(enumerate(self.files)))} if sample_ids else None
        self.trained = {p: {int(k): None if v is None else frozenset(v) for k, v in passes.items()}
                        for p, passes in (trained or {}).items()}
        self._pass = 0
        self.pts = pts
        self.grp = grp
        self.file_batch_size = max(1, int(file_batch_size))
        self.reserve_ratio = reserve_ratio
        self.loader_options = dict(player_names=player_names, max_log_bytes=max_log_bytes)  # GameplayLoader's
        self.num_epochs = num_epochs
        self.enable_augmentation = enable_augmentation
        self.augmented_first = augmented_first
        self.skipped = 0
        self.iterator = None
        self._sharded = False

    def shard(self, worker_id: int, num_workers: int) -> None:
        """Keep only this worker's contiguous slice of ``file_list`` (idempotent)."""
        if self._sharded or num_workers <= 1:
            self._sharded = True
            return
        per_worker = math.ceil(len(self.file_list) / num_workers)
        start = worker_id * per_worker
        self.file_list = self.file_list[start:start + per_worker]
        self._sharded = True

    def build_iter(self):
        info = torch.utils.data.get_worker_info()
        if info is not None:
            self.shard(info.id, info.num_workers)
        self.reward_calc = RewardCalculator(self.grp, self.pts, reward=self.reward)
        self._pending, self._pending_rows = [], 0
        flags = [self.augmented_first] + ([not self.augmented_first] if self.enable_augmentation else [])
        for epoch in range(self.num_epochs):
            for i, augmented in enumerate(flags):
                self._pass = epoch * len(flags) + i
                yield from self.load_files(augmented)
        if self.batch_size is not None and self._pending_rows:
            yield self._take_batch(self._pending_rows)  # the last, short batch (as a DataLoader's)

    def _buffer_len(self) -> int:
        return 0 if self.buffer is None else len(self.buffer[1])

    @staticmethod
    def _shuffled(size: int) -> np.ndarray:
        # random.shuffle of a list of indices draws exactly what random.shuffle of the samples themselves drew
        # (the draws depend only on the length), so the order is the one of a list-of-tuples buffer.
        perm = list(range(size))
        random.shuffle(perm)
        return np.asarray(perm, dtype=np.intp)

    def load_files(self, augmented: bool):
        """One pass over ``file_list`` (shuffled), yielding samples (or batches) through the shuffle buffer."""
        random.shuffle(self.file_list)
        self.loader = GameplayLoader(self.version, augmented=augmented, **self.loader_options)
        # A tuple of sample columns (None when empty): no per-sample object until a sample or batch is handed out.
        self.buffer = None
        files = [p for p in self.file_list if self.trained.get(p, {}).get(self._pass, ()) is not None]
        for start in range(0, len(files), self.file_batch_size):
            old_size = self._buffer_len()
            self.populate_buffer(files[start:start + self.file_batch_size])
            size = self._buffer_len()
            reserved = int((size - old_size) * self.reserve_ratio)
            if reserved > size:
                continue
            perm = self._shuffled(size)
            yield from self._emit(self.buffer, perm[reserved:])
            self.buffer = None if reserved == 0 else tuple(c[perm[:reserved]] for c in self.buffer)
        yield from self._emit(self.buffer, self._shuffled(self._buffer_len()))
        self.buffer = None
        self.skipped += self.loader.skipped
        if self.loader.skipped:
            logger.warning("pass over %d files (augmented=%s): %d skipped as bad input",
                           len(files), augmented, self.loader.skipped)

    def _emit(self, cols, idx):
        """The rows ``idx`` of ``cols``: one sample tuple each, or the full batches they complete."""
        if not len(idx):
            return
        if self.batch_size is None:
            for i in idx:
                yield tuple(unpack(c[i:i + 1], self.version)[0] if k == 0 else c[i] for k, c in enumerate(cols))
            return
        self._pending.append((cols, idx))
        self._pending_rows += len(idx)
        while self._pending_rows >= self.batch_size:
            yield self._take_batch(self.batch_size)

    def _take_batch(self, size: int) -> tuple:
        # Each column is filled by np.take straight from the buffer's rows into its view of one storage.
        first = self._pending[0][0]
        batch = one_storage_columns([((size, *c.shape[1:]), c.dtype) for c in first])
        out = tuple(t.numpy() for t in batch)
        pos = 0
        while pos < size:
            cols, idx = self._pending[0]
            k = min(size - pos, len(idx))
            for o, c in zip(out, cols):
                np.take(c, idx[:k], axis=0, out=o[pos:pos + k])
            pos += k
            if k == len(idx):
                self._pending.pop(0)
            else:
                self._pending[0] = (cols, idx[k:])
        self._pending_rows -= size
        return batch

    def populate_buffer(self, file_list) -> None:
        """Append every sample of every kept seat of ``file_list`` to ``self.buffer`` (a bad file: none, counted)."""
        chunks = [] if self.buffer is None else [self.buffer]
        for path, games in zip(file_list, self.loader.load_gz_log_files(file_list)):
            try:
                parts = [c for c in (_game_columns(game, self.reward_calc) for game in games) if c is not None]
            except (ValueError, IndexError, AssertionError) as e:
                # parse_log already rejects what could cause this; kept so one bad file never ends a training run
                logger.warning("skipped log %s: %s: %s", path, type(e).__name__, e)
                self.loader.skipped += 1
                continue
            if not parts:
                continue
            cols = parts[0] if len(parts) == 1 else tuple(np.concatenate(c) for c in zip(*parts))
            if self._file_ids is not None or path in self.trained:
                cols = self._tag_and_filter(path, cols)
            chunks.append(cols)
        if chunks:
            self.buffer = chunks[0] if len(chunks) == 1 else tuple(np.concatenate(c) for c in zip(*chunks))

    def _tag_and_filter(self, path, cols) -> tuple:
        # Indices are taken before filtering so that they stay the same on every re-read of the file.
        done = self.trained.get(path, {}).get(self._pass) or ()
        count = len(cols[1])
        if self._file_ids is not None:
            ids = np.empty((count, 4), dtype=np.int64)
            ids[:, 0], ids[:, 1], ids[:, 2], ids[:, 3] = self._file_ids[path], self._pass, np.arange(count), count
            cols = (*cols, ids)
        if done:
            keep = np.ones(count, dtype=np.bool_)
            trained = np.fromiter((j for j in done if 0 <= j < count), dtype=np.intp)
            keep[trained] = False
            cols = tuple(c[keep] for c in cols)
        return cols

    def __iter__(self):
        if self.iterator is None:
            self.iterator = self.build_iter()
        return self.iterator


def one_storage_columns(columns) -> tuple:
    """Empty tensors of ``columns`` (``[(shape, numpy dtype)]``), each a view of one byte storage at an 8-byte aligned
    offset. A batch handed from a loader worker to the learner then travels as one shared-memory segment: torch
    passes each storage's file descriptor through a handshake of its own, 8 of them a batch when each column had its
    own (the hand-over alone: 2.1-2.9 -> 0.5-0.6 ms of the learner's CPU a batch; docs/performance.md, session 24)."""
    spans, total = [], 0
    for shape, dtype in columns:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        spans.append((total, nbytes, shape, torch.from_numpy(np.empty(0, dtype)).dtype))
        total += -(-nbytes // 8) * 8
    raw = torch.empty(total, dtype=torch.uint8)
    return tuple(raw[start:start + nbytes].view(dtype).view(shape) for start, nbytes, shape, dtype in spans)


def keep_freed_memory() -> bool:
    """Ask glibc malloc to keep freed memory process-wide; False without ``mallopt``."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc malloc.h
    return bool(mallopt(m_trim_threshold, 1 << 30)) and bool(mallopt(m_mmap_threshold, 1 << 25))


LOADER_PARENT_ENV = "MORTAL_LOADER_PARENT_PID"  # the pid of the fork server's parent (util/_forkserver_preload)


def _expected_worker_parent():
    # The fork server's pid (mortal.util._forkserver_preload), else None: not os.getppid(), already PID 1 when the
    # learner and its fork server were killed between the worker's fork and this call.
    preload = sys.modules.get("mortal.util._forkserver_preload")
    pid = getattr(preload, "FORKSERVER_PID", None)
    return pid if isinstance(pid, int) and pid > 0 and pid != os.getpid() else None


def worker_init_fn(*args, **kwargs):
    """DataLoader ``worker_init_fn``: die with the fork server, log, keep freed memory."""
    # torch's own watchdog only checks the worker's parent, which under forkserver outlives a killed learner.
    die_with_parent(expected_parent=_expected_worker_parent())
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # a worker does not inherit the entry point's
    keep_freed_memory()


def safe_mp_context():
    """Multiprocessing context for DataLoader workers: ``forkserver`` where available, else ``spawn`` (not fork)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # The fork server imports the heavy modules once, so a worker starts in well under a second. It dies with the
    # thread that started it (mortal.util._forkserver_preload, first): asked only by the main thread.
    preload = ["torch", "mortal.data.dataloader"]
    if threading.current_thread() is threading.main_thread():
        preload.insert(0, "mortal.util._forkserver_preload")
        # the fork server's expected parent (this process), read by mortal.util._forkserver_preload
        os.environ[LOADER_PARENT_ENV] = str(os.getpid())
    ctx.set_forkserver_preload(preload)
    return ctx


def start_fork_server() -> None:
    """Start the workers' fork server now, without waiting for its preload imports (about 1.5 s on 2 cores); nothing
    where the context is spawn."""
    if safe_mp_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver
        forkserver.ensure_running()


def make_dataloader(dataset, *, batch_size: int, num_workers: int = 1, pin_memory: bool = False,
                    drop_last: bool = False, **kwargs) -> DataLoader:
    """Fork-safe sharded ``DataLoader`` over ``dataset`` (``batch_size=None`` for a batching dataset)."""
    if getattr(dataset, "batch_size", None) is not None:
        if batch_size not in (None, dataset.batch_size):
            raise ValueError(f"the dataset makes batches of {dataset.batch_size}, not {batch_size}")
        batch_size = None  # the dataset's items are batches already
    if num_workers > 0:
        kwargs.setdefault("worker_init_fn", worker_init_fn)
        kwargs["multiprocessing_context"] = safe_mp_context()
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
                      drop_last=drop_last, **kwargs)


def learner_loader(config: dict, version: int, file_list: list, player_names, ledger=None, *, batch_size: int,
                   num_workers: int | None = None, pin_memory: bool = False, grp=None) -> DataLoader:
    """The learner's ``DataLoader`` over ``file_list`` (``config``: the plain dict or its typed view; ``grp``: the
    loaded GRP, else read from ``[grp] state_file``); with a ``ClaimLedger`` batches end with ``(B, 4)`` int64 ids."""
    cfg = config if isinstance(config, Config) else typed(config)
    ds = cfg.dataset
    num_workers = ds.num_workers if num_workers is None else num_workers
    if num_workers > 1:
        random.shuffle(file_list)
    reward = cfg.env.reward
    if reward != "grp":
        grp = None
    elif grp is None:
        grp = load_grp(cfg.grp.state_file, cfg.grp.network)
    data = FileDatasetsIter(
        version, file_list, cfg.env.pts, grp, reward=reward, file_batch_size=ds.file_batch_size,
        reserve_ratio=ds.reserve_ratio, player_names=player_names or None, num_epochs=ds.num_epochs,
        enable_augmentation=ds.enable_augmentation, augmented_first=ds.augmented_first,
        max_log_bytes=ds.max_log_bytes, sample_ids=ledger is not None,
        trained=ledger.trained_map() if ledger is not None else None, batch_size=batch_size)
    return make_dataloader(data, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory)


def iter_full_batches(batches, batch_size: int, on_drop=None):
    """Yield the full-size batches of ``batches``; shorter ones are pooled and re-cut at the end, and the
    last < ``batch_size`` samples dropped as Mortal (``on_drop`` gets them once, as a batch tuple)."""
    leftovers, leftover_size = [], 0
    for batch in batches:
        size = batch[0].shape[0]
        if size == batch_size:
            yield batch
        else:
            leftovers.append(batch)
            leftover_size += size
    if not leftovers:
        return
    pooled = [torch.cat(parts, dim=0) for parts in zip(*leftovers)]
    full = leftover_size - leftover_size % batch_size
    for start in range(0, full, batch_size):
        yield tuple(t[start:start + batch_size] for t in pooled)
    if full < leftover_size and on_drop is not None:
        on_drop(tuple(t[full:] for t in pooled))
