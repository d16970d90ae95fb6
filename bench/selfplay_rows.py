"""The quickstart's self-play, this tree against another checkout: rows per second of one client round.

Issue 32 part 2 asks for the quickstart config's self-play at 2.5x the rows/s of the code path the issue measured,
on 2 cores, in one run. Each run is a fresh process that imports ``mortal`` from its tree and plays one round as
that tree's client does with the embedded config: ``OneVsThree`` with logs written (the client's gzip level where
the tree has one), the trainee greedy with Boltzmann exploration (epsilon 0.005, temperature 0.05), the baseline
greedy with the agari guard, one torch thread (the quickstart sets ``OMP_NUM_THREADS=1`` on up to 4 cores), and
``4 * seeds`` games, where ``seeds`` is the tree's own ``train_games / 4`` of the embedded ``full`` preset unless
``--seeds`` / ``--old-seeds`` say otherwise. Both trees load the same weights: ``--state`` (a checkpoint with
``mortal`` and ``current_dqn``, 32x2 version 3 like the quickstart's), else a fresh 32x2 model with random
BatchNorm statistics (``bench/forward.py``'s ``trained_like``). The trees alternate (old, new, old, new ...); the
bench prints each run's rows, rows/s (wall) and CPU µs a row, then new/old rows/s per pair: median and range.
A row is one observation handed to an engine (both sides), as ``bench/forward.py --selfplay`` counts it.

Usage: ``python bench/selfplay_rows.py --against OLD [--pairs 5] [--state CKPT] [--seeds N] [--old-seeds N]``
"""

if __name__ == '__main__' and __package__ in (None, ''):  # run as a script: python bench/selfplay_rows.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()


def embedded_seeds() -> int:
    """``train_games / 4`` of the embedded ``full`` preset of the imported tree (its module moved in issue 34)."""
    try:
        from mortal.tools.quickstart_config import PRESETS
    except ImportError:
        from mortal.quickstart_config import PRESETS
    return PRESETS['full']['train_games'] // 4


def child(tree: str, state: str, seeds: int) -> dict:
    """One round in this process on ``tree``'s ``mortal``; returns rows, wall and CPU seconds, games."""
    sys.path.insert(0, str(HERE.parent))
    from forward import CountingEngine  # this tree's bench; mortal from ``tree``
    sys.path.insert(0, tree)
    import inspect

    import torch
    import mortal
    from mortal.model.networks import DQN, Brain
    from mortal.play.arena import OneVsThree
    from mortal.play.engine import MortalEngine

    if pathlib.Path(tree).resolve() not in pathlib.Path(mortal.__file__).resolve().parents:
        raise SystemExit(f"{tree}: mortal imported from {mortal.__file__}")
    torch.set_num_threads(1)
    ck = torch.load(state, map_location='cpu', weights_only=False)
    brain, dqn = Brain(version=3, conv_channels=32, num_blocks=2), DQN(version=3)
    brain.load_state_dict(ck['mortal'])
    dqn.load_state_dict(ck['current_dqn'])
    brain.eval()
    dqn.eval()
    seeds = seeds or embedded_seeds()
    rows = [0]
    trainee = MortalEngine(brain, dqn, version=3, name='trainee', boltzmann_epsilon=0.005, boltzmann_temp=0.05,
                           seed=0)
    baseline = MortalEngine(brain, dqn, version=3, name='baseline', enable_rule_based_agari_guard=True)
    kw = {'log_compresslevel': 1} if 'log_compresslevel' in inspect.signature(OneVsThree).parameters else {}
    with tempfile.TemporaryDirectory() as log_dir:
        arena = OneVsThree(disable_progress_bar=True, log_dir=log_dir, **kw)
        t0, c0 = time.perf_counter(), time.process_time()
        arena.py_vs_py(CountingEngine(trainee, rows), CountingEngine(baseline, rows), seed_start=(10000, 2024),
                       seed_count=seeds)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {'rows': rows[0], 'wall': wall, 'cpu': cpu, 'games': 4 * seeds}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--against', required=True, metavar='OLD', help='the other checkout')
    p.add_argument('--pairs', type=int, default=5)
    p.add_argument('--state', default=None, help='checkpoint with mortal / current_dqn (32x2, version 3)')
    p.add_argument('--seeds', type=int, default=0, help="this tree's nonces (0: its embedded train_games / 4)")
    p.add_argument('--old-seeds', type=int, default=0, help="the old tree's nonces (0: its own train_games / 4)")
    p.add_argument('--child', nargs=3, metavar=('TREE', 'STATE', 'SEEDS'), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]))))
        return None
    trees = {'old': (pathlib.Path(args.against).resolve(), args.old_seeds), 'new': (HERE.parent.parent, args.seeds)}
    runs = {'old': [], 'new': []}
    with tempfile.TemporaryDirectory() as d:
        state = args.state
        if state is None:
            import torch
            sys.path.insert(0, str(HERE.parent))
            from forward import trained_like
            brain, dqn = trained_like(3, 32, 2)
            state = os.path.join(d, 'weights.pth')
            torch.save({'mortal': brain.state_dict(), 'current_dqn': dqn.state_dict()}, state)
        for pair in range(args.pairs):
            for name, (tree, seeds) in trees.items():
                env = dict(os.environ, OMP_NUM_THREADS='1')
                out = subprocess.run([sys.executable, str(HERE), '--against', str(tree), '--child', str(tree), state,
                                      str(seeds)], check=True, capture_output=True, text=True, env=env).stdout
                r = json.loads(out.strip().splitlines()[-1])
                runs[name].append(r)
                print(f"pair {pair + 1} {name}: {r['games']} games, {r['rows']} rows in {r['wall']:.1f} s = "
                      f"{r['rows'] / r['wall']:.0f} rows/s; CPU {r['cpu'] / r['rows'] * 1e6:.0f} µs/row", flush=True)
    ratios = [(n['rows'] / n['wall']) / (o['rows'] / o['wall']) for o, n in zip(runs['old'], runs['new'])]
    cpu = [(o['cpu'] / o['rows']) / (n['cpu'] / n['rows']) for o, n in zip(runs['old'], runs['new'])]
    print(f"new/old rows/s: median {statistics.median(ratios):.2f} (pairs {min(ratios):.2f}-{max(ratios):.2f}); "
          f"CPU per row old/new: median {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f})")
    return runs


if __name__ == '__main__':
    main()
