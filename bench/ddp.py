"""Offline step time on 2 processes (torchrun, DDP, gloo on CPU) against 1, in the same run.

Trains the offline path of ``mortal/train.py`` (the real entry point, started by ``python -m torch.distributed.run
--nproc_per_node K``) on copies of the fixture logs (tests/data/*.jsonl) with the quickstart's embedded network and
batch (``mortal.tools.quickstart_config``: version 3, 32 channels x 2 blocks, batch 64, 1 loader worker per process),
once with K = 1 (no process group: the one-process path) and once with K = 2, and prints for each:

* seconds per optimizer step on rank 0 (time between the ends of consecutive ``train_batch`` calls, loading, saving
  and the all-reduce included; the first ``--warmup`` steps left out), mean and a 95% CI of the mean (normal
  approximation over steps; steps are not independent: a file batch is decoded at once, so the CI is optimistic);
* samples/s overall (K x batch / step time);
* the ratio of the 2-process step time to the 1-process one.

The ranks share the machine's cores with each other and with their loader workers: on 2 cores, 2 ranks cannot
beat 1 by much, and the figure says what DDP costs there rather than what it gains on a machine with a core (or a
GPU) per rank. Usage: ``python bench/ddp.py [--copies 8] [--ranks 2] [--warmup 5]`` (about a minute on 2 cores).
"""

if __package__ in (None, ''):  # run as a script: python bench/ddp.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / 'tests' / 'data').glob('*.jsonl'))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def prepare(work: pathlib.Path, copies: int) -> pathlib.Path:
    """``work/config.toml``: the embedded config made offline, over ``copies`` copies of each fixture log, with a
    random GRP and baseline (the numbers of the rewards do not change the time). Returns the config's path."""
    import toml
    import torch
    from mortal.model.networks import GRP, AuxNet, Brain, DQN
    from mortal.tools.quickstart_config import render_config

    cfg = toml.loads(render_config(work, preset='full'))
    data = work / 'logs'
    data.mkdir(parents=True)
    for i in range(copies):
        for p in FIXTURES:
            shutil.copy(p, data / f'{p.stem}_{i:03d}.json')  # strided shards get both kinds
    control = cfg['control']
    control.update(online=False, state_file=str(work / 'mortal.pth'), best_state_file=str(work / 'best.pth'),
                   tensorboard_dir=str(work / 'tb'), test_every=10 ** 6)  # no test play inside the timing
    cfg['freeze_bn']['mortal'] = False  # offline, as the bootstrap's
    cfg['dataset'].update(globs=[str(data / '*.json')], file_index=str(work / 'file_index.pth'))
    cfg['optim']['scheduler'].update(peak=1e-4, final=1e-4)
    torch.manual_seed(0)
    pathlib.Path(cfg['grp']['state_file']).parent.mkdir(parents=True, exist_ok=True)
    torch.save({'model': GRP(**cfg['grp']['network']).state_dict()}, cfg['grp']['state_file'])
    r = cfg['resnet']
    brain = Brain(version=control['version'], conv_channels=r['conv_channels'], num_blocks=r['num_blocks'])
    baseline = {'mortal': brain.state_dict(), 'current_dqn': DQN(version=control['version']).state_dict(),
                'aux_net': AuxNet((4,)).state_dict(), 'config': cfg, 'steps': 0}
    for slot in ('train', 'test'):
        path = pathlib.Path(cfg['baseline'][slot]['state_file'])
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(baseline, path)
    path = work / 'config.toml'
    path.write_text(toml.dumps(cfg))
    return path


def worker(config_path: str, out: str) -> None:
    """One rank: ``mortal.train.main`` with the end of each ``train_batch`` timed; rank 0 writes the times."""
    from mortal import train as tr
    times = []
    train_batch = tr.Trainer.train_batch

    def timed(self, *batch):
        train_batch(self, *batch)
        times.append(time.perf_counter())
    tr.Trainer.train_batch = timed
    try:
        tr.main(['-c', config_path])
    except SystemExit as exc:
        if exc.code:
            raise
    if int(os.environ.get('RANK', '0')) == 0:
        pathlib.Path(out).write_text(json.dumps(times))


def run(ranks: int, config_path: pathlib.Path, out: pathlib.Path) -> list:
    """Seconds between consecutive optimizer steps of a K-process run (rank 0's)."""
    env = dict(os.environ, OMP_NUM_THREADS='1')  # torchrun's default; the same for K = 1
    for key in ('WORLD_SIZE', 'RANK', 'LOCAL_RANK'):
        env.pop(key, None)
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(ranks), '--master_addr',
           '127.0.0.1', '--master_port', str(free_port()), str(pathlib.Path(__file__).resolve()), '--worker',
           str(config_path), str(out)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f'{ranks} processes failed:\n{proc.stderr[-3000:]}')
    ends = json.loads(out.read_text())
    return [b - a for a, b in zip(ends, ends[1:])]


def summary(steps: list, warmup: int) -> tuple:
    """(mean, 95% CI half-width, n) of ``steps`` after the first ``warmup``."""
    kept = steps[warmup:]
    if len(kept) < 2:
        sys.exit(f'only {len(kept)} timed steps: raise --copies')
    mean = statistics.fmean(kept)
    return mean, 1.96 * statistics.stdev(kept) / len(kept) ** 0.5, len(kept)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--copies', type=int, default=8, help='copies of each fixture log (2 hanchan, ~1,200 samples)')
    p.add_argument('--ranks', type=int, default=2, help='processes of the multi-process run')
    p.add_argument('--warmup', type=int, default=5, help='first steps of each run left out')
    p.add_argument('--worker', nargs=2, metavar=('CONFIG', 'OUT'), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    from mortal.tools.quickstart_config import PRESETS
    batch = PRESETS['full']['batch_size']
    print(f'CPU cores: {os.cpu_count()}; {args.copies * len(FIXTURES)} log files; embedded network '
          f'(version 3, 32 x 2), batch {batch} per process, 1 loader worker per process, gloo')
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in (1, args.ranks):
            work = pathlib.Path(tmp) / f'k{k}'
            config_path = prepare(work, args.copies)
            t0 = time.perf_counter()
            steps = run(k, config_path, work / 'times.json')
            mean, ci, n = summary(steps, args.warmup)
            results[k] = mean
            print(f'{k} process{"es" if k > 1 else "  "}: {mean:.4f} s/step +- {ci:.4f} (95% CI, {n} steps), '
                  f'{k * batch / mean:,.0f} samples/s overall, run {time.perf_counter() - t0:.0f} s')
    ratio = results[args.ranks] / results[1]
    print(f'step time {args.ranks} / 1 processes: {ratio:.2f}; samples/s {args.ranks} / 1: '
          f'{args.ranks / ratio:.2f}')


if __name__ == '__main__':
    main()
