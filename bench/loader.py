"""Loader throughput: gzip mjai logs -> v3 training tensors, vs the Rust floor, on one core.

Floor: for every seat, ``PlayerState.update`` on each event plus ``encode_obs(3)`` at
each decision point, on already decompressed lines (the unavoidable native work).
Measured on the same logs in the same run:

* ``GameplayLoader.load_gz_log_files`` + ``torch.from_numpy`` of each sample's obs and of
  the actions/masks arrays;
* the whole ``FileDatasetsIter`` (adds GRP rewards, targets, shuffle buffer) batched by
  the default collate (whose 65 MB batch stacking dominates this line).

A second floor retains the encoded arrays (``floor_keep``): writing ~127 KB of fresh
memory per sample costs about as much as encoding, and no loader can avoid it.

Prints samples/s of each and the ratio to the floor (target >= 0.6). The process
tunes malloc as a DataLoader worker does (``keep_freed_memory``) unless
``--default-malloc``.
Usage: ``python bench/loader.py [--copies N] [--repeat R]``.
"""

if __package__ in (None, ''):  # run as a script: python bench/loader.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import gzip
import pathlib
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "tests" / "data").glob("*.jsonl"))
VERSION = 3


def floor(paths, keep=False):
    """Decision points/s of PlayerState.update + encode_obs alone (decompression excluded).

    ``keep=True`` retains every encoded array, as any loader must until the samples
    are consumed; without it the same cache-hot buffer is reused for every call.
    """
    from mjai.mlibriichi.state import PlayerState

    texts = [gzip.decompress(pathlib.Path(p).read_bytes()).decode().splitlines() for p in paths]
    n = 0
    kept = []
    t0 = time.perf_counter()
    for lines in texts:
        for seat in range(4):
            state = PlayerState(seat)
            for line in lines:
                if state.update(line).can_act:
                    obs = state.encode_obs(VERSION, False)
                    if keep:
                        kept.append(obs)
                    n += 1
    return n, time.perf_counter() - t0


def floor_keep(paths):
    return floor(paths, keep=True)


def loader(paths):
    from mortal.data.gameplay import GameplayLoader

    n = 0
    t0 = time.perf_counter()
    gl = GameplayLoader(VERSION)
    for games in gl.load_gz_log_files(paths):
        for g in games:
            obs = [torch.from_numpy(o) for o in g.take_obs_list()]
            torch.from_numpy(g.take_actions())
            torch.from_numpy(g.take_masks())
            n += len(obs)
    return n, time.perf_counter() - t0


def dataset(paths):
    from mortal.data.dataloader import FileDatasetsIter, make_dataloader
    from mortal.model.networks import GRP

    ds = FileDatasetsIter(VERSION, paths, [6, 4, 2, 0], GRP(), file_batch_size=20)
    n = 0
    t0 = time.perf_counter()
    for batch in make_dataloader(ds, batch_size=512, num_workers=0):
        n += batch[1].shape[0]
    return n, time.perf_counter() - t0


def main(argv=None):
    from mortal import entry

    parser = entry.parser(__doc__.splitlines()[0], config=False)
    parser.add_argument("--copies", type=int, default=4, help="gzip copies of each fixture log")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (best kept)")
    parser.add_argument("--default-malloc", action="store_true",
                        help="do not call keep_freed_memory (glibc default trimming)")
    args = entry.start(parser, argv, log_level=None)
    from mortal.data.dataloader import keep_freed_memory

    torch.set_num_threads(1)
    if not args.default_malloc:
        keep_freed_memory()  # as in a DataLoader worker (worker_init_fn)
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i in range(args.copies):
            for f in FIXTURES:
                p = pathlib.Path(d) / f"{i}_{f.stem}.json.gz"
                p.write_bytes(gzip.compress(f.read_bytes()))
                paths.append(str(p))
        # Rounds interleave the three measurements so that load from other processes
        # hits them alike; the best rate of each is kept. Round 0 is a warm-up.
        results = {}
        for rnd in range(args.repeat + 1):
            for name, fn in (("floor", floor), ("floor_keep", floor_keep), ("loader", loader),
                             ("dataset", dataset)):
                n, dt = fn(list(paths))
                if rnd:
                    results[name] = (n, max(results.get(name, (0, 0.0))[1], n / dt))
    f, fk = results["floor"][1], results["floor_keep"][1]
    print(f"{len(paths)} gzip logs, feature version {VERSION}, 1 core, best of {args.repeat} rounds")
    print(f"floor       update + encode_obs               : {f:9.1f} decisions/s ({results['floor'][0]} per pass)")
    print(f"floor_keep  same, retaining the arrays        : {fk:9.1f} decisions/s  ratio {fk / f:.2f}")
    labels = {"loader": "gz -> per-sample tensors", "dataset": "FileDatasetsIter -> 512-batches"}
    for name in ("loader", "dataset"):
        n, r = results[name]
        print(f"{name:11s} {labels[name]:34s}: {r:9.1f} samples/s ({n} per pass)  "
              f"ratio {r / f:.2f} (vs floor_keep {r / fk:.2f})")
    ratio = results["loader"][1] / f
    print(f"loader ratio vs floor: {ratio:.2f} (target >= 0.60: {'met' if ratio >= 0.6 else 'NOT met'})")

if __name__ == "__main__":
    main()
