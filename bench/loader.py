"""Loader throughput: gzip mjai logs -> v3 training samples and batches, vs the Rust floor, on one core.

Floor: for every seat, ``PlayerState.update`` on each event plus ``encode_obs(3)`` at
each decision point, on already decompressed lines (the unavoidable native work).
Measured on the same logs in the same run:

* ``loader``: ``GameplayLoader.load_gz_log_files`` (each observation packed as it is encoded,
  ``mortal.features.packed_obs``) + ``torch.from_numpy`` of the packed obs, actions and masks arrays;
* ``dataset``: the whole ``FileDatasetsIter`` (adds GRP rewards, targets, shuffle buffer) in its batch
  mode, 512-sample batches of packed obs, as the trainer's loader makes them (``learner_loader``);
* ``unpack``: those batches unpacked to float32 ``(512, 934, 34)`` on the CPU (what a CPU trainer does
  before the forward; on a GPU the packed batch is moved and unpacked there).

A second floor retains the encoded float32 arrays (``floor_keep``): writing ~127 KB of fresh
memory per sample is what the loader paid before it packed them.

Prints samples/s of each, the ratios to the floor (target >= 0.6 for the loader) and of the
batches to the loader (target >= 0.5), and the bytes a sample holds. The process tunes malloc
as a DataLoader worker does (``keep_freed_memory``) unless ``--default-malloc``.
``--version 4`` measures the loader, dataset and unpack at feature version 4 (the single-player searches run on
``MORTAL_SP_THREADS`` threads, default min(8, CPUs), so "1 core" no longer holds) against the same v3 floor, and adds
the v3 loader on the same logs to print the v4/v3 loader ratio.
``--breakdown`` (version 3) also times, per sample and in the same rounds, what the loader adds to the floor that no
walk in any language avoids: ``pack`` (the floor plus ``packed_obs`` packing) and ``parse`` (gunzip + ``read_log``'s
JSON and field checks); the rest of the loader's time is its Python walk (labels, masks, per-event bookkeeping, GRP,
the per-seat arrays). It prints the ceiling the loader's ratio would reach with that rest at zero.
Usage: ``python bench/loader.py [--copies N] [--repeat R] [--version {3,4}] [--breakdown]``.
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
BATCH = 512


def floor(paths, keep=False, pack=False):
    """Decision points/s of PlayerState.update + encode_obs alone (decompression excluded).

    ``keep=True`` retains every encoded array, as any loader must until the samples
    are consumed; without it the same cache-hot buffer is reused for every call.
    ``pack=True`` packs each observation into one reused row, as the loader packs it.
    """
    from mjai.mlibriichi.state import PlayerState

    texts = [gzip.decompress(pathlib.Path(p).read_bytes()).decode().splitlines() for p in paths]
    n = 0
    kept = []
    sink = None
    if keep:
        sink = kept.append
    elif pack:
        import numpy as np
        from mortal.features.packed_obs import packer, row_bytes
        pack_row, out = packer(3), np.empty((1, row_bytes(3)), dtype=np.uint8)

        def sink(encoded):
            pack_row(encoded[0], out, 0)
    t0 = time.perf_counter()
    for lines in texts:
        for seat in range(4):
            state = PlayerState(seat)
            for line in lines:
                if state.update(line).can_act:
                    obs = state.encode_obs(3, False)  # the Rust floor (it has no version 4)
                    if sink is not None:
                        sink(obs)
                    n += 1
    return n, time.perf_counter() - t0


def floor_pack(paths):
    return floor(paths, pack=True)


def parse(paths):
    """``read_log`` alone (gunzip, JSON, the loader's field checks), counted per decision of the floor so that its
    time per decision compares with the others'."""
    from mortal.data.mjai_log import read_log

    n = floor_decisions(paths)
    t0 = time.perf_counter()
    for p in paths:
        read_log(p, None)
    return n, time.perf_counter() - t0


_DECISIONS = {}


def floor_decisions(paths):
    key = tuple(paths)
    if key not in _DECISIONS:
        _DECISIONS[key] = floor(paths)[0]
    return _DECISIONS[key]


def floor_keep(paths):
    return floor(paths, keep=True)


def loader_v3(paths):
    return loader(paths, 3)


def loader(paths, version=None):
    from mortal.data.gameplay import GameplayLoader

    n = 0
    t0 = time.perf_counter()
    gl = GameplayLoader(VERSION if version is None else version)
    for games in gl.load_gz_log_files(paths):
        for g in games:
            n += len(torch.from_numpy(g.take("packed_obs")))
            torch.from_numpy(g.take("actions"))
            torch.from_numpy(g.take("masks"))
    return n, time.perf_counter() - t0


def _batches(paths):
    from mortal.data.dataloader import FileDatasetsIter, make_dataloader
    from mortal.model.networks import GRP

    ds = FileDatasetsIter(VERSION, paths, [6, 4, 2, 0], GRP(), file_batch_size=20, batch_size=BATCH)
    return make_dataloader(ds, batch_size=BATCH, num_workers=0)


def dataset(paths):
    n = 0
    t0 = time.perf_counter()
    for batch in _batches(paths):
        n += batch[1].shape[0]
    return n, time.perf_counter() - t0


def unpack(paths):
    from mortal.features.packed_obs import unpack as unpack_obs

    batches = list(_batches(paths))
    n = 0
    t0 = time.perf_counter()
    for batch in batches:
        n += unpack_obs(batch[0], VERSION).shape[0]
    return n, time.perf_counter() - t0


def sample_bytes(paths):
    """(bytes of one sample before: float32 obs + mask + 4 scalars, after: one row of each batch column)."""
    from mortal.features.obs import obs_shape

    c, w = obs_shape(VERSION)
    before = c * w * 4 + 46 + 4 * 8
    batch = next(iter(_batches(paths[:1])))
    after = sum(t[0].numel() * t.element_size() for t in batch)
    return before, after


def main(argv=None):
    from mortal import entry

    parser = entry.parser(__doc__.splitlines()[0], config=False)
    parser.add_argument("--copies", type=int, default=4, help="gzip copies of each fixture log")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (best kept)")
    parser.add_argument("--version", type=int, choices=(3, 4), default=3, help="feature version of the loader")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the floor + packing and the parse alone (version 3), and print the ceiling")
    parser.add_argument("--default-malloc", action="store_true",
                        help="do not call keep_freed_memory (glibc default trimming)")
    args = entry.start(parser, argv, log_level=None)
    global VERSION
    VERSION = args.version
    from mortal.data.dataloader import keep_freed_memory
    from mortal.features.packed_obs import HAVE_FAST_PACK

    torch.set_num_threads(1)
    if not args.default_malloc:
        keep_freed_memory()  # as in a DataLoader worker (worker_init_fn)
    n_paths, results, before, after = _measure(args.copies, args.repeat, args.breakdown)
    _report(args, HAVE_FAST_PACK, n_paths, results, before, after)


def _measure(copies, repeat, breakdown):
    """``(logs, results, before, after)``: each measurement's ``(decisions or samples per pass, best rate/s)`` over
    ``copies`` gzip copies of the fixture logs, and the bytes per sample as float32 tuples and packed."""
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i in range(copies):
            for f in FIXTURES:
                p = pathlib.Path(d) / f"{i}_{f.stem}.json.gz"
                p.write_bytes(gzip.compress(f.read_bytes()))
                paths.append(str(p))
        # Rounds interleave the measurements so that load from other processes
        # hits them alike; the best rate of each is kept. Round 0 is a warm-up.
        results = {}
        for rnd in range(repeat + 1):
            extra = (("loader_v3", loader_v3),) if VERSION == 4 else ()
            if breakdown and VERSION == 3:
                extra = (("floor_pack", floor_pack), ("parse", parse))
            for name, fn in (("floor", floor), ("floor_keep", floor_keep), ("loader", loader), *extra,
                             ("dataset", dataset), ("unpack", unpack)):
                n, dt = fn(list(paths))
                if rnd:
                    results[name] = (n, max(results.get(name, (0, 0.0))[1], n / dt))
        before, after = sample_bytes(list(paths))
    return len(paths), results, before, after


def _report(args, have_fast_pack, n_paths, results, before, after) -> None:
    """Print the rates, their ratios to the floor and the targets (``_measure``'s figures)."""
    f, fk, ld = results["floor"][1], results["floor_keep"][1], results["loader"][1]
    if VERSION == 4:
        from mortal.features.obs_v4 import sp_threads
        cores = f"1 core + {sp_threads()} single-player search threads (floor: v3)"
    else:
        cores = "1 core"
    print(f"{n_paths} gzip logs, feature version {VERSION}, {cores}, best of {args.repeat} rounds, "
          f"packing in {'the compiled core' if have_fast_pack else 'numpy (no compiled core)'}")
    print(f"floor       update + encode_obs               : {f:9.1f} decisions/s ({results['floor'][0]} per pass)")
    print(f"floor_keep  same, retaining the float32 arrays: {fk:9.1f} decisions/s  ratio {fk / f:.2f}")
    labels = {"loader": "gz -> packed per-seat arrays", "dataset": f"FileDatasetsIter -> {BATCH}-batches",
              "unpack": f"{BATCH}-batch -> float32 on the CPU"}
    for name in ("loader", "dataset", "unpack"):
        n, r = results[name]
        print(f"{name:11s} {labels[name]:34s}: {r:9.1f} samples/s ({n} per pass)  "
              f"ratio {r / f:.2f} (vs loader {r / ld:.2f})")
    if VERSION == 4:
        n, r3 = results["loader_v3"]
        print(f"loader_v3   the same at version 3             : {r3:9.1f} samples/s ({n} per pass)  "
              f"v4/v3 loader ratio {ld / r3:.3f}")
    if "floor_pack" in results:
        us = {k: 1e6 / results[k][1] for k in ("floor", "floor_pack", "parse", "loader")}
        rest = us["loader"] - us["floor_pack"] - us["parse"]
        print(f"breakdown per sample: floor {us['floor']:.2f} us, packing +{us['floor_pack'] - us['floor']:.2f} us, "
              f"parse (gunzip + read_log) {us['parse']:.2f} us, the rest of the loader (its Python walk) "
              f"{rest:.2f} us; loader {us['loader']:.2f} us")
        print(f"ceiling with that rest at zero: floor / (floor + packing + parse) = "
              f"{us['floor'] / (us['floor_pack'] + us['parse']):.2f}")
    ratio, batching = ld / f, results["dataset"][1] / ld
    print(f"memory per sample: {before:,} bytes as float32 tuples -> {after:,} bytes packed "
          f"({before / after:.1f}x less)")
    print(f"loader ratio vs floor: {ratio:.2f} (target >= 0.60: {'met' if ratio >= 0.6 else 'NOT met'})")
    print(f"batching ratio vs loader: {batching:.2f} (target >= 0.50: {'met' if batching >= 0.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
