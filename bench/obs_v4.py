"""Time per observation encode: v4 (mortal.features.obs_v4) vs v3 (mjai's Rust encoder) in the same run.

Replays a real mjai log for one seat and, at every decision point, times
``PlayerState.encode_obs(3, False)`` and ``V4Encoder.encode``. Prints median,
p99 and mean (milliseconds) of both and their ratios (v4 / v3). By default the
single-player search runs on the compiled core after one untimed pass over the
log (its shanten tables fill lazily, once per process).

    python bench/obs_v4.py [--log tests/data/meta_annotated_hanchan.jsonl] [--seat 0] [--limit 200]
"""

if __package__ in (None, ''):  # run as a script: python bench/obs_v4.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import json
import time

import numpy as np


def _replay(path, seat, limit):
    from mjai.mlibriichi.state import PlayerState
    from mortal.features.obs_v4 import V4Encoder

    ps, enc = PlayerState(seat), V4Encoder(seat)
    t3, t4 = [], []
    with open(path) as f:
        for line in f:
            event = json.loads(line)
            event.pop('meta', None)
            cans = ps.update(json.dumps(event))
            enc.update(event)
            if event['type'] in ('hora', 'ryukyoku', 'end_kyoku', 'end_game') or not cans.can_act:
                continue
            s = time.perf_counter()
            ps.encode_obs(3, False)
            t3.append(time.perf_counter() - s)
            s = time.perf_counter()
            enc.encode(ps, False)
            t4.append(time.perf_counter() - s)
            if len(t4) >= limit:
                break
    return np.array(t3) * 1e3, np.array(t4) * 1e3


def main(argv=None):
    from mortal import entry

    ap = entry.parser(__doc__.splitlines()[0], config=False)
    ap.add_argument('--log', default='tests/data/meta_annotated_hanchan.jsonl')
    ap.add_argument('--seat', type=int, default=0)
    ap.add_argument('--limit', type=int, default=200, help='decision points to time')
    args = entry.start(ap, argv, log_level=None)

    import mortal.features.sp.calc as sp_calc
    if not sp_calc.HAVE_CORE:
        raise SystemExit(sp_calc.CORE_MISSING)
    _replay(args.log, args.seat, args.limit)  # untimed: fills the shanten tables
    a3, a4 = _replay(args.log, args.seat, args.limit)
    m3, m4 = np.median(a3), np.median(a4)
    p3, p4 = np.percentile(a3, 99), np.percentile(a4, 99)
    print(f'decisions timed: {len(a4)} ({args.log}, seat {args.seat})')
    print(f'v3 encode: median {m3:.3f} ms  p99 {p3:.3f} ms  mean {a3.mean():.3f} ms')
    print(f'v4 encode: median {m4:.3f} ms  p99 {p4:.3f} ms  mean {a4.mean():.3f} ms  max {a4.max():.1f} ms')
    print(f'ratio v4/v3: median {m4 / m3:.0f}x  p99 {p4 / p3:.0f}x  mean {a4.mean() / a3.mean():.0f}x')
    _loader(args.log)


def _loader(path):
    """Training loader (all four seats of the log): samples/s at version 3 and 4, one core."""
    from mortal.data.gameplay import GameplayLoader

    with open(path) as f:
        raw = f.read()
    rates = {}
    for version in (3, 4):
        t0 = time.perf_counter()
        samples = sum(len(g.take("actions")) for g in GameplayLoader(version).load_log(raw, path))
        rates[version] = samples / (time.perf_counter() - t0)
        print(f'loader v{version}: {rates[version]:8.0f} samples/s ({samples} samples)')
    print(f'loader v4/v3 throughput ratio: {rates[4] / rates[3]:.3f}')


if __name__ == '__main__':
    main()
