"""Packed-observation coverage: does every decision of many unusual games pack exactly at versions 1-4?

``mortal.features.packed_obs.REAL_ROWS`` lists the rows that may hold values other than 0.0/1.0; a sample with such a
value elsewhere is refused and its whole file skipped (reported). This plays ``--seeds`` x 4 games of two tiny
freshly initialised engines that explore hard (Boltzmann ``--epsilon`` at ``--temp``: many calls and kans, long
honba runs), loads every log at versions 1-4, plain and augmented, and prints the samples and the files skipped
per version, with the counts of the events that shape the rows (calls, kans, riichi, hora, ryukyoku, the highest
honba). A skipped file names the row and column that did not pack.

Usage: ``python bench/packed_coverage.py [--seeds 50] [--epsilon 0.7] [--temp 5.0] [--versions 1 2 3 4]``
"""

if __package__ in (None, ''):  # run as a script: python bench/packed_coverage.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import collections
import glob
import gzip
import json
import tempfile
import time


def play(log_dir, seeds, epsilon, temp):
    import torch
    from mortal.model.networks import Brain, DQN
    from mortal.play.arena import OneVsThree
    from mortal.play.engine import MortalEngine

    torch.manual_seed(0)
    engines = [MortalEngine(Brain(version=3, conv_channels=16, num_blocks=1).eval(), DQN(version=3).eval(), version=3,
                            device=torch.device('cpu'), name=name, boltzmann_epsilon=epsilon, boltzmann_temp=temp,
                            top_p=1.0)
               for name in ('a', 'b')]
    OneVsThree(disable_progress_bar=True, log_dir=log_dir).py_vs_py(challenger=engines[0], champion=engines[1],
                                                                      seed_start=(77, 1234), seed_count=seeds)
    return sorted(glob.glob(f'{log_dir}/*.json.gz'))


def event_counts(files):
    counts, honba = collections.Counter(), 0
    for f in files:
        with gzip.open(f, 'rt') as lines:
            for line in lines:
                ev = json.loads(line)
                counts[ev['type']] += 1
                if ev['type'] == 'start_kyoku':
                    honba = max(honba, ev['honba'])
    keys = ('start_kyoku', 'chi', 'pon', 'daiminkan', 'kakan', 'ankan', 'reach_accepted', 'hora', 'ryukyoku')
    return {k: counts[k] for k in keys}, honba


def main(argv=None):
    from mortal import entry

    p = entry.parser(__doc__.splitlines()[0], config=False)
    p.add_argument('--seeds', type=int, default=50, help='duplicate deals; games = 4 * seeds')
    p.add_argument('--epsilon', type=float, default=0.7, help='Boltzmann epsilon of both engines')
    p.add_argument('--temp', type=float, default=5.0, help='Boltzmann temperature of both engines')
    p.add_argument('--versions', type=int, nargs='+', default=[1, 2, 3, 4], choices=(1, 2, 3, 4))
    args = entry.start(p, argv, log_level=None)
    import torch
    from mortal.data.gameplay import GameplayLoader

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        files = play(d, args.seeds, args.epsilon, args.temp)
        counts, honba = event_counts(files)
        print(f'{len(files)} games in {time.perf_counter() - t:.0f} s; events {counts}, highest honba {honba}')
        refused = 0
        for version in args.versions:
            for augmented in (False, True):
                t = time.perf_counter()
                loader = GameplayLoader(version, augmented=augmented)
                n = sum(len(g) for games in loader.load_gz_log_files(files) for g in games)
                refused += loader.skipped
                print(f'version {version}, augmented {augmented}: {n} samples, {loader.skipped} files skipped '
                      f'({time.perf_counter() - t:.0f} s)')
                for path, message in loader.skipped_files[:3]:
                    print(f'  {message}')
    print('every decision packed exactly' if not refused else f'{refused} files skipped: see above')
    return 1 if refused else 0


if __name__ == '__main__':
    raise SystemExit(main())
