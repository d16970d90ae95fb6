"""Time per observation encode: v4 (mortal.obs_v4, pure-Python SP block) vs v3 (mjai Rust) in the same run.

Replays a real mjai log for one seat and, at every decision point, times
``PlayerState.encode_obs(3, False)`` and ``V4Encoder.encode``. Prints median and
p99 (milliseconds) of both and their ratios (v4 / v3).

    python bench/obs_v4.py [--log tests/data/meta_annotated_hanchan.jsonl] [--seat 0] [--limit 60]
"""

if __package__ in (None, ''):  # run as a script: python bench/obs_v4.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import json
import os
import time

import numpy as np


def main(argv=None):
    os.environ.pop('RUST_BACKTRACE', None)
    from mjai.mlibriichi.state import PlayerState
    from mortal.obs_v4 import V4Encoder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--log', default='tests/data/meta_annotated_hanchan.jsonl')
    ap.add_argument('--seat', type=int, default=0)
    ap.add_argument('--limit', type=int, default=60, help='decision points to time')
    args = ap.parse_args(argv)

    ps, enc = PlayerState(args.seat), V4Encoder(args.seat)
    t3, t4 = [], []
    with open(args.log) as f:
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
            if len(t4) >= args.limit:
                break
    a3, a4 = np.array(t3) * 1e3, np.array(t4) * 1e3
    m3, m4 = np.median(a3), np.median(a4)
    p3, p4 = np.percentile(a3, 99), np.percentile(a4, 99)
    print(f'decisions timed: {len(a4)}')
    print(f'v3 encode: median {m3:.3f} ms  p99 {p3:.3f} ms')
    print(f'v4 encode: median {m4:.3f} ms  p99 {p4:.3f} ms  max {a4.max():.1f} ms')
    print(f'ratio v4/v3: median {m4 / m3:.0f}x  p99 {p4 / p3:.0f}x')


if __name__ == '__main__':
    main()
