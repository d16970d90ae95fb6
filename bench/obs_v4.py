"""Time per version-4 decision: ``V4Encoder.encode`` at every decision of every seat of real mjai logs, beside
v3's ``PlayerState.encode_obs(3, False)``, in the same run.

Replays each log for all four seats; at every decision point times ``encode_obs(3)`` and ``V4Encoder.encode``
(the v3 encode, the single-player search and its rows: a whole v4 observation) in wall time and in CPU time of
the thread (steadier on a shared machine). Prints median, p99 and mean in µs, and how much of the mean CPU time
is spent inside the compiled core's search call. One untimed pass first fills the
single-player core's lazily built shanten tables (once per process, as in a long-running client).

With ``--against OLD`` (another checkout), runs itself ``--rounds`` times on each tree, alternating (old, new,
old, new, ...), each a fresh process pinned to one core (``taskset -c 0`` where it exists), and prints every
round's figures and the median ratios old / new with their spread. With ``--loader`` it also times the training
loader (all seats of the first log) at v3 and v4.

    python bench/obs_v4.py [--log PATH ...] [--loader] [--against OLD --rounds 3] [--json PATH]
"""

if __package__ in (None, ''):  # run as a script: python bench/obs_v4.py (--against: on the tree OBS_V4_TREE)
    import os, sys, pathlib
    sys.path[0] = os.environ.get('OBS_V4_TREE') or str(pathlib.Path(__file__).resolve().parent.parent)

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOGS = ('tests/data/meta_annotated_hanchan.jsonl', 'tests/data/riichienv_selfplay_hanchan.jsonl')
_ENDS = ('hora', 'ryukyoku', 'end_kyoku', 'end_game')


def _events(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                event = json.loads(line)
                event.pop('meta', None)
                out.append(event)
    return out


def _replay(logs, out=None):
    """Encode every decision of every seat of ``logs`` (lists of events); ``out``: dict of lists of µs to fill
    (v3 / v4, wall / cpu)."""
    from mjai.mlibriichi.state import PlayerState
    from mortal.features.obs_v4 import V4Encoder

    wall, cpu = time.perf_counter, time.thread_time
    for events in logs:
        for seat in range(4):
            ps, enc = PlayerState(seat), V4Encoder(seat)
            for event in events:
                cans = ps.update(json.dumps(event))
                enc.update(event)
                if event['type'] in _ENDS or not cans.can_act:
                    continue
                w, c = wall(), cpu()
                ps.encode_obs(3, False)
                w3, c3 = wall(), cpu()
                enc.encode(ps, False)
                w4, c4 = wall(), cpu()
                if out is not None:
                    for key, v in (('v3_wall', w3 - w), ('v3_cpu', c3 - c), ('v4_wall', w4 - w3), ('v4_cpu', c4 - c3)):
                        out[key].append(v * 1e6)


def _time_core_calls(box: list) -> None:
    """Wrap the core's search entry point (``sp_rows``; ``sp_calc_batch`` on an older tree) so that its thread CPU
    time adds up in ``box[0]`` (µs)."""
    from mortal.features.sp import _core

    name = 'sp_rows' if hasattr(_core, 'sp_rows') else 'sp_calc_batch'
    real = getattr(_core, name)

    def timed(*args):
        t = time.thread_time()
        try:
            return real(*args)
        finally:
            box[0] += (time.thread_time() - t) * 1e6

    setattr(_core, name, timed)


def measure(log_paths) -> dict:
    """``{key: {'median', 'p99', 'mean'}}`` µs per decision (keys v3_wall, v3_cpu, v4_wall, v4_cpu),
    ``decisions`` and ``search_cpu_mean``: the mean CPU µs per decision inside the core's search call."""
    logs = [_events(p) for p in log_paths]
    _replay(logs)  # untimed: fills the shanten tables
    box = [0.0]
    _time_core_calls(box)
    times = {k: [] for k in ('v3_wall', 'v3_cpu', 'v4_wall', 'v4_cpu')}
    _replay(logs, times)
    out = {'decisions': len(times['v4_wall']), 'search_cpu_mean': box[0] / len(times['v4_wall'])}
    for key, v in times.items():
        a = np.asarray(v)
        out[key] = {'median': float(np.median(a)), 'p99': float(np.percentile(a, 99)), 'mean': float(a.mean())}
    return out


def _loader(path):
    """Training loader (all four seats of the log): samples/s at version 3 and 4, one core."""
    from mortal.data.gameplay import GameplayLoader

    with open(path) as f:
        raw = f.read()
    for version in (3, 4):
        t0 = time.perf_counter()
        samples = sum(len(g.take("actions")) for g in GameplayLoader(version).load_log(raw, path))
        print(f'loader v{version}: {samples / (time.perf_counter() - t0):8.0f} samples/s ({samples} samples)')


def _line(label, r):
    v4w, v4c, v3c = r['v4_wall'], r['v4_cpu'], r['v3_cpu']
    return (f"{label:>4s} v4 µs/decision: wall median {v4w['median']:6.0f} p99 {v4w['p99']:6.0f} mean {v4w['mean']:5.0f}"
            f" | cpu median {v4c['median']:6.0f} p99 {v4c['p99']:6.0f} mean {v4c['mean']:5.0f}"
            f" | of the cpu mean: search {r['search_cpu_mean']:4.0f}, v3 encode {v3c['mean']:3.0f}")


def against(old: str, rounds: int, log_paths, json_path=None) -> None:
    """Rounds of (old tree, this tree), each a fresh pinned process of this bench; prints the figures and the
    median ratios old / new with their range over the rounds."""
    pin = ['taskset', '-c', '0'] if shutil.which('taskset') else []
    logs = [str(pathlib.Path(p).resolve()) for p in log_paths]
    runs = {'old': [], 'new': []}
    for r in range(rounds):
        for label, tree in (('old', old), ('new', str(ROOT))):
            with tempfile.NamedTemporaryFile(suffix='.json') as tmp:
                env = dict(os.environ, PYTHONPATH=tree, OBS_V4_TREE=tree)
                subprocess.run(pin + [sys.executable, str(ROOT / 'bench' / 'obs_v4.py'), '--json', tmp.name,
                                      '--log', *logs], check=True, cwd=tree, env=env, stdout=subprocess.DEVNULL)
                res = json.load(open(tmp.name))
            runs[label].append(res)
            print(_line(f'{label}{r + 1}', res), flush=True)
    print(f"decisions per run: {runs['new'][0]['decisions']}; pinned to one core: {bool(pin)}")
    for label in ('old', 'new'):
        search = statistics.median(r['search_cpu_mean'] for r in runs[label])
        total = statistics.median(r['v4_cpu']['mean'] for r in runs[label])
        print(f"{label}: cpu mean {total:.0f} µs per decision = core search call {search:.0f} + the rest "
              f"(Python around it, the v3 encode inside V4Encoder.encode) {total - search:.0f}")
    for key in ('v4_cpu', 'v4_wall'):
        for stat in ('median', 'p99', 'mean'):
            ratios = [o[key][stat] / n[key][stat] for o, n in zip(runs['old'], runs['new'])]
            olds = [o[key][stat] for o in runs['old']]
            news = [n[key][stat] for n in runs['new']]
            print(f"{key} {stat:6s}: old {statistics.median(olds):6.0f} new {statistics.median(news):6.0f} µs; "
                  f"old/new {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")
    if json_path:
        _write_json(json_path, runs)


def _write_json(path, obj):
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def main(argv=None):
    from mortal import entry

    ap = entry.parser(__doc__.splitlines()[0], config=False)
    ap.add_argument('--log', nargs='+', default=[str(ROOT / p) for p in LOGS], help='mjai logs (.jsonl) to replay')
    ap.add_argument('--loader', action='store_true', help='also time the training loader at v3 and v4')
    ap.add_argument('--against', metavar='OLD', help='another checkout: interleaved fresh processes, old vs this')
    ap.add_argument('--rounds', type=int, default=3, help='(old, new) pairs with --against')
    ap.add_argument('--json', help='write the figures here')
    args = entry.start(ap, argv, log_level=None)

    if args.against:
        against(args.against, args.rounds, args.log, args.json)
        return
    import mortal.features.sp.calc as sp_calc
    if not sp_calc.HAVE_CORE:
        raise SystemExit(sp_calc.CORE_MISSING)
    res = measure(args.log)
    if args.json:
        _write_json(args.json, res)
    print(f"decisions timed: {res['decisions']} (all seats of {len(args.log)} logs)")
    print(_line('', res))
    if args.loader:
        _loader(args.log[0])


if __name__ == '__main__':
    main()
