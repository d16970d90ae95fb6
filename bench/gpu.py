"""GPU benchmark: self-play, trainer, memory and the learner's idle time of Mortal's 192x40 network on one card.

    bash bench/gpu.sh [--quick|--cpu-smoke] [--arena] [DIR]   # offline set-up + this driver; results in $OUT, else DIR
    python bench/gpu.py run --out DIR [--quick|--cpu-smoke] [--parts all|arena] [--set KEY=VALUE ...]  # driver alone

Parts, each in processes of its own with a hard time limit, each writing its piece of ``results.json`` as soon as
it ends (a part that fails or runs out of time records why and the others still run):

* ``profile``: where one client's cycle (a forward and the arena's work until the next) goes: the arena's CPU, the
  engine's CPU, the wait and the GPU's busy time (``bench/gpu_profile.py``; torch.profiler's op tables in
  ``logs/profile_ops.txt``).
* ``selfplay_sweep``: the box's hanchan per hour of the client's self-play path (``TrainPlayer.train_play``: the
  trainee with Boltzmann exploration against the greedy baseline, 1v3 duplicate, gz mjai logs written) with 1, 2,
  4, 8 and 12 client processes (those the box has cores for), at feature version 3 and 4; every figure from games
  that finished, with their count and its basis (whole rounds, or games finished in the window), and an estimate
  from rows/s where none finished (``bench/gpu_selfplay.py``). Also rows/s, rows per forward, each client's share
  of CPU time and its peak GPU memory. The networks are freshly initialised (no Mortal weights), so games are not a
  trained model's; rows per game are reported to compare.
* ``trainer``: ``Trainer.train_batch`` steps/s (online loss, ``[control] batch_size`` 256, one backward each,
  AdamW every ``opt_step_every``) with ``enable_amp`` off and on, on real samples (the public mjai logs in
  tests/data through the learner's data loader, loaded before the timing), and the peak GPU memory of each; then,
  in the AMP-on trainer, the peak of a test play (``TestPlayer.play_units`` with ``[test_play] games`` in flight,
  stopped after a few seconds: the peak is at the start, when every game is in flight).
* ``memory``: those peaks (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``) next to
  ``mortal.tools.doctor.estimate_memory`` for the same config (the doctor adds a CUDA context, which torch's counters
  do not include, and 25% slack).
* ``online``: the real server, trainer (``python -m mortal.train``: supervisor + learner) and ``online_clients``
  clients (rounds of ``online_games`` games, so that their logs arrive while the window runs) for a window from the
  learner's first idle submission; the learner's idle fraction is the time it spent
  waiting for a non-empty drain (each ``drained N logs after X s`` line, plus a wait still running at the stop,
  from the time of the idle submission that began it) over the window, the same after the first drain (the clients'
  first round excluded), the steps trained, and the clients' hanchan/h beside the training learner (logs they
  submitted in the window: whole rounds, so coarse).

``--parts sweep`` (``bench/gpu.sh --sweep``) runs the profile and the sweep alone, with the budget's time for the
sweep (longer hard limits: slower rounds still end in them). ``--parts arena`` (``bench/gpu.sh --arena``) runs one
other part instead, ``arena_speculation``: ``bench/arena.py``
with the same network at version 3, ``speculate_passes`` off and on (``[train_play.<profile>]`` / ``[test_play]``
``speculate_passes``), for the arena's rows per forward and games/s against its zero-cost floor on the GPU.

The config is ``config_online.toml`` (version 4, 192x40, batch 256, AMP, cuDNN benchmark) with paths in a
temporary work dir and the sizes named in ``results.json`` (``meta.sizes``; ``--set`` changes one, e.g.
``--set games.4=16``). ``--quick`` runs every part on the GPU with a 32x2 network and seconds per part, to check the
machinery within 2 minutes; ``--cpu-smoke`` the same on the CPU with a 16x1 network (CI: tests/test_bench_gpu.py).
Their figures only show that the machinery works.

The parts live in modules of their own: ``bench/gpu_profile.py``, ``gpu_selfplay.py``, ``gpu_trainer.py``,
``gpu_memory.py``, ``gpu_online.py`` and ``gpu_arena.py``, over what they share (``gpu_common.py``: config, models,
JSON records, CUDA peaks, the row counter); ``gpu_report.py`` writes ``results.md``. Here: the sizes, the driver that
runs the parts (``PartRunner``) and the command line, whose ``*-worker`` commands are the parts' processes.
"""

if __package__ in (None, ''):  # run as a script: python bench/gpu.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import datetime
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from bench.gpu_arena import part_arena
from bench.gpu_common import ROOT, read_json, write_json
from bench.gpu_memory import part_memory
# learner_idle, idle_summary, trained_steps, submitted_logs: also this script's API (tests/test_bench_gpu.py)
from bench.gpu_online import idle_summary, learner_idle, part_online, submitted_logs, trained_steps  # noqa: F401
from bench.gpu_report import table
from bench.gpu_profile import part_profile, profile_worker
from bench.gpu_selfplay import part_selfplay, selfplay_worker
from bench.gpu_trainer import part_trainer, trainer_worker

# Sizes of the three modes. budget_s: the whole run, set-up included, from BENCH_T0 (set by bench/gpu.sh).
# Self-play sweep (bench/gpu_selfplay.py): clients: the counts (up to the box's cores), measured largest first, then
# 1, then the others; games: games per round of a client, per version; box_s / first_hard_s: the first count's box
# (another round only if it should end within it) and hard limit (long enough for a round to end: its round time
# plans the later counts); hard_max_s / min_hard_s: a later count's hard limit at most (when no first round ended)
# / at least (else skipped); round_slowdown: a later count's round time over the first's, planned for
# (plan_counts); sweep_versions: the versions swept; version_share: the part of the sweep's time left that a version
# (not the last) may take. Profile (gpu_profile.py): one client's round of profile_games games, profile_split_s
# unprofiled then profile_profiler_s under torch.profiler. online_concurrent (smoke only, whose figures mean
# nothing): the online run beside the other parts.
# The GPU run's sizes follow the last H200 run (docs/performance_gpu.md): a round is about 1,500 forwards of 30-45 ms
# at v3 and 45-95 ms at v4, so a whole round takes about 50 s at v3 (64 games) and 80 s at v4 (32 games).
_COMMON = dict(warmup=False, online_concurrent=False, sweep_versions=(3, 4), version_share={3: 0.42, 4: 1.0},
               count_overhead_s=2.0, round_slowdown=1.0,
               trainer_version=4, online_version=4, profile_version=3, test_games=3000, num_workers=4)
GPU_SIZES = dict(
    _COMMON, budget_s=470, channels=192, blocks=40, warmup=True,
    clients=(1, 2, 4, 8, 12), games={3: 64, 4: 32}, box_s={3: 20.0, 4: 25.0}, first_hard_s={3: 75.0, 4: 100.0},
    hard_max_s=60.0, min_hard_s=8.0, sweep_cap_s=250,
    profile_games=128, profile_split_s=8.0, profile_profiler_s=3.0, profile_cap_s=50,
    trainer_box_s=5.0, trainer_cap_s=60, test_box_s=5.0,
    online_clients=8, online_games=16, online_window_s=90.0, online_margin_s=20.0, arena_seeds=32, arena_cap_s=150,
)
QUICK_SIZES = dict(  # the machinery on the GPU within 2 minutes, set-up included; its figures mean little
    _COMMON, budget_s=120, channels=32, blocks=2, warmup=True,
    clients=(1, 2), games={3: 8, 4: 8}, box_s={3: 3.0, 4: 3.0}, first_hard_s={3: 6.0, 4: 6.0},
    hard_max_s=5.0, min_hard_s=2.0, count_overhead_s=1.0, sweep_cap_s=30,
    profile_games=8, profile_split_s=2.0, profile_profiler_s=1.0, profile_cap_s=20,
    trainer_box_s=1.0, trainer_cap_s=25, test_games=64, test_box_s=1.0, num_workers=0,
    online_version=3, online_clients=2, online_games=8, online_window_s=10.0, online_margin_s=5.0, arena_seeds=2,
    arena_cap_s=30,
)
SMOKE_SIZES = dict(
    _COMMON, budget_s=150, channels=16, blocks=1, online_concurrent=True,
    clients=(1, 2), games={3: 4, 4: 4}, box_s={3: 0.5, 4: 0.5}, first_hard_s={3: 40.0, 4: 15.0},
    hard_max_s=15.0, min_hard_s=1.0, count_overhead_s=0.5, sweep_cap_s=80, version_share={3: 0.8, 4: 1.0},
    profile_games=4, profile_split_s=1.5, profile_profiler_s=1.0, profile_cap_s=40,
    trainer_version=3, trainer_box_s=1.0, trainer_cap_s=40, test_games=8, test_box_s=0.5, num_workers=0,
    online_version=3, online_clients=1, online_games=4, online_window_s=12.0, online_margin_s=15.0, arena_seeds=1,
    arena_cap_s=40,
)
MODES = {'gpu': GPU_SIZES, 'quick': QUICK_SIZES, 'cpu-smoke': SMOKE_SIZES}
# ``--parts sweep`` (the profile and the sweep alone) gives the sweep the whole budget: longer hard limits, so that
# rounds of a slower box still end inside them (set per mode over the sizes above)
SWEEP_ONLY = {'gpu': dict(sweep_cap_s=400, hard_max_s=90.0),
              'quick': {}, 'cpu-smoke': {}}
RESULTS = 'results.json'
# ``--parts``: the measurements (the default, within the 8-minute budget), or the arena's speculation arms
# alone (``bench/gpu.sh --arena``: about 2 x arena_cap_s at most, after the set-up).
PART_SETS = {'all': ('profile', 'selfplay_sweep', 'trainer', 'memory', 'online'),
             'sweep': ('profile', 'selfplay_sweep'),
             'arena': ('arena_speculation',)}
TABLE = 'results.md'


class PartRunner:
    """The parts of one driver run. Each runs with a context of its own (``sizes``, ``device``, the ``work`` and
    ``logs`` folders, ``popen`` and ``kill`` for its child processes, ``cap(want)``: seconds it may take of the
    budget left, ``shared``: what one part leaves for a later one); its child processes are killed when it ends, and
    its record, or why it failed, is saved into results.json and results.md at once."""

    def __init__(self, a, results, out_dir, *, sizes, device, cuda, t0_wall, deadline):
        self.a, self.results, self.out_dir = a, results, out_dir
        self.logs = out_dir / 'logs'
        self.sizes, self.device, self.cuda = sizes, device, cuda
        self.t0_wall, self.deadline = t0_wall, deadline
        self.lock = threading.Lock()
        self.work = None  # the parts' temporary folder (set by run while they run)
        self.shared = {}  # what one part leaves for a later one (the trainer's config path)

    def save(self):  # under ``lock`` once the parts run
        self.results['meta']['total_s'] = round(time.time() - self.t0_wall, 1)
        write_json(self.out_dir / RESULTS, self.results)
        (self.out_dir / TABLE).write_text(table(self.results))

    def make_popen(self, children):
        """``popen(args, name, env=None)`` of one part: a child process logging to ``logs/<name>.log``, in a session
        of its own, appended to ``children``."""
        a, logs = self.a, self.logs

        def popen(args, name, env=None):
            log = open(logs / f'{name}.log', 'wb')  # one process per name and run
            full_env = {**os.environ, 'PYTHONUNBUFFERED': '1', **(env or {})}
            full_env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
            full_env.pop('RUST_BACKTRACE', None)
            full_env.pop('MORTAL_IS_SUB_PROC', None)
            if a.cpu_smoke:
                full_env['OMP_NUM_THREADS'] = '1'
            try:
                p = subprocess.Popen(args, cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                log.close()
            children.append(p)
            return p
        return popen

    @staticmethod
    def kill(p):
        from mortal.learning.supervisor import signal_group
        if p.poll() is None:
            signal_group(p.pid, 9)
        p.wait()

    def context(self, children):
        """The context of one part whose child processes go into ``children``."""
        return {'shared': self.shared, 'sizes': self.sizes, 'device': self.device, 'work': self.work,
                'logs': self.logs, 'popen': self.make_popen(children), 'kill': self.kill, 'cpus': os.cpu_count() or 1,
                'cap': lambda want: min(want, self.deadline - time.monotonic())}

    def run_part(self, name, fn):
        """Run one part, ``fn(context)``; its result (or failure) goes into ``results`` and is saved at once."""
        children = []
        ctx = self.context(children)
        t = time.monotonic()
        try:
            if not self.cuda and not self.a.cpu_smoke:
                rec = {'status': 'skipped: torch sees no CUDA device (see setup)'}
            else:
                rec = fn(ctx)
        except Exception as ex:  # one part failing must not lose the others
            rec = {'status': f'failed: {type(ex).__name__}: {ex}'}
            with self.lock:
                self.results['errors'][name] = traceback.format_exc()
        finally:
            for p in children:
                self.kill(p)
            children.clear()
        rec['part_s'] = round(time.monotonic() - t, 2)
        with self.lock:
            self.results[name] = rec
            self.save()


def run(a):
    """The driver: the parts of ``--parts`` within the budget; results.json and results.md in ``--out``."""
    import torch

    sizes = dict(MODES[mode_of(a)], **(SWEEP_ONLY[mode_of(a)] if a.parts == 'sweep' else {}))
    sizes = apply_overrides(sizes, a.set or [])
    out_dir = pathlib.Path(a.out).resolve()
    logs = out_dir / 'logs'
    logs.mkdir(parents=True, exist_ok=True)
    t0_wall = float(os.environ.get('BENCH_T0') or time.time())
    deadline = time.monotonic() + sizes['budget_s'] - (time.time() - t0_wall)
    cuda = torch.cuda.is_available() and not a.cpu_smoke
    device = 'cuda:0' if cuda else 'cpu'
    results = {
        'meta': _meta(a, sizes, device, cuda),
        'setup': read_json(a.setup_json) if a.setup_json else {'status': 'skipped', 'seconds': 0.0},
        'errors': {},
    }
    runner = PartRunner(a, results, out_dir, sizes=sizes, device=device, cuda=cuda, t0_wall=t0_wall,
                        deadline=deadline)
    runner.save()
    runner.work = pathlib.Path(tempfile.mkdtemp(prefix='mortal-gpu-bench-'))
    parts = [  # the memory part reads the measured peaks of the self-play and trainer parts
        ('profile', part_profile),
        ('selfplay_sweep', part_selfplay),
        ('trainer', part_trainer),
        ('memory', lambda c: part_memory(c, results)),
        ('online', part_online),
        ('arena_speculation', part_arena),
    ]
    wanted = PART_SETS[a.parts]
    parts = [(name, fn) for name, fn in parts if name in wanted]
    try:
        online = None
        if sizes['online_concurrent'] and 'online' in wanted:
            online = threading.Thread(target=runner.run_part, args=('online', part_online))
            online.start()
        for name, fn in parts:
            if name != 'online' or online is None:
                runner.run_part(name, fn)
        if online is not None:
            online.join()
    finally:
        shutil.rmtree(runner.work, ignore_errors=True)
    runner.save()
    print(table(results))
    print(f'results: {out_dir / RESULTS}')
    return 0 if cuda or a.cpu_smoke else 2


def mode_of(a):
    """The run's mode: 'cpu-smoke', 'quick' or 'gpu'."""
    return 'cpu-smoke' if a.cpu_smoke else 'quick' if a.quick else 'gpu'


def apply_overrides(sizes, items):
    """A copy of ``sizes`` with each ``KEY=VALUE`` of ``items`` set (``--set``): VALUE is JSON (a bare word is a
    string), KEY may name a version's entry (``games.4=16``); an unknown key is an error."""
    import copy
    import json
    out = copy.deepcopy(sizes)
    for item in items:
        key, sep, raw = item.partition('=')
        if not sep:
            raise SystemExit(f'bench/gpu.py: --set {item!r}: expected KEY=VALUE')
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        name, _, sub = key.partition('.')
        if name not in out or (sub and not isinstance(out[name], dict)):
            raise SystemExit(f'bench/gpu.py: --set {item!r}: no size {key!r} (known: {", ".join(sorted(out))})')
        if sub:
            sub = int(sub) if sub.isdigit() else sub
            if sub not in out[name]:
                raise SystemExit(f'bench/gpu.py: --set {item!r}: {name} has no entry {sub!r}')
            out[name][sub] = value
        else:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out


def _meta(a, sizes, device, cuda):
    """What results.json says of the run: mode, device, versions, commit, start, budget, parts and sizes."""
    import torch
    return {
        'mode': mode_of(a), 'device': device,
        'device_name': torch.cuda.get_device_name(0) if cuda else 'cpu', 'cuda_available': torch.cuda.is_available(),
        'torch': torch.__version__, 'torch_cuda': torch.version.cuda, 'cpu_count': os.cpu_count(),
        'sp_threads_per_process': _sp_threads(),
        'commit': _git_commit(), 'started': datetime.datetime.now(datetime.timezone.utc).isoformat(),
        'budget_s': sizes['budget_s'], 'parts': a.parts, 'sizes': {k: v for k, v in sizes.items()},
    }


def _sp_threads():
    from mortal.features import obs_v4
    return obs_v4.sp_threads()


def _git_commit():
    try:
        return subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    r = sub.add_parser('run', help='the driver')
    r.add_argument('--out', default='bench-gpu-results')
    r.add_argument('--cpu-smoke', action='store_true', help='tiny network, few games, seconds per part, on CPU')
    r.add_argument('--quick', action='store_true', help='the machinery on the GPU in 2 minutes (small network)')
    r.add_argument('--set', action='append', metavar='KEY=VALUE',
                   help='override one size of the mode (JSON value; games.4=16 for one version); repeatable')
    r.add_argument('--setup-json', default=None, help="the set-up's record (written by bench/gpu.sh)")
    r.add_argument('--parts', choices=sorted(PART_SETS), default='all',
                   help="all: the measurements within 8 minutes; sweep: the profile and the self-play sweep alone, "
                        "with longer rounds; arena: speculate_passes off/on in bench/arena.py")
    w = sub.add_parser('selfplay-worker')
    w.add_argument('--index', type=int, required=True)
    w.add_argument('--device', required=True)
    w.add_argument('--versions', required=True)
    w.add_argument('--configs', required=True)
    w.add_argument('--counts', required=True)
    w.add_argument('--flags', required=True)
    w.add_argument('--result', required=True)
    w.add_argument('--deadline-wall', type=float, required=True)
    w.add_argument('--warmup', action='store_true')
    f = sub.add_parser('profile-worker')
    f.add_argument('--device', required=True)
    f.add_argument('--config', required=True)
    f.add_argument('--split-s', type=float, required=True)
    f.add_argument('--profile-s', type=float, required=True)
    f.add_argument('--ops', required=True)
    f.add_argument('--result', required=True)
    f.add_argument('--warmup', action='store_true')
    t = sub.add_parser('trainer-worker')
    t.add_argument('--config', required=True)
    t.add_argument('--box', type=float, required=True)
    t.add_argument('--test-box', type=float, required=True)
    t.add_argument('--result', required=True)
    a = p.parse_args(argv)
    if a.cmd == 'run':
        if a.cpu_smoke and a.quick:
            p.error('--cpu-smoke and --quick are two modes: one at most')
        return run(a)
    import logging
    logging.basicConfig(level=logging.WARNING, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
    if a.cmd == 'selfplay-worker':
        a.deadline = time.monotonic() + (a.deadline_wall - time.time())
        return selfplay_worker(a)
    if a.cmd == 'profile-worker':
        return profile_worker(a)
    return trainer_worker(a)


if __name__ == '__main__':
    sys.exit(main())
