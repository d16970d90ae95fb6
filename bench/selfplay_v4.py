"""Self-play throughput of observation version 4 against version 3, measured in the same run.

Plays the same OneVsThree seeds twice with a freshly initialised Brain+DQN of
the same size, once at version 3 and once at version 4 (the only difference is
the input rows: 934 vs 1012, and v4's single-player search), and prints engine
rows (decisions) per second of each and their ratio. Issue 7's target is a
ratio of at least 0.5. A second pair of runs with a zero-cost policy shows the
encoding cost alone (no model). One untimed v4 run first fills the
single-player core's lazily built shanten tables (once per process, as in a
long-running client).

    python bench/selfplay_v4.py [--seeds 4] [--repeat 3] [--channels 64] [--blocks 4] [--sp-threads N]
"""

if __package__ in (None, ''):  # run as a script: python bench/selfplay_v4.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import time

import numpy as np


def _rows_per_s(make_engine, seeds):
    from mortal.play.arena import OneVsThree

    rows = [0]

    class Counted:
        def __init__(self, engine):
            self._engine = engine

        def __getattr__(self, name):
            return getattr(self._engine, name)

        def react_batch(self, obs, masks, invisible_obs=None):
            rows[0] += len(obs)
            return self._engine.react_batch(obs, masks, invisible_obs)

    arena = OneVsThree(disable_progress_bar=True)
    t0 = time.perf_counter()
    arena.py_vs_py(Counted(make_engine("challenger")), Counted(make_engine("champion")),
                   seed_start=(1, 2024), seed_count=seeds)
    wall = time.perf_counter() - t0
    return rows[0] / wall, rows[0], wall


def main(argv=None):
    from mortal import entry

    p = entry.parser(__doc__.splitlines()[0], config=False)
    p.add_argument("--seeds", type=int, default=4, help="nonces; games = 4 * seeds per run")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--repeat", type=int, default=3, help="v3/v4 pairs per policy (the median ratio is kept)")
    p.add_argument("--sp-threads", type=int, default=None,
                   help="threads of the v4 single-player search (default: MORTAL_SP_THREADS, else min(8, CPUs))")
    args = entry.start(p, argv, log_level=None)

    import torch
    from bench.arena import FirstLegal
    from mortal.play.engine import MortalEngine
    from mortal.model.networks import DQN, Brain
    import mortal.features.obs_v4 as obs_v4

    torch.set_num_threads(args.threads)
    if args.sp_threads is not None:
        obs_v4.SP_THREADS = args.sp_threads

    def model_engine(version):
        def make(name):
            torch.manual_seed(0)
            brain = Brain(conv_channels=args.channels, num_blocks=args.blocks, version=version).eval()
            return MortalEngine(brain, DQN(version=version).eval(), version=version,
                                device=torch.device("cpu"), name=name)
        return make

    def floor_engine(version):
        return lambda name: FirstLegal(name, version)

    print(f"games per run: {4 * args.seeds}; model Brain(conv_channels={args.channels}, num_blocks={args.blocks}) "
          f"+ DQN on cpu, torch threads {torch.get_num_threads()}, SP threads {obs_v4.sp_threads()}")
    _rows_per_s(floor_engine(4), 1)  # untimed: fills the single-player core's shanten tables, once per process
    for label, factory in (("zero-cost policy", floor_engine), ("model", model_engine)):
        ratios = []
        for r in range(args.repeat):  # v3 and v4 back to back, so a drift of the machine hits both
            rates = {}
            for version in (3, 4):
                rates[version], rows, wall = _rows_per_s(factory(version), args.seeds)
                print(f"{label:16s} v{version}: {rates[version]:8.0f} rows/s ({rows} rows in {wall:.1f} s)")
            ratios.append(rates[4] / rates[3])
        print(f"{label:16s} v4/v3 throughput ratio: {np.median(ratios):.3f} (median of {args.repeat}: "
              f"{', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
