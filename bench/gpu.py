"""GPU benchmark: self-play, trainer, memory and the learner's idle time of Mortal's 192x40 network on one card.

    bash bench/gpu.sh [--cpu-smoke] [--arena] [DIR]                 # set-up + this driver; results in $OUT, else DIR
    python bench/gpu.py run --out DIR [--cpu-smoke] [--parts all|arena]  # the driver alone (no set-up)

Parts, each in processes of its own with a hard time limit, each writing its piece of ``results.json`` as soon as
it ends (a part that fails or runs out of time records why and the others still run):

* ``selfplay``: hanchan per hour of the client's self-play path (``TrainPlayer.train_play``: the trainee with
  Boltzmann exploration against the greedy baseline, 1v3 duplicate, gz mjai logs written), at feature version 3
  and 4, with 1 and 2 client processes playing at once (each its own rounds of ``games`` games on the same card).
  A client plays rounds until its time box is used up (a round is started only when it should end within the
  box); hanchan/h = games of the finished rounds / their wall time, summed over the clients. Also engine rows
  (decisions) per second, rows per forward and the client's peak GPU memory. The networks are freshly initialised
  (no Mortal weights), so games are not a trained model's; rows per game are reported to compare.
* ``trainer``: ``Trainer.train_batch`` steps/s (online loss, ``[control] batch_size`` 256, one backward each,
  AdamW every ``opt_step_every``) with ``enable_amp`` off and on, on real samples (the public mjai logs in
  tests/data through the learner's data loader, loaded before the timing), and the peak GPU memory of each; then,
  in the AMP-on trainer, the peak of a test play (``TestPlayer.play_units`` with ``[test_play] games`` in flight,
  stopped after a few seconds: the peak is at the start, when every game is in flight).
* ``memory``: those peaks (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``) next to
  ``mortal.doctor.estimate_memory`` for the same config (the doctor adds a CUDA context, which torch's counters
  do not include, and 25% slack).
* ``online``: the real server, trainer (``python -m mortal.train``: supervisor + learner) and clients for a
  3-minute window from the learner's first idle submission; the learner's idle fraction is the time it spent
  waiting for a non-empty drain (each ``drained N logs after X s`` line, plus a wait still running at the stop,
  from the time of the idle submission that began it) over the window, the same after the first drain (the clients'
  first round excluded), the steps trained, and the clients' hanchan/h beside the training learner (logs they
  submitted in the window: whole rounds, so coarse).

``--parts arena`` (``bench/gpu.sh --arena``) runs one other part instead, ``arena_speculation``: ``bench/arena.py``
with the same network at version 3, ``speculate_passes`` off and on (``[train_play.<profile>]`` / ``[test_play]``
``speculate_passes``), for the arena's rows per forward and games/s against its zero-cost floor on the GPU.

The config is ``config_online.toml`` (version 4, 192x40, batch 256, AMP, cuDNN benchmark) with paths in a
temporary work dir and the sizes named in ``results.json`` (``meta.sizes``). ``--cpu-smoke`` runs every part on
the CPU with a 16x1 network, a few games and seconds per part (CI: tests/test_bench_gpu.py); its figures only
show that the machinery works.

The parts live in modules of their own: ``bench/gpu_selfplay.py``, ``gpu_trainer.py``, ``gpu_memory.py``,
``gpu_online.py`` and ``gpu_arena.py``, over what they share (``gpu_common.py``: config, models, JSON records, CUDA
peaks, the row counter); ``gpu_report.py`` writes ``results.md``. Here: the sizes, the driver that runs the parts
(``PartRunner``) and the command line, whose ``selfplay-worker`` and ``trainer-worker`` are the parts' processes.
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
from bench.gpu_selfplay import part_selfplay, selfplay_worker
from bench.gpu_trainer import part_trainer, trainer_worker

# Sizes of the two modes. budget_s: the whole run, set-up included, from BENCH_T0 (set by bench/gpu.sh). box_s: a
# client starts another round only while it would end within this many seconds; hard_s[clients][version]: a round
# still running then is stopped and its hanchan/h estimated (see part_selfplay; the smoke's 2-client rounds and v4
# rounds are stopped so). online_concurrent (smoke only, whose figures mean nothing): the online run beside the other
# parts, so that the smoke stays well under a minute.
GPU_SIZES = dict(
    budget_s=470, channels=192, blocks=40, games=128, box_s={3: 20.0, 4: 25.0},
    hard_s={1: {3: 50.0, 4: 62.0}, 2: {3: 50.0, 4: 62.0}}, warmup=True, online_concurrent=False,
    selfplay_cap_s={1: 110, 2: 120}, trainer_version=4, trainer_box_s=12.0, trainer_cap_s=100, test_games=3000,
    test_box_s=8.0, online_version=4, online_clients=2, online_games=128, online_window_s=180.0, num_workers=4,
    online_margin_s=30.0, arena_seeds=32, arena_cap_s=150,
)
SMOKE_SIZES = dict(
    budget_s=100, channels=16, blocks=1, games=4, box_s={3: 0.5, 4: 0.5},
    hard_s={1: {3: 20.0, 4: 2.0}, 2: {3: 2.0, 4: 2.0}}, warmup=False, online_concurrent=True,
    selfplay_cap_s={1: 45, 2: 40}, trainer_version=3, trainer_box_s=1.0, trainer_cap_s=40, test_games=8,
    test_box_s=0.5, online_version=3, online_clients=1, online_games=4, online_window_s=12.0, num_workers=0,
    online_margin_s=15.0, arena_seeds=1, arena_cap_s=40,
)
RESULTS = 'results.json'
# ``--parts``: the measurements (the default, within the 8-minute budget), or the arena's speculation arms
# alone (``bench/gpu.sh --arena``: about 2 x arena_cap_s at most, after the set-up).
PART_SETS = {'all': ('selfplay_1_client', 'selfplay_2_clients', 'trainer', 'memory', 'online'),
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
                'logs': self.logs, 'popen': self.make_popen(children), 'kill': self.kill,
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

    sizes = SMOKE_SIZES if a.cpu_smoke else GPU_SIZES
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
        ('selfplay_1_client', lambda c: part_selfplay(c, 1)),
        ('selfplay_2_clients', lambda c: part_selfplay(c, 2, results.get('selfplay_1_client'))),
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


def _meta(a, sizes, device, cuda):
    """What results.json says of the run: mode, device, versions, commit, start, budget, parts and sizes."""
    import torch
    return {
        'mode': 'cpu-smoke' if a.cpu_smoke else 'gpu', 'device': device,
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
    r.add_argument('--setup-json', default=None, help="the set-up's record (written by bench/gpu.sh)")
    r.add_argument('--parts', choices=sorted(PART_SETS), default='all',
                   help="all: the measurements within 8 minutes; arena: speculate_passes off/on in bench/arena.py")
    w = sub.add_parser('selfplay-worker')
    w.add_argument('--index', type=int, required=True)
    w.add_argument('--device', required=True)
    w.add_argument('--versions', required=True)
    w.add_argument('--configs', required=True)
    w.add_argument('--boxes', required=True)
    w.add_argument('--hards', required=True)
    w.add_argument('--ready', required=True)
    w.add_argument('--go', required=True)
    w.add_argument('--result', required=True)
    w.add_argument('--deadline-wall', type=float, required=True)
    w.add_argument('--warmup', action='store_true')
    t = sub.add_parser('trainer-worker')
    t.add_argument('--config', required=True)
    t.add_argument('--box', type=float, required=True)
    t.add_argument('--test-box', type=float, required=True)
    t.add_argument('--result', required=True)
    a = p.parse_args(argv)
    if a.cmd == 'run':
        return run(a)
    import logging
    logging.basicConfig(level=logging.WARNING, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
    if a.cmd == 'selfplay-worker':
        a.deadline = time.monotonic() + (a.deadline_wall - time.time())
        return selfplay_worker(a)
    return trainer_worker(a)


if __name__ == '__main__':
    sys.exit(main())
