"""Train the GRP (Global Reward Predictor) on mjai logs, as Mortal's ``mortal/train_grp.py`` (the ``[grp]`` table).

Every game with K kyoku gives K samples (prefixes of its GRP rows, labelled with the final ``rank_by_player``);
the loss is cross entropy over the 24 rank orders. Extra, off by default: early stopping (``--patience``); the
checkpoint's ``best_model`` and ``early_stopping`` let an interrupted run resume with its record."""

if __package__ in (None, ''):  # run as a script: python mortal/train_grp.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import copy
import logging
import math
import os
import pickle
import random
import sys
from datetime import datetime
from glob import glob

import torch
from torch import optim
from torch.nn import functional as F
from torch.utils.data import IterableDataset

from mortal.model.checkpoint import CheckpointError, atomic_torch_save, describe_error, load_checkpoint
from mortal.data.grp import Grp
from mortal.data.offline_data import listed_problem, stale_index

# Not __name__: that is "__main__" under ``python -m`` / as a script.
logger = logging.getLogger("mortal.train_grp")

#: Cross entropy (nats) of the uniform prediction over the 24 rank orders: ln 24 = 3.178.
UNIFORM_CE = math.log(24)


class NoSamplesError(RuntimeError):
    """Every log file of a split was skipped as bad input (or the list was empty)."""


class TrainGrpInputError(ValueError):
    """A user error found before training: empty globs, unreadable file index or checkpoint."""


class GrpFileDatasetsIter(IterableDataset):
    """GRP samples ``(inputs (L, 7) float64 tensor, rank_by_player (4,) uint8 array)`` from log files, read
    ``file_batch_size`` at a time, shuffled within that batch; bad files are skipped (one warning each, listed in
    ``skipped_files``). Raises NoSamplesError when a whole pass yields no sample."""

    def __init__(self, file_list, file_batch_size=50, cycle=False):
        super().__init__()
        self.file_list = list(file_list)
        self.file_batch_size = max(1, int(file_batch_size))
        self.cycle = cycle
        self.skipped_files = []
        self.iterator = None

    def build_iter(self):
        while True:
            random.shuffle(self.file_list)
            yield from self._one_pass(shuffle=True)
            if not self.cycle:
                break

    def _one_pass(self, *, shuffle: bool):
        """One pass, ``file_batch_size`` files at a time. Raises NoSamplesError when no file yields a sample."""
        yielded = 0
        for start in range(0, len(self.file_list), self.file_batch_size):
            buffer = []
            for game in Grp.load_gz_log_files(self.file_list[start:start + self.file_batch_size],
                                              skipped=self.skipped_files):
                feature = torch.as_tensor(game.take_feature(), dtype=torch.float64)
                rank_by_player = game.take_rank_by_player()
                buffer.extend((feature[:i + 1], rank_by_player) for i in range(feature.shape[0]))
            if shuffle:
                random.shuffle(buffer)
            yielded += len(buffer)
            yield from buffer
        if yielded == 0:
            raise NoSamplesError(f"no GRP samples in {len(self.file_list)} log files "
                                 f"({len(self.skipped_files)} skipped as bad input)")

    def __iter__(self):
        if self.iterator is None:
            self.iterator = self.build_iter()
        return self.iterator


def collate(batch):
    """List of samples -> ``(inputs list[(L_i, 7) float64], rank_by_players (N, 4) int64)``."""
    inputs = [x for x, _ in batch]
    ranks = torch.tensor([[int(r) for r in rk] for _, rk in batch], dtype=torch.int64)
    return inputs, ranks


def _loss_acc(grp, inputs, rank_by_players):
    logits = grp(inputs)
    labels = grp.get_label(rank_by_players)
    return F.cross_entropy(logits, labels), (logits.argmax(-1) == labels).to(torch.float64).mean()


def train_step(grp, optimizer, inputs, rank_by_players):
    """One AdamW step of cross entropy over rank orders. Returns ``(loss, acc)`` as floats."""
    loss, acc = _loss_acc(grp, inputs, rank_by_players)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item(), acc.item()


def evaluate(grp, inputs, rank_by_players):
    """``(loss, acc)`` floats on one batch without gradients."""
    with torch.inference_mode():
        loss, acc = _loss_acc(grp, inputs, rank_by_players)
    return float(loss), float(acc)


def load_samples(file_list) -> list:
    """Every GRP sample of ``file_list``, in file order, as ``GrpFileDatasetsIter`` yields them; bad files skipped."""
    files = list(file_list)
    data = GrpFileDatasetsIter(files, file_batch_size=len(files))
    try:
        return list(data._one_pass(shuffle=False))
    except NoSamplesError:  # also for no file
        return []


def mean_ce(grp, samples, batch: int = 512) -> float:
    """Mean cross entropy (nats) of ``grp`` over ``samples``, without gradients. Raises ValueError for no samples."""
    if not samples:
        raise ValueError("mean_ce needs at least one sample")
    from mortal.learning.diagnostics import eval_mode
    device = next(grp.parameters()).device
    total = 0.0
    with eval_mode(grp):
        for i in range(0, len(samples), batch):
            inputs, ranks = collate(samples[i:i + batch])
            loss, _ = evaluate(grp, [x.to(device) for x in inputs], ranks.to(device))
            total += loss * len(inputs)
    return total / len(samples)


def early_stopping_state(history, patience: int) -> tuple[int, bool]:
    """``(index of the earliest lowest of the validation losses in ``history`` or -1, stop)``: stop when
    ``patience`` > 0 checks in a row came after it."""
    if not history:
        return -1, False
    best = min(range(len(history)), key=lambda i: (history[i], i))
    return best, patience > 0 and len(history) - 1 - best >= patience


def _unusable(exc: BaseException) -> str:
    """Why a torch file of ``[grp]`` cannot be used, on one line (for the user-error messages)."""
    if isinstance(exc.__cause__, pickle.UnpicklingError):  # load_checkpoint's CheckpointError of a refused file
        return "not a weights-only torch file"
    return describe_error(exc)


def build_file_index(train_globs, val_globs, file_index):
    """``(train_file_list, val_file_list)`` from the cached ``file_index`` if current, else the globs, each sorted in
    reverse (as Mortal) and cached unless a list is empty (that would hide logs added later). Raises
    TrainGrpInputError for an unusable ``file_index``."""
    if file_index and os.path.exists(file_index):
        try:
            index = load_checkpoint(file_index)
            lists = list(index["train_file_list"]), list(index["val_file_list"])
        except (CheckpointError, KeyError, TypeError) as e:
            raise TrainGrpInputError(f"[grp.dataset] file_index {file_index} is not a file index ({_unusable(e)}); "
                                     "delete it to rebuild it from the globs") from None
        stale = stale_index(index, {"train_globs": train_globs, "val_globs": val_globs})
        if stale is None:
            bad = [f"{key}: {why}" for key, patterns in (("train_file_list", train_globs),
                                                         ("val_file_list", val_globs))
                   if (why := listed_problem(index[key], patterns)) is not None]
            if not bad:
                return lists
            # never read what a damaged or planted index lists
            logger.warning("[grp.dataset] file_index %s is rebuilt from the globs: %s", file_index, "; ".join(bad))
        else:
            logger.info("[grp.dataset] file_index %s is rebuilt: %s", file_index, stale)
    logger.info("building file index...")
    train_files = sorted((f for pat in train_globs for f in glob(pat, recursive=True)), reverse=True)
    val_files = sorted((f for pat in val_globs for f in glob(pat, recursive=True)), reverse=True)
    if file_index and train_files and val_files:
        atomic_torch_save({"train_file_list": train_files, "val_file_list": val_files,
                           "train_globs": list(train_globs), "val_globs": list(val_globs)}, file_index)
    return train_files, val_files


def _loader(file_list, batch_size, file_batch_size, num_workers):
    from mortal.data.dataloader import make_dataloader

    data = GrpFileDatasetsIter(file_list, file_batch_size=file_batch_size, cycle=True)
    return iter(make_dataloader(data, batch_size=batch_size, num_workers=num_workers,
                                drop_last=True, collate_fn=collate))


def train(cfg, *, max_steps: int | None = None, num_workers: int = 1, progress: bool = True, patience: int = 0) -> int:
    """Train with the typed ``[grp]`` table ``cfg``; returns the steps reached (forever, as Mortal, if no max_steps).
    Raises TrainGrpInputError (empty file list, unusable ``file_index`` or ``state_file``), NoSamplesError."""
    run = _GrpRun(cfg, patience)
    if run.es["stopped"]:
        logger.info("early stopping: %s stopped before at step %d (best %.4f at step %d); not trained further",
                    run.state_file, run.steps, run.es["best_ce"], run.es["best_steps"])
        return run.steps
    run.optimizer.param_groups[0]["lr"] = cfg.optim.lr
    run.open_data(num_workers)
    return run.fit(max_steps, progress)


class _GrpRun:
    """One ``train`` call: the GRP, its optimizer, step count and early-stopping record, resumed when possible."""

    def __init__(self, cfg, patience: int):
        self.cfg = cfg
        self.patience = patience
        control = cfg.control
        self.batch_size = control.batch_size
        self.save_every = control.save_every
        self.val_steps = control.val_steps
        self.device = torch.device(control.device)
        torch.backends.cudnn.benchmark = control.enable_cudnn_benchmark
        logger.info("device: %s", self.device)
        self.grp = self.new_grp().to(self.device)
        self.optimizer = optim.AdamW(self.grp.parameters())
        self.state_file = cfg.state_file
        self.steps = 0
        self.es = {"best_steps": None, "best_ce": None, "history": [], "stopped": False}
        self.best_model = None
        if os.path.exists(self.state_file):
            self._resume()

    def new_grp(self):
        """A GRP of ``[grp.network]`` (the GRP's defaults without one)."""
        from mortal.model.networks import GRP

        net = self.cfg.network
        return GRP(hidden_size=net.hidden_size, num_layers=net.num_layers) if net is not None else GRP()

    def _resume(self) -> None:
        state_file = self.state_file
        try:
            state = load_checkpoint(state_file, map_location=self.device)
            logger.info("loaded: %s", datetime.fromtimestamp(state["timestamp"]).strftime("%Y-%m-%d %H:%M:%S"))
            self.grp.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.steps = state["steps"]
            if self.patience and "early_stopping" in state:
                self.es = {**self.es, **state["early_stopping"]}
                self.es["history"] = [list(h) for h in self.es["history"]]
                if state.get("best_model") is not None:
                    self.best_model = state["best_model"]
                    self.new_grp().load_state_dict(self.best_model)  # the same shapes, or refused
        except (RuntimeError, KeyError, TypeError, ValueError) as e:  # ValueError: CheckpointError among them
            raise TrainGrpInputError(f"[grp] state_file {state_file} cannot be resumed from ({_unusable(e)}); "
                                     "check [grp.network] or move the file away to start afresh") from None

    def open_data(self, num_workers: int) -> None:
        """The file lists, the two cycling loaders and (with ``patience``) every val sample."""
        ds = self.cfg.dataset
        train_files, val_files = build_file_index(ds.train_globs, ds.val_globs, ds.file_index)
        if not train_files or not val_files:
            cached = ds.file_index and os.path.exists(ds.file_index)
            raise TrainGrpInputError(f"[grp.dataset] {'file_index ' + ds.file_index if cached else 'globs'} "
                                     f"listed {len(train_files)} train and {len(val_files)} val files; both need at "
                                     f"least one log{'; delete the index to expand the globs again' if cached else ''}")
        logger.info("train file list size: %s", f"{len(train_files):,}")
        logger.info("val file list size: %s", f"{len(val_files):,}")
        self.train_files = train_files
        self.train_iter = _loader(train_files, self.batch_size, ds.file_batch_size, num_workers)
        self.val_iter = _loader(val_files, self.batch_size, ds.file_batch_size, num_workers)
        self.val_samples = None
        if self.patience:
            self.val_samples = load_samples(val_files)
            if not self.val_samples:
                raise NoSamplesError(f"no GRP samples in the {len(val_files)} val log files")
            logger.info("early stopping: patience %d validations of %d steps, on %s val samples", self.patience,
                        self.save_every, f"{len(self.val_samples):,}")

    def progress_line(self) -> str:
        # Epochs = samples seen / train samples at Mortal's ~10 kyoku per game (Mortal prints it x100 as a %).
        epochs = self.steps * self.batch_size / (len(self.train_files) * 10)
        return (f"total steps: {self.steps:,} est. {epochs:.2f} epochs ({len(self.train_files):,} train logs, "
                f"~10 kyoku each)")

    def save(self, stopped: bool = False) -> None:
        state = {
            "model": self.grp.state_dict() if not stopped else self.best_model,
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
            "timestamp": datetime.now().timestamp(),
        }
        if self.patience:
            state["early_stopping"] = {**self.es, "stopped": stopped}
            if not stopped:
                state["best_model"] = self.best_model
        atomic_torch_save(state, self.state_file)

    def fit(self, max_steps, progress: bool) -> int:
        """Train until ``max_steps`` or the early stop, validating and saving every ``save_every`` steps; -> steps."""
        from contextlib import nullcontext

        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(self.cfg.control.tensorboard_dir)
        logger.info("%s", self.progress_line())
        train_loss = train_acc = 0.0
        pb = tqdm(total=max_steps, initial=self.steps, desc="TRAIN", unit="step", disable=not progress,
                  dynamic_ncols=True)
        self.grp.train()
        stop = False
        try:
            with logging_redirect_tqdm() if progress else nullcontext():
                while max_steps is None or self.steps < max_steps:
                    inputs, ranks = next(self.train_iter)
                    loss, acc = train_step(self.grp, self.optimizer, [x.to(self.device) for x in inputs],
                                           ranks.to(self.device))
                    train_loss += loss
                    train_acc += acc
                    self.steps += 1
                    pb.update(1)
                    if self.steps % self.save_every:
                        continue
                    pb.set_postfix_str('validating')  # the same bar: no second one below it
                    stop = self._validate(writer, train_loss, train_acc)
                    pb.set_postfix_str('')
                    train_loss = train_acc = 0.0
                    logger.info("%s", self.progress_line())
                    if stop:
                        break
                    self.save()
            if self.patience and self.best_model is not None:
                self.save(stopped=True)
                logger.info("early stopping: %s at step %d; kept the best, val cross entropy %.4f at step %d",
                            "stopped" if stop else "reached max_steps", self.steps, self.es["best_ce"],
                            self.es["best_steps"])
        finally:
            pb.close()
            writer.close()
        return self.steps

    def _validate(self, writer, train_loss: float, train_acc: float) -> bool:
        """Validation, this period's TensorBoard scalars (given the train sums), early stopping; -> stop?"""
        steps = self.steps
        self.grp.eval()
        val_loss = val_acc = 0.0
        for _ in range(self.val_steps):
            inputs, ranks = next(self.val_iter)
            loss, acc = evaluate(self.grp, [x.to(self.device) for x in inputs], ranks.to(self.device))
            val_loss += loss
            val_acc += acc
        self.grp.train()
        writer.add_scalars("loss", {"train": train_loss / self.save_every, "val": val_loss / self.val_steps}, steps)
        writer.add_scalars("acc", {"train": train_acc / self.save_every, "val": val_acc / self.val_steps}, steps)
        writer.add_scalar("lr", self.cfg.optim.lr, steps)
        stop = bool(self.patience) and self._early_stopping(writer)
        writer.flush()
        return stop

    def _early_stopping(self, writer) -> bool:
        """The cross entropy over every val sample into the record (a new best kept); whether to stop."""
        es, steps = self.es, self.steps
        ce = mean_ce(self.grp, self.val_samples)
        es["history"].append([steps, ce])
        best, stop = early_stopping_state([c for _, c in es["history"]], self.patience)
        if best == len(es["history"]) - 1:
            self.best_model = copy.deepcopy(self.grp.state_dict())
            es["best_steps"], es["best_ce"] = steps, ce
        writer.add_scalar("val_ce", ce, steps)
        logger.info("val cross entropy %.4f at step %d (best %.4f at step %d; uniform %.4f)", ce, steps,
                    es["best_ce"], es["best_steps"], UNIFORM_CE)
        return stop


def main(argv=None) -> int:
    """Entry point; returns 0, or 2 after a one-line message for a user error."""
    from mortal import entry
    from mortal.config import TRAIN_GRP_SECTIONS, ConfigError, grp_steps_problem, typed

    parser = entry.parser("Train the GRP model on mjai logs ([grp] config).")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--patience", type=int, default=0,
                        help="early stopping: stop after this many validations without a new lowest cross entropy "
                             "on the val logs and keep the best weights (default: 0 = off, as Mortal)")
    args = entry.start(parser, argv)
    if args.patience < 0:
        return entry.error(f"--patience must be >= 0, got {args.patience}")
    try:
        config = entry.load_config(args, TRAIN_GRP_SECTIONS)
        entry.check_devices(config, entry.GRP_DEVICES)
        grp = typed(config).grp
        problem = args.max_steps is not None and grp_steps_problem(args.max_steps, grp.control.save_every)
        if problem:
            return entry.error(f"--max-steps {args.max_steps} {problem}")
        train(grp, max_steps=args.max_steps, patience=args.patience)
    except (ConfigError, TrainGrpInputError, NoSamplesError) as exc:  # user errors: one line, no traceback
        # from a DataLoader worker the message is torch's report ending with the original line
        lines = [x for x in str(exc).strip().splitlines() if x.strip()]
        text = lines[-1].split("NoSamplesError: ")[-1] if isinstance(exc, NoSamplesError) and lines else exc
        return entry.error(text)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
