"""Train the GRP (Global Reward Predictor) on mjai logs, as Mortal's ``mortal/train_grp.py``.

Config: the ``[grp]`` table (Mortal's keys): ``state_file``; ``[grp.network]``
``hidden_size``, ``num_layers``; ``[grp.control]`` ``device``,
``enable_cudnn_benchmark``, ``tensorboard_dir``, ``batch_size``, ``save_every``,
``val_steps``; ``[grp.dataset]`` ``train_globs``, ``val_globs``, ``file_index``,
``file_batch_size``; ``[grp.optim]`` ``lr``.

Every game with K kyoku gives K samples (prefixes of its GRP rows, all labelled
with the final ``rank_by_player``). Loss is cross entropy over the 24 rank
orders; every ``save_every`` steps it validates on ``val_steps`` batches, writes
TensorBoard scalars ``loss`` / ``acc`` (``train`` and ``val``) and ``lr``, and
saves ``{model, optimizer, steps, timestamp}`` to ``state_file`` (temp file, then
rename). Run: ``python mortal/train_grp.py`` (config from ``MORTAL_CFG`` or
``config.toml``).
"""

if __package__ in (None, ''):  # run as a script: python mortal/train_grp.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import logging
import os
import random
from datetime import datetime
from glob import glob

import torch
from torch import optim
from torch.nn import functional as F
from torch.utils.data import IterableDataset

from mortal.grp import Grp

logger = logging.getLogger(__name__)

__all__ = [
    "GrpFileDatasetsIter", "build_file_index", "collate", "evaluate", "main", "save_checkpoint",
    "train", "train_step",
]


class GrpFileDatasetsIter(IterableDataset):
    """GRP samples ``(inputs (L, 7) float64 tensor, rank_by_player (4,) uint8 array)`` from log files.

    Files are read ``file_batch_size`` at a time, samples shuffled within that
    batch; the list is reshuffled each pass; ``cycle=True`` repeats forever.
    Bad files are skipped (one warning each, counted in ``skipped``).

    Raises ``RuntimeError`` when a whole pass yields no sample (no usable file),
    instead of cycling forever.
    """

    def __init__(self, file_list, file_batch_size=50, cycle=False):
        super().__init__()
        self.file_list = list(file_list)
        self.file_batch_size = max(1, int(file_batch_size))
        self.cycle = cycle
        self.buffer = []
        self.skipped_files = []
        self.iterator = None

    @property
    def skipped(self) -> int:
        return len(self.skipped_files)

    def build_iter(self):
        while True:
            random.shuffle(self.file_list)
            yielded = 0
            for start in range(0, len(self.file_list), self.file_batch_size):
                self.populate_buffer(self.file_list[start:start + self.file_batch_size])
                random.shuffle(self.buffer)
                yielded += len(self.buffer)
                yield from self.buffer
                self.buffer.clear()
            if yielded == 0:
                raise RuntimeError(f"no GRP samples in {len(self.file_list)} log files "
                                   f"({self.skipped} skipped as bad input)")
            if not self.cycle:
                break

    def populate_buffer(self, file_list) -> None:
        for game in Grp.load_gz_log_files(file_list, skipped=self.skipped_files):
            feature = torch.as_tensor(game.take_feature(), dtype=torch.float64)
            rank_by_player = game.take_rank_by_player()
            for i in range(feature.shape[0]):
                self.buffer.append((feature[:i + 1], rank_by_player))

    def __iter__(self):
        if self.iterator is None:
            self.iterator = self.build_iter()
        return self.iterator


def collate(batch):
    """List of samples -> ``(inputs list[(L_i, 7) float64], rank_by_players (N, 4) int64)``."""
    inputs = [x for x, _ in batch]
    ranks = torch.tensor([[int(r) for r in rk] for _, rk in batch], dtype=torch.int64)
    return inputs, ranks


def train_step(grp, optimizer, inputs, rank_by_players):
    """One AdamW step of cross entropy over rank orders. Returns ``(loss, acc)`` as floats."""
    logits = grp(inputs)
    labels = grp.get_label(rank_by_players)
    loss = F.cross_entropy(logits, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        acc = (logits.argmax(-1) == labels).to(torch.float64).mean()
    return loss.item(), acc.item()


def evaluate(grp, inputs, rank_by_players):
    """``(loss, acc)`` floats on one batch without gradients."""
    with torch.inference_mode():
        logits = grp(inputs)
        labels = grp.get_label(rank_by_players)
        loss = F.cross_entropy(logits, labels)
        acc = (logits.argmax(-1) == labels).to(torch.float64).mean()
    return float(loss), float(acc)


def save_checkpoint(state: dict, path) -> None:
    """``torch.save`` to a temp name in the same folder, then atomic rename to ``path``."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def build_file_index(train_globs, val_globs, file_index):
    """``(train_file_list, val_file_list)``, from the cached ``file_index`` if it exists.

    Otherwise expands the recursive globs, sorts each list in reverse (as Mortal)
    and saves ``{train_file_list, val_file_list}`` to ``file_index``.
    """
    if file_index and os.path.exists(file_index):
        index = torch.load(file_index, weights_only=True)
        return index["train_file_list"], index["val_file_list"]
    logger.info("building file index...")
    train_files = sorted((f for pat in train_globs for f in glob(pat, recursive=True)), reverse=True)
    val_files = sorted((f for pat in val_globs for f in glob(pat, recursive=True)), reverse=True)
    if file_index:
        save_checkpoint({"train_file_list": train_files, "val_file_list": val_files}, file_index)
    return train_files, val_files


def _loader(file_list, batch_size, file_batch_size, num_workers):
    from mortal.dataloader import make_dataloader

    data = GrpFileDatasetsIter(file_list, file_batch_size=file_batch_size, cycle=True)
    return iter(make_dataloader(data, batch_size=batch_size, num_workers=num_workers,
                                drop_last=True, collate_fn=collate))


def train(cfg: dict, *, max_steps: int | None = None, num_workers: int = 1, progress: bool = True) -> int:
    """Train with the ``[grp]`` config table ``cfg``; returns the step count reached.

    Runs forever (as Mortal) unless ``max_steps`` is given. ``num_workers`` DataLoader
    workers per split (Mortal uses 1; 0 loads in this process).

    Raises:
        ValueError: an empty train or val file list.
        RuntimeError: no usable sample in the logs (every file skipped).
    """
    from tqdm import tqdm
    from torch.utils.tensorboard import SummaryWriter
    from mortal.model import GRP

    control = cfg["control"]
    batch_size = control["batch_size"]
    save_every = control["save_every"]
    val_steps = control["val_steps"]
    device = torch.device(control.get("device", "cpu"))
    torch.backends.cudnn.benchmark = control.get("enable_cudnn_benchmark", False)
    logger.info("device: %s", device)

    grp = GRP(**cfg.get("network", {})).to(device)
    optimizer = optim.AdamW(grp.parameters())
    state_file = cfg["state_file"]
    steps = 0
    if os.path.exists(state_file):
        state = torch.load(state_file, weights_only=True, map_location=device)
        logger.info("loaded: %s", datetime.fromtimestamp(state["timestamp"]).strftime("%Y-%m-%d %H:%M:%S"))
        grp.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        steps = state["steps"]
    lr = cfg["optim"]["lr"]
    optimizer.param_groups[0]["lr"] = lr

    ds = cfg["dataset"]
    train_files, val_files = build_file_index(ds["train_globs"], ds["val_globs"], ds.get("file_index"))
    if not train_files or not val_files:
        raise ValueError(f"[grp.dataset] globs matched {len(train_files)} train and {len(val_files)} val files; "
                         "both need at least one log")
    logger.info("train file list size: %s", f"{len(train_files):,}")
    logger.info("val file list size: %s", f"{len(val_files):,}")
    train_iter = _loader(train_files, batch_size, ds["file_batch_size"], num_workers)
    val_iter = _loader(val_files, batch_size, ds["file_batch_size"], num_workers)
    writer = SummaryWriter(control["tensorboard_dir"])

    def est():  # rough share of the data seen, assuming ~10 kyoku per game (Mortal's estimate)
        return steps * batch_size / (len(train_files) * 10) * 100

    logger.info("total steps: %s est. %6.3f%%", f"{steps:,}", est())
    stats = dict(train_loss=0.0, train_acc=0.0)
    pb = tqdm(total=save_every, desc="TRAIN", disable=not progress)
    grp.train()
    try:
        while max_steps is None or steps < max_steps:
            inputs, ranks = next(train_iter)
            loss, acc = train_step(grp, optimizer, [x.to(device) for x in inputs], ranks.to(device))
            stats["train_loss"] += loss
            stats["train_acc"] += acc
            steps += 1
            pb.update(1)
            if steps % save_every:
                continue
            pb.close()
            grp.eval()
            val_loss = val_acc = 0.0
            for _ in tqdm(range(val_steps), desc="VAL", disable=not progress):
                inputs, ranks = next(val_iter)
                loss, acc = evaluate(grp, [x.to(device) for x in inputs], ranks.to(device))
                val_loss += loss
                val_acc += acc
            grp.train()
            writer.add_scalars("loss", {"train": stats["train_loss"] / save_every,
                                        "val": val_loss / val_steps}, steps)
            writer.add_scalars("acc", {"train": stats["train_acc"] / save_every,
                                       "val": val_acc / val_steps}, steps)
            writer.add_scalar("lr", lr, steps)
            writer.flush()
            stats = dict(train_loss=0.0, train_acc=0.0)
            logger.info("total steps: %s est. %6.3f%%", f"{steps:,}", est())
            save_checkpoint({
                "model": grp.state_dict(),
                "optimizer": optimizer.state_dict(),
                "steps": steps,
                "timestamp": datetime.now().timestamp(),
            }, state_file)
            pb = tqdm(total=save_every, desc="TRAIN", disable=not progress)
    finally:
        pb.close()
        writer.close()
    return steps


def main(argv=None):
    """Entry point: load the config once and train until interrupted."""
    import argparse

    os.environ.pop("RUST_BACKTRACE", None)
    parser = argparse.ArgumentParser(description="Train the GRP model on mjai logs ([grp] config).")
    parser.add_argument("--config", default=None, help="config file (default: $MORTAL_CFG or config.toml)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mortal.config import TRAIN_GRP_SECTIONS, load_config

    config = load_config(args.config, required=TRAIN_GRP_SECTIONS)
    try:
        train(config["grp"], max_steps=args.max_steps)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
