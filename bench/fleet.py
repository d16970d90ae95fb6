#!/usr/bin/env python
"""Self-play throughput of the Ray fleet against the plain client, the same games on the same server.

One server (a big ``capacity``, so nothing waits on a learner) holds fixed random parameters of the quickstart's
network (``--preset``: 'short' is 32x2 with 8-game rounds); no trainer runs. Each arm plays ``--rounds`` rounds in
all, the arms in turn, ``--repeats`` times:

* ``client``: ``python mortal/client.py --rounds R`` with one torch thread (OMP_NUM_THREADS=1), the control an
  actor with ``[fleet] num_cpus = 1`` is measured against;
* ``client-all-threads``: the same with torch's default threads (what a user starting a client gets);
* ``fleet-1``: ``python -m mortal.tools.fleet --actors 1 --rounds R``;
* ``fleet-2``: ``--actors 2 --rounds R`` (the same games, split over two actors).

From the clients' own ``N logs have been submitted`` lines it takes each client's round times after its first
round (start-up and the first round's warm-up excluded) and prints, per arm: steady games/s (the sum over its
clients of games per round / mean round time), its ratio to ``client`` with a 95% bootstrap CI (rounds resampled
within each client), and the whole command's wall time with start-up. The target of issue 15: ``fleet-1`` within
5% of ``client``.

    python bench/fleet.py [--rounds 8] [--repeats 2] [--preset short] [--json out.json]
"""

if __package__ in (None, ''):  # run as a script: python bench/fleet.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SUBMITTED = re.compile(r'(?:\(SelfPlayActor pid=(\d+)\)\s*)?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO '
                       r'mortal\.client: (\d+) logs have been submitted')
ANSI = re.compile(r'\x1b\[[0-9;]*m')
ARMS = ('client', 'client-all-threads', 'fleet-1', 'fleet-2')


def prepare(work: Path, preset: str) -> Path:
    """The quickstart config in ``work`` with a random baseline, a server capacity no round reaches, and no
    tqdm bars; returns the config path."""
    import toml
    import torch
    from mortal.model.networks import Brain, DQN
    from mortal.tools.quickstart_config import write_config
    path = write_config(work, preset=preset)
    raw = toml.load(path)
    raw['online']['server']['capacity'] = 1 << 20
    raw['fleet'] = {'num_cpus': 1.0}
    path.write_text(toml.dumps(raw))
    torch.manual_seed(0)
    r = raw['resnet']
    brain = Brain(version=raw['control']['version'], conv_channels=r['conv_channels'], num_blocks=r['num_blocks'])
    dqn = DQN(version=raw['control']['version'])
    Path(raw['baseline']['train']['state_file']).parent.mkdir(parents=True, exist_ok=True)
    torch.save({'mortal': brain.state_dict(), 'current_dqn': dqn.state_dict(), 'config': raw},
               raw['baseline']['train']['state_file'])
    return path


def submit_params(config: dict) -> None:
    """Give the server one parameter version: the baseline's own weights."""
    import torch
    from mortal.config import typed
    from mortal.net import wire
    state = torch.load(config['baseline']['train']['state_file'], weights_only=True)
    online = typed(config).online
    remote = wire.Remote.from_config(online.remote, online.server)
    reply = remote.request({'type': 'submit_param', 'mortal': wire.pack_state_dict(state['mortal']),
                            'dqn': wire.pack_state_dict(state['current_dqn']), 'is_idle': True})
    assert reply.get('status') == 'ok', reply


def wait_port(host: str, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f'the server did not listen on {host}:{port} within {timeout} s')


def run_arm(arm: str, cfg: Path, rounds: int, log: Path) -> float:
    """Run one arm to its end, output to ``log``; returns its wall time in seconds."""
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', 'RAY_DEDUP_LOGS': '0'}
    env.pop('OMP_NUM_THREADS', None)
    if arm == 'client':
        env['OMP_NUM_THREADS'] = '1'
    if arm.startswith('client'):
        cmd = [sys.executable, str(ROOT / 'mortal' / 'client.py'), '-c', str(cfg), '--rounds', str(rounds)]
    else:
        cmd = [sys.executable, '-m', 'mortal.tools.fleet', '-c', str(cfg), '--actors', arm.split('-')[1],
               '--rounds', str(rounds)]
    t0 = time.perf_counter()
    with open(log, 'wb') as out:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=3600).returncode
    if rc:  # the work dir goes with the bench: show the arm's own words before it does
        tail = '\n'.join(log.read_text(errors='replace').splitlines()[-30:])
        raise RuntimeError(f'arm {arm} exited with {rc}; the end of its output:\n{tail}')
    return time.perf_counter() - t0


def round_times(text: str) -> tuple:
    """``({client: [seconds between two consecutive submissions]}, games per round)`` of one arm's output; clients
    are numbered 0, 1, ... in the order of their first submission (a plain client is 0)."""
    stamps, games = {}, set()
    for pid, stamp, n in SUBMITTED.findall(ANSI.sub('', text)):
        stamps.setdefault(pid, []).append(datetime.strptime(stamp, '%Y-%m-%d %H:%M:%S,%f').timestamp())
        games.add(int(n))
    if len(games) != 1:
        raise RuntimeError(f'expected one round size, got {sorted(games)}')
    return {i: list(np.diff(v)) for i, v in enumerate(stamps.values())}, games.pop()


def steady_rate(times: dict, games: int) -> float:
    """Games/s: the sum over clients of ``games`` / mean round time."""
    return float(sum(games / np.mean(t) for t in times.values() if len(t)))


def ratio_ci(arm: dict, control: dict, games: int, *, n: int = 4000, seed: int = 0) -> tuple:
    """``(ratio, low, high)``: steady games/s of ``arm`` over ``control``, 95% percentile bootstrap (each client's
    round times resampled)."""
    rng = np.random.default_rng(seed)

    def resample(times):
        return {k: rng.choice(t, size=len(t)) for k, t in times.items() if len(t)}

    draws = [steady_rate(resample(arm), games) / steady_rate(resample(control), games) for _ in range(n)]
    low, high = np.percentile(draws, [2.5, 97.5])
    return steady_rate(arm, games) / steady_rate(control, games), float(low), float(high)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=8, help='rounds per arm, over all its clients')
    p.add_argument('--repeats', type=int, default=2, help='passes over the arms')
    p.add_argument('--preset', default='short', choices=('short', 'full'))
    p.add_argument('--arms', nargs='+', default=list(ARMS), choices=ARMS)
    p.add_argument('--json', default=None, help='also write the results here')
    args = p.parse_args(argv)
    if 'client' not in args.arms:
        p.error("the arms must include 'client', the control")
    from mortal.config import load_config
    with tempfile.TemporaryDirectory(prefix='bench-fleet-') as tmp:
        work = Path(tmp)
        cfg = prepare(work, args.preset)
        config = load_config(cfg, env={})
        server_log = open(work / 'server.log', 'wb')
        server = subprocess.Popen([sys.executable, str(ROOT / 'mortal' / 'server.py'), '-c', str(cfg)], cwd=ROOT,
                                  stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            remote = config['online']['remote']
            wait_port(remote['host'], remote['port'])
            submit_params(config)
            times = {a: {} for a in args.arms}
            walls = {a: [] for a in args.arms}
            games = None
            for rep in range(args.repeats):
                for arm in args.arms:
                    log = work / f'{arm}-{rep}.log'
                    walls[arm].append(run_arm(arm, cfg, args.rounds, log))
                    per_client, games = round_times(log.read_text(errors='replace'))
                    for k, t in per_client.items():  # client k of every pass: its round times pooled
                        times[arm].setdefault(k, []).extend(t)
                    print(f'  pass {rep + 1} {arm}: {walls[arm][-1]:.1f} s', flush=True)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
            server_log.close()
    cores = os.cpu_count()
    print(f'\nself-play, {args.rounds} rounds of {games} games per arm x {args.repeats} passes, {cores} cores')
    print(f'{"arm":<20} {"games/s":>8} {"ratio to client (95% CI)":>28} {"wall s (start-up incl.)":>24}')
    results = {}
    for arm in args.arms:
        rate = steady_rate(times[arm], games)
        ratio = ratio_ci(times[arm], times['client'], games)
        results[arm] = {'games_per_s': rate, 'ratio_to_client': ratio, 'wall_s': walls[arm]}
        print(f'{arm:<20} {rate:>8.3f} {ratio[0]:>12.3f} ({ratio[1]:.3f}-{ratio[2]:.3f}) '
              f'{np.mean(walls[arm]):>18.1f}')
    if args.json:
        Path(args.json).write_text(json.dumps({'rounds': args.rounds, 'games_per_round': games,
                                               'repeats': args.repeats, 'cores': cores, 'arms': results}, indent=1))


if __name__ == '__main__':
    main()
