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
"""

if __package__ in (None, ''):  # run as a script: python bench/gpu.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import copy
import datetime
import glob
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
GIB = 2**30

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
FIXTURE_LOGS = 'tests/data/*.json*'  # real public mjai hanchan (tests/data/README.md)
RESULTS = 'results.json'
# ``--parts``: the measurements (the default, within the 8-minute budget), or the arena's speculation arms
# alone (``bench/gpu.sh --arena``: about 2 x arena_cap_s at most, after the set-up).
PART_SETS = {'all': ('selfplay_1_client', 'selfplay_2_clients', 'trainer', 'memory', 'online'),
             'arena': ('arena_speculation',)}
TABLE = 'results.md'


class TimeBoxOver(Exception):
    """Raised inside a play when its hard time limit has passed."""


# ---------------------------------------------------------------------------- helpers shared by the parts

def write_json(path, data):
    """Write ``data`` as JSON to ``path`` atomically (a reader never sees half a file)."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False))
    os.replace(tmp, path)


def read_json(path):
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return None


def cuda_peak(device):
    """``{'allocated': bytes, 'reserved': bytes}`` peaks since the last reset on a CUDA ``device``, else both None."""
    import torch
    if torch.device(device).type != 'cuda':
        return {'allocated': None, 'reserved': None}
    return {'allocated': int(torch.cuda.max_memory_allocated(device)),
            'reserved': int(torch.cuda.max_memory_reserved(device))}


def cuda_reset(device):
    import gc
    import torch
    gc.collect()
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def write_config(work, *, sizes, device, version, games, port=None, enable_amp=None, clients=1, trainer=False):
    """``config_online.toml`` with every path under ``work``, the given device/version/sizes; returns its path.

    ``trainer``: save/submit/test every 10**6 steps (the trainer part times bare ``train_batch`` calls)."""
    import toml
    from mortal.quickstart_config import free_port

    work = pathlib.Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cfg = toml.load(ROOT / 'config_online.toml')
    w = lambda name: str(work / name)  # noqa: E731
    c = cfg['control']
    c.update(version=version, state_file=w('online/mortal.pth'), best_state_file=w('online/best.pth'),
             tensorboard_dir=w('tb'), device=device)
    if device == 'cpu':
        c.update(enable_cudnn_benchmark=False, enable_amp=False)
    if enable_amp is not None:
        c['enable_amp'] = enable_amp
    if trainer:
        c.update(save_every=10**6, submit_every=10**6, test_every=10**6)
    cfg['train_play']['default'].update(games=games, log_dir=w('train_play'))
    cfg['test_play'].update(games=sizes['test_games'], log_dir=w('test_play'))
    cfg['dataset'].update(globs=[str(ROOT / FIXTURE_LOGS)], file_index=w('file_index.pth'),
                          num_workers=sizes['num_workers'])
    cfg['resnet'].update(conv_channels=sizes['channels'], num_blocks=sizes['blocks'])
    for slot in ('train', 'test'):
        cfg['baseline'][slot].update(device=device, state_file=w('online/baseline.pth'))
    cfg['online']['remote']['port'] = port or free_port()
    cfg['online']['server'].update(buffer_dir=w('online/buffer'), drain_dir=w('online/drain'),
                                   capacity=max(cfg['online']['server']['capacity'], 2 * clients * games))
    cfg['grp']['state_file'] = w('grp.pth')
    path = work / 'config.toml'
    path.write_text(toml.dumps(cfg))
    return path


def write_models(config):
    """Freshly initialised (seed 0) trainee = baseline checkpoints with Mortal's keys, and a GRP (seed 0)."""
    import torch
    from mortal.model.networks import GRP, AuxNet, Brain, DQN

    torch.manual_seed(0)
    v, r = config['control']['version'], config['resnet']
    state = {'mortal': Brain(version=v, conv_channels=r['conv_channels'], num_blocks=r['num_blocks']).state_dict(),
             'current_dqn': DQN(version=v).state_dict(), 'aux_net': AuxNet((4,)).state_dict(),
             'config': config, 'steps': 0}
    for key in ('state_file',):
        pathlib.Path(config['control'][key]).parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, config['control'][key])
    torch.save(state, config['baseline']['train']['state_file'])
    torch.manual_seed(0)
    torch.save({'model': GRP(**config['grp']['network']).state_dict()}, config['grp']['state_file'])


def load(path):
    from mortal.config import load_config
    return load_config(path, env={})


class _RowCounter:
    """Counts the rows of every ``MortalEngine.react_batch`` of this process and stops a play past ``hard``."""

    def __init__(self):
        from mortal.play.engine import MortalEngine
        self.rows = self.calls = 0
        self.hard = float('inf')
        self.min_calls = 0  # calls to let through before ``hard`` counts (a test play's first forwards hold the peak)
        # the engine's own method, also when an earlier counter of this process has wrapped it
        orig = MortalEngine.__dict__.get('_unwrapped_react_batch', MortalEngine.react_batch)
        MortalEngine._unwrapped_react_batch = orig
        counter = self

        def react_batch(engine, obs, masks, invisible_obs=None):
            if time.monotonic() > counter.hard and counter.calls >= counter.min_calls:
                raise TimeBoxOver()
            counter.rows += len(obs)
            counter.calls += 1
            return orig(engine, obs, masks, invisible_obs)

        MortalEngine.react_batch = react_batch


def _wait_file(path, timeout):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f'{path} did not appear within {timeout:.0f} s')
        time.sleep(0.05)


# ---------------------------------------------------------------------------- worker: one self-play client

def selfplay_worker(a):
    """One client process: per version, warm up, wait for the driver's go, play rounds within the time box."""
    import torch
    from mortal.model.networks import Brain, DQN
    from mortal.play.player import TrainPlayer

    torch.set_num_threads(1)
    device = torch.device(a.device)
    counter = _RowCounter()
    out = {'client': a.index, 'device': str(device), 'versions': {}}
    end = a.deadline
    versions = [int(v) for v in a.versions.split(',')]
    boxes = [float(b) for b in a.boxes.split(',')]
    hards = [float(h) for h in a.hards.split(',')]
    for i, (version, box) in enumerate(zip(versions, boxes)):
        rec = out['versions'][str(version)] = {'status': 'started', 'version': version}
        write_json(a.result, out)
        config = load(a.configs.split(',')[i])
        t0 = time.monotonic()
        torch.manual_seed(a.index)
        r = config['resnet']
        mortal = Brain(version=version, conv_channels=r['conv_channels'], num_blocks=r['num_blocks'])
        mortal.load_state_dict(torch.load(config['control']['state_file'], weights_only=True)['mortal'])
        dqn = DQN(version=version)
        dqn.load_state_dict(torch.load(config['control']['state_file'], weights_only=True)['current_dqn'])
        mortal, dqn = mortal.to(device).eval(), dqn.to(device).eval()
        player = TrainPlayer(config, {}, train_key=1000 + a.index)  # its own deals, as separate clients
        if a.warmup and version == 4:
            from bench.arena import FirstLegal
            from mortal.play.arena import OneVsThree
            # the single-player core builds its shanten tables once per process (a long-running client has them)
            OneVsThree(disable_progress_bar=True).py_vs_py(FirstLegal('a', 4), FirstLegal('b', 4), (1, 7), 1)
        # the first CUDA forward pays for kernels and workspaces: not timed (fp16 autocast on CUDA, as the engine)
        with torch.inference_mode(), torch.autocast(device.type, enabled=device.type == 'cuda'):
            from mortal.features.obs import obs_shape
            dqn(mortal(torch.zeros(8, *obs_shape(version), device=device)), torch.ones(8, 46, dtype=torch.bool,
                                                                                     device=device))
        cuda_reset(device)
        rec['warmup_s'] = round(time.monotonic() - t0, 2)
        pathlib.Path(f'{a.ready}.{version}').touch()
        _wait_file(f'{a.go}.{version}', 120)
        start = time.monotonic()
        # later versions keep their expected share (box + warm-up), not their hard limits (maxima)
        reserve = sum(boxes[i + 1:]) + 15 * (len(versions) - i - 1)
        counter.hard = min(start + hards[i], end - reserve)
        rows0, calls0 = counter.rows, counter.calls
        rounds, games, played_s, last = 0, 0, 0.0, None
        rec.update(status='ok', aborted=False)
        try:
            while rounds == 0 or (time.monotonic() - start) + last <= box:
                r0 = time.monotonic()
                rankings, files = player.train_play(mortal, dqn, device)
                last = time.monotonic() - r0
                rounds += 1
                games += int(sum(rankings))
                played_s += last
        except TimeBoxOver:
            rec['aborted'] = True
        wall = time.monotonic() - start
        rows, calls = counter.rows - rows0, counter.calls - calls0
        rec.update(
            rounds=rounds, games=games, round_games=player.seed_count * 4, seconds=round(wall, 3),
            hanchan_per_hour=round(games / played_s * 3600, 1) if games else None,
            rows=rows, rows_per_s=round(rows / wall, 1) if wall > 0 else None,
            rows_per_forward=round(rows / calls, 2) if calls else None,
            rows_per_game=round(rows / games, 1) if games and not rec['aborted'] else None,
            peak_memory=cuda_peak(device))
        write_json(a.result, out)
        del mortal, dqn, player
        cuda_reset(device)
    return 0


def part_selfplay(ctx, clients, earlier=None):
    """``clients`` client processes at once, each playing version 3 then 4 in step (the driver starts each version
    when every client is ready). ``earlier``: the result of the 1-client part, whose finished rounds give the rows per
    game of an estimate. Returns ``{'v3': {...}, 'v4': {...}}``."""
    sizes = ctx['sizes']
    cap = ctx['cap'](sizes['selfplay_cap_s'][clients])
    if cap < 20:
        raise TimeoutError(f'only {cap:.0f} s of the budget left')
    deadline = time.monotonic() + cap
    work = ctx['work'] / f'selfplay{clients}'
    configs = []
    for version in (3, 4):
        cfg_path = write_config(work / f'v{version}', sizes=sizes, device=ctx['device'], version=version,
                                games=sizes['games'])
        write_models(load(cfg_path))
        configs.append(str(cfg_path))
    procs, results = [], []
    flags = work / 'flags'
    flags.mkdir(exist_ok=True)
    worker_deadline = time.time() + cap - 5  # wall clock: the workers compare with their monotonic clock below
    for i in range(clients):
        result = work / f'client{i}.json'
        results.append(result)
        args = [sys.executable, str(pathlib.Path(__file__).resolve()), 'selfplay-worker', '--index', str(i),
                '--device', ctx['device'], '--versions', '3,4', '--configs', ','.join(configs),
                '--boxes', f"{sizes['box_s'][3]},{sizes['box_s'][4]}",
                '--hards', f"{sizes['hard_s'][clients][3]},{sizes['hard_s'][clients][4]}", '--ready', str(flags / f'ready{i}'),
                '--go', str(flags / 'go'), '--result', str(result), '--deadline-wall', str(worker_deadline)]
        if sizes['warmup']:
            args.append('--warmup')
        procs.append(ctx['popen'](args, f'selfplay{clients}_client{i}'))
    problem = None  # what the clients' records are read after (a version they did not reach counts as failed)
    try:
        for version in (3, 4):
            while not all((flags / f'ready{i}.{version}').exists() for i in range(clients)):
                if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                    raise RuntimeError(f'a client ended or ran out of time before version {version}')
                time.sleep(0.05)
            (flags / f'go.{version}').touch()
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except (RuntimeError, subprocess.TimeoutExpired) as ex:
        problem = f'{type(ex).__name__}: {ex}'
    finally:
        for p in procs:
            ctx['kill'](p)
    out = {}
    per_client = [read_json(r) or {} for r in results]
    # A round stopped at its hard limit: hanchan/h = rows/s / rows per game of finished rounds, of this version if
    # any finished (in this part or the 1-client part before it), else of version 3.
    recs = [r for c in per_client for r in c.get('versions', {}).values() if r]
    for entry in (earlier or {}).values():
        if isinstance(entry, dict):
            recs += [r for r in entry.get('per_client') or [] if r]
    per_game = {}
    for r in recs:
        if r.get('rows_per_game'):
            per_game.setdefault(r['version'], []).append(r['rows_per_game'])
    for r in recs[:sum(len(c.get('versions', {})) for c in per_client)]:
        if r.get('status') == 'ok' and r.get('hanchan_per_hour') is None and r.get('rows_per_s'):
            ref_version = r['version'] if r['version'] in per_game else 3
            if ref_version in per_game:
                mean = sum(per_game[ref_version]) / len(per_game[ref_version])
                r['hanchan_per_hour'] = round(r['rows_per_s'] / mean * 3600, 1)
                r['hanchan_per_hour_estimated'] = f'rows/s / {mean:.0f} rows per game of finished v{ref_version} rounds'
    for version in (3, 4):
        recs = [c.get('versions', {}).get(str(version)) for c in per_client]
        entry = {'version': version, 'clients': clients, 'games_per_round': sizes['games'],
                 'network': f"{sizes['channels']}x{sizes['blocks']}"}
        if not all(r and r.get('status') == 'ok' for r in recs):
            entry.update(status=f'failed: {problem or "a client failed"} (see logs/selfplay{clients}_client*.log)',
                         per_client=recs)
        else:
            rates = [r['hanchan_per_hour'] for r in recs]
            entry.update(
                status='ok', hanchan_per_hour=round(sum(rates), 1) if None not in rates else None,
                rows_per_s=round(sum(r['rows_per_s'] for r in recs), 1),
                games=sum(r['games'] for r in recs), seconds=max(r['seconds'] for r in recs),
                aborted=any(r['aborted'] for r in recs),
                estimated=any('hanchan_per_hour_estimated' in r for r in recs), per_client=recs)
        out[f'v{version}'] = entry
    return out


# ---------------------------------------------------------------------------- worker: trainer steps and memory

class _NullWriter:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _NoTestPlay:
    enabled = False


def real_batches(config, version, batch_size, limit=8):
    """Up to ``limit`` full batches of real samples (every seat of the fixture logs) from the learner's loader."""
    from mortal.data.dataloader import iter_full_batches, learner_loader
    files = sorted(glob.glob(str(ROOT / FIXTURE_LOGS)))
    out = []
    loader = learner_loader(config, version, files, [], batch_size=batch_size, num_workers=0)
    for batch in iter_full_batches(iter(loader), batch_size):
        out.append(batch)
        if len(out) == limit:
            break
    if not out:
        raise RuntimeError(f'no full batch of {batch_size} samples in {FIXTURE_LOGS}')
    return out


def trainer_worker(a):
    """steps/s of ``Trainer.train_batch`` with AMP off then on; peak memory of each and of a test play."""
    import torch
    from mortal.train import Trainer
    from mortal.play.player import TEST_SEED, TestPlayer, load_baseline_engine

    # The policy-drift probe is an instrument written at saves, which the timed steps never reach: not built.
    Trainer._load_probe = lambda self: None
    base = load(a.config)
    device = torch.device(base['control']['device'])
    out = {'device': str(device), 'batch_size': base['control']['batch_size'], 'version': base['control']['version']}
    t0 = time.monotonic()
    batches = real_batches(base, base['control']['version'], base['control']['batch_size'])
    if device.type == 'cuda':  # as the learner's loader hands them over (pin_memory)
        batches = [tuple(t.pin_memory() for t in b) for b in batches]
    out['samples'] = {'batches': len(batches), 'load_s': round(time.monotonic() - t0, 2), 'source': FIXTURE_LOGS}
    write_json(a.result, out)
    trainer = None
    for amp in (False, True):
        key = f"amp_{'on' if amp else 'off'}"
        out[key] = {'status': 'started'}
        write_json(a.result, out)
        del trainer
        cuda_reset(device)
        config = copy.deepcopy(base)
        config['control']['enable_amp'] = amp
        t_init = time.monotonic()
        trainer = Trainer(config, test_player=_NoTestPlay(), remote=object(), writer=_NullWriter())
        trainer.pb = None
        init_s = time.monotonic() - t_init
        for i in range(3):  # cuDNN benchmark picks its kernels, the allocator fills: not timed
            trainer.train_batch(*batches[i % len(batches)])
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        steps, start = 0, time.monotonic()
        while steps < 2 or time.monotonic() - start < a.box:
            trainer.train_batch(*batches[steps % len(batches)])
            steps += 1
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        wall = time.monotonic() - start
        out[key] = {'status': 'ok', 'enable_amp': amp, 'steps': steps, 'seconds': round(wall, 3),
                    'steps_per_s': round(steps / wall, 3), 'samples_per_s': round(steps * len(batches[0][0]) / wall, 1),
                    'opt_step_every': trainer.opt_step_every, 'init_s': round(init_s, 2),
                    'peak_memory': cuda_peak(device)}
        write_json(a.result, out)

    # The test play of the AMP-on trainer (its models, optimizer and gradients stay resident, as in the learner).
    out['test_play'] = {'status': 'started'}
    write_json(a.result, out)
    counter = _RowCounter()
    baseline = load_baseline_engine(base['baseline']['test'])
    player = TestPlayer(base, baseline_engine=baseline)
    player.begin()
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    start = time.monotonic()
    counter.hard = start + a.test_box
    counter.min_calls = 3  # the first forwards (every game in flight) hold the peak; 3000 games take a while to deal
    finished = True
    try:
        player.play_units(TEST_SEED[0], base['test_play']['games'] // 4, *trainer.played(), device)
    except TimeBoxOver:
        finished = False
    out['test_play'] = {'status': 'ok', 'games_in_flight': base['test_play']['games'], 'finished': finished,
                        'seconds': round(time.monotonic() - start, 2), 'rows': counter.rows,
                        'rows_per_forward': round(counter.rows / counter.calls, 1) if counter.calls else None,
                        'peak_memory': cuda_peak(device)}
    write_json(a.result, out)
    return 0


def part_trainer(ctx):
    sizes = ctx['sizes']
    cap = ctx['cap'](sizes['trainer_cap_s'])
    if cap < 15:
        raise TimeoutError(f'only {cap:.0f} s of the budget left')
    work = ctx['work'] / 'trainer'
    cfg_path = write_config(work, sizes=sizes, device=ctx['device'], version=sizes['trainer_version'],
                            games=sizes['games'], trainer=True)
    write_models(load(cfg_path))
    result = work / 'trainer.json'
    p = ctx['popen']([sys.executable, str(pathlib.Path(__file__).resolve()), 'trainer-worker', '--config',
                      str(cfg_path), '--box', str(sizes['trainer_box_s']), '--test-box', str(sizes['test_box_s']),
                      '--result', str(result)], 'trainer')
    try:
        p.wait(timeout=cap)
    except subprocess.TimeoutExpired:
        pass
    finally:
        ctx['kill'](p)
    out = read_json(result) or {}
    for key in ('amp_off', 'amp_on', 'test_play'):
        if out.get(key, {}).get('status') != 'ok':
            out.setdefault(key, {})['status'] = f'failed (exit {p.returncode}; see logs/trainer.log)'
    ctx['shared']['trainer_config'] = str(cfg_path)  # for the memory part (a temporary path: not in the results)
    return out


# ---------------------------------------------------------------------------- memory against the doctor

def part_memory(ctx, results):
    """Measured peaks next to ``mortal.doctor.estimate_memory`` of the same configs."""
    import toml
    from mortal.doctor import estimate_memory

    sizes = ctx['sizes']
    trainer = results.get('trainer') or {}
    cfg_path = ctx['shared'].get('trainer_config') or str(write_config(ctx['work'] / 'memory', sizes=sizes, device=ctx['device'],
                                                         version=sizes['trainer_version'], games=sizes['games'],
                                                         trainer=True))
    base = toml.load(cfg_path)

    def measured(rec):
        return (rec or {}).get('peak_memory') or {'allocated': None, 'reserved': None}

    rows = {}
    for amp in (False, True):
        key = f"amp_{'on' if amp else 'off'}"
        cfg = copy.deepcopy(base)
        cfg['control']['enable_amp'] = amp
        cfg['test_play']['games'] = 0  # the doctor's trainer figure is then its training term
        est = estimate_memory(cfg)['trainer'][1]
        rows[f'trainer_{key}'] = {**measured(trainer.get(key)), 'doctor_estimate': est,
                                  'doctor_term': 'trainer, [test_play] games = 0 (its training term)'}
    cfg = copy.deepcopy(base)
    cfg['control']['batch_size'] = 0  # the doctor's trainer figure is then its test-play term
    rows['test_play'] = {**measured(trainer.get('test_play')), 'doctor_estimate': estimate_memory(cfg)['trainer'][1],
                         'doctor_term': f"trainer, batch_size = 0 (its test-play term, {sizes['test_games']} games)"}
    sp = results.get('selfplay_1_client') or {}
    for version in (3, 4):
        recs = (sp.get(f'v{version}') or {}).get('per_client') or [None]
        cfg = copy.deepcopy(base)
        cfg['control']['version'] = version
        rows[f'client_v{version}'] = {**measured(recs[0]), 'doctor_estimate': estimate_memory(cfg)['client'][1],
                                      'doctor_term': f"client, {sizes['games']} games per round"}
    full = estimate_memory(base)
    out = {'rows': rows, 'doctor_trainer': full['trainer'][1], 'doctor_client': full['client'][1],
           'doctor_three_processes': full['trainer'][1] + full['client'][1],
           'note': 'measured: torch.cuda.max_memory_allocated / max_memory_reserved (no CUDA context); doctor: '
                   'mortal.doctor.estimate_memory, which adds a 512 MiB CUDA context and 25% slack; null on CPU'}
    import torch
    if ctx['device'].startswith('cuda'):
        out['device_total'] = int(torch.cuda.get_device_properties(0).total_memory)
    else:
        out['device_total'] = None
    return out


# ---------------------------------------------------------------------------- the online run

_LINE = re.compile(r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ mortal\.train: (.*)$')


def learner_idle(log_text, stop_time):
    """The learner's waits for drains in a trainer log (supervisor + learner lines).

    ``stop_time``: epoch seconds when the run was stopped. Returns ``{'ready': epoch of the first idle
    submission, 'waits': [seconds of each finished drain], 'ongoing': seconds of a wait still running at the stop
    (0.0 if none), 'logs': logs drained}``; ``ready`` None when the learner never submitted."""
    ready, waits, logs, waiting_since = None, [], 0, None
    for line in re.split(r'[\r\n]+', log_text):
        m = _LINE.match(line)
        if not m:
            continue
        t = datetime.datetime.strptime(m.group(1), '%Y-%m-%d %H:%M:%S,%f').timestamp()
        msg = m.group(2)
        if re.match(r'param has been submitted \(version -?\d+, idle\)', msg):
            ready = t if ready is None else ready
            waiting_since = t  # each idle submission is followed by the next drain
        d = re.match(r'drained (\d+) logs after ([\d.]+) s', msg)
        if d:
            waits.append(float(d.group(2)))
            logs += int(d.group(1))
            waiting_since = None
    ongoing = max(0.0, stop_time - waiting_since) if waiting_since is not None else 0.0
    return {'ready': ready, 'waits': waits, 'ongoing': ongoing, 'logs': logs}


def trained_steps(log_text, save_every):
    """Steps the learner has trained by the end of ``log_text``: its last ``total steps: N`` line (logged at each
    epoch start and save) moved on by the progress bar after it (which counts from ``N % save_every``); None
    without such a line."""
    steps = base = None
    for chunk in re.split(r'[\r\n]+', log_text):
        m = re.search(r'total steps: ([\d,]+)', chunk)
        if m:
            steps = int(m.group(1).replace(',', ''))
            base = steps - steps % save_every
            continue
        b = re.search(r'TRAIN:.*?\|\s*(\d+)/\d+', chunk)
        if b and base is not None:
            steps = max(steps, base + int(b.group(1)))
    return steps


def submitted_logs(log_text, since, until):
    """Logs a client submitted between the epoch seconds ``since`` and ``until`` (its ``N logs have been submitted``
    lines)."""
    total = 0
    for line in re.split(r'[\r\n]+', log_text):
        m = re.match(r'^(\S+ \S+) \w+ mortal\.client: (\d+) logs have been submitted', line)
        if m and since <= datetime.datetime.strptime(m.group(1), '%Y-%m-%d %H:%M:%S,%f').timestamp() <= until:
            total += int(m.group(2))
    return total


def idle_summary(idle, stop_time):
    """Figures of a ``learner_idle`` record: the window from the learner's first idle submission to
    ``stop_time`` (epoch seconds), the time waited in it and the idle fractions (all of it, and after the first
    drain, which includes the clients' first round)."""
    span = stop_time - idle['ready']
    waited = sum(idle['waits']) + idle['ongoing']
    out = {'window_s': round(span, 2), 'wait_s': round(waited, 2), 'idle_fraction': round(waited / span, 4),
           'drains': len(idle['waits']), 'drain_waits_s': idle['waits'],
           'ongoing_wait_at_stop_s': round(idle['ongoing'], 2), 'logs': idle['logs'],
           'idle_fraction_after_first_drain': None}
    if idle['waits']:
        first_end = idle['ready'] + idle['waits'][0]
        if stop_time > first_end:
            out['idle_fraction_after_first_drain'] = round(
                (sum(idle['waits'][1:]) + idle['ongoing']) / (stop_time - first_end), 4)
    return out


def part_online(ctx):
    """Real server + trainer + clients; the learner's idle fraction over the window."""
    from mortal.quickstart import _wait_port

    sizes = ctx['sizes']
    work = ctx['work'] / 'online'
    clients = sizes['online_clients']
    cfg_path = write_config(work, sizes=sizes, device=ctx['device'], version=sizes['online_version'],
                            games=sizes['online_games'], clients=clients)
    config = load(cfg_path)
    write_models(config)
    env = {'MORTAL_CFG': str(cfg_path)}
    procs = {}
    started = time.monotonic()
    try:
        procs['server'] = ctx['popen']([sys.executable, '-m', 'mortal.server'], 'online_server', env=env)
        _wait_port('127.0.0.1', config['online']['remote']['port'], procs['server'], ctx['logs'], timeout=60)
        procs['train'] = ctx['popen']([sys.executable, '-m', 'mortal.train'], 'online_train', env=env)
        for i in range(clients):
            procs[f'client{i}'] = ctx['popen']([sys.executable, '-m', 'mortal.client'], f'online_client{i}', env=env)
        train_log = ctx['logs'] / 'online_train.log'
        # the window starts when the learner is ready (first idle submission) and is cut to the budget left
        while learner_idle(train_log.read_text(errors='replace'), time.time())['ready'] is None:
            if time.monotonic() - started > 90 or ctx['cap'](10**6) < sizes['online_margin_s']:
                raise TimeoutError('the learner did not submit its parameters in time')
            for name, p in procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f'{name} exited with status {p.returncode} (see logs/online_{name}.log)')
            time.sleep(0.2)
        window = min(sizes['online_window_s'], ctx['cap'](10**6) - sizes['online_margin_s'])
        if window <= 0:
            raise TimeoutError('no time left for the online window')
        ready_mono = time.monotonic()
        while time.monotonic() - ready_mono < window:
            for name, p in procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f'{name} exited with status {p.returncode} (see logs/online_{name}.log)')
            time.sleep(0.2)
        stop = time.time()
    finally:
        from mortal.quickstart import stop as stop_procs
        outcome = stop_procs(procs, grace=10) if procs else {}
    text = train_log.read_text(errors='replace')
    idle = learner_idle(text, stop)
    if idle['ready'] is None:
        raise RuntimeError('the learner never submitted its parameters (see logs/online_train.log)')
    summary = idle_summary(idle, stop)
    steps = trained_steps(text, config['control']['save_every'])
    busy = summary['window_s'] - summary['wait_s']
    played = sum(submitted_logs((ctx['logs'] / f'online_client{i}.log').read_text(errors='replace'), idle['ready'],
                                stop) for i in range(clients))
    return {
        'status': 'ok', 'version': sizes['online_version'], 'clients': clients,
        'games_per_round': sizes['online_games'], 'num_workers': sizes['num_workers'],
        'network': f"{sizes['channels']}x{sizes['blocks']}", **summary,
        'steps': steps, 'steps_per_busy_s': round(steps / busy, 3) if steps and busy > 0 else None,
        # the clients beside a training learner, through the real server (whole rounds, so coarse over a window)
        'selfplay_logs_submitted': played,
        'selfplay_hanchan_per_hour': round(played / summary['window_s'] * 3600, 1),
        'processes': outcome,
    }


# ---------------------------------------------------------------------------- arena speculation (--parts arena)

def part_arena(ctx):
    """``bench/arena.py`` with the self-play network (version 3, ``arena_seeds`` * 4 games in flight) on the bench's
    device, ``speculate_passes`` off then on, each in its own process within ``arena_cap_s``: games/s against the
    zero-cost floor of the same run, rows per forward while most games run, and with speculation the useful rows per
    turn (the arena's 0.8 N target of issue 16, measured so far on a CPU only, where speculation is slower)."""
    sizes = ctx['sizes']
    out = {'games': 4 * sizes['arena_seeds'], 'network': f"{sizes['channels']}x{sizes['blocks']}"}
    for arm in ('off', 'on'):
        cap = ctx['cap'](sizes['arena_cap_s'])
        if cap < 10:
            out[arm] = {'status': f'skipped: only {cap:.0f} s of the budget left'}
            continue
        figures = ctx['work'] / f'arena_{arm}.json'
        args = [sys.executable, str(ROOT / 'bench' / 'arena.py'), '--device', ctx['device'], '--version', '3',
                '--channels', str(sizes['channels']), '--blocks', str(sizes['blocks']),
                '--seeds', str(sizes['arena_seeds']), '--speculate', arm, '--bound-width', '0', '--json', str(figures)]
        p = ctx['popen'](args, f'arena_{arm}')
        try:
            rc = p.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            ctx['kill'](p)
            rc = None
        rec = read_json(figures)
        if rc == 0 and rec:
            out[arm] = {'status': 'ok', **rec}
        else:
            out[arm] = {'status': f"failed: {'out of time' if rc is None else f'exit {rc}'} (see logs/arena_{arm}.log)"}
    on, off = out.get('on') or {}, out.get('off') or {}
    if on.get('status') == off.get('status') == 'ok':
        out['games_per_s_on_over_off'] = round(on['model_games_per_s'] / off['model_games_per_s'], 3)
    return out


# ---------------------------------------------------------------------------- the driver

def table(results):
    """The short Markdown table of ``results``."""
    def fmt(x, digits=1):
        return '-' if x is None else (f'{x:,.{digits}f}' if isinstance(x, float) else f'{x:,}')

    def gib(x):
        return '-' if x is None else f'{x / GIB:.2f}'

    def failed(*records):
        """The status of the first of ``records`` (the part's record, then the figure's own entry) that ended other
        than 'ok', as one cell: a part that failed or was skipped shows why (as results.json has it), not dashes that
        look like a part still running. None when none did."""
        for rec in records:
            status = (rec or {}).get('status')
            if status is not None and status != 'ok':
                # one line, '|' escaped: an exception's text must not end the row
                return (str(status).splitlines() or ['-'])[0].replace('|', '\\|')
        return None

    meta = results.get('meta', {})
    lines = [f"# bench/gpu.py ({meta.get('mode')}, {meta.get('device_name')}, torch {meta.get('torch')})", '',
             '| part | figure | value |', '|---|---|---|']
    setup = results.get('setup') or {}
    lines.append(f"| setup | {setup.get('status')} | {fmt(setup.get('seconds'))} s |")
    if meta.get('parts', 'all') == 'all':  # the rows of the default run (dashes until a part ends)
        for clients in (1, 2):
            sp = results.get(f'selfplay_{clients}_client{"s" if clients > 1 else ""}') or {}
            for v in (3, 4):
                e = sp.get(f'v{v}') or {}
                value = failed(sp, e) or f"{fmt(e.get('hanchan_per_hour'))} ({fmt(e.get('rows_per_s'))})"
                lines.append(f"| self-play v{v}, {clients} client(s) | hanchan/h (rows/s) | {value} |")
        tr = results.get('trainer') or {}
        for key in ('amp_off', 'amp_on'):
            value = failed(tr, tr.get(key)) or fmt((tr.get(key) or {}).get('steps_per_s'), 2)
            lines.append(f"| trainer {key} | steps/s at batch {tr.get('batch_size')} | {value} |")
        memory = results.get('memory') or {}
        if failed(memory):  # a failed part has no rows to hold dashes: one row says why
            lines.append(f"| memory | GiB allocated / reserved / doctor | {failed(memory)} |")
        for name, r in (memory.get('rows') or {}).items():
            lines.append(f"| memory {name} | GiB allocated / reserved / doctor | {gib(r.get('allocated'))} / "
                         f"{gib(r.get('reserved'))} / {gib(r.get('doctor_estimate'))} |")
        on = results.get('online') or {}
        idle = f"{fmt(on.get('idle_fraction'), 3)} ({fmt(on.get('idle_fraction_after_first_drain'), 3)})"
        lines.append(f"| online {fmt(on.get('window_s'))} s | learner idle fraction (after 1st drain) | "
                     f"{failed(on) or idle} |")
        played = f"{fmt(on.get('selfplay_hanchan_per_hour'))}, {fmt(on.get('steps'))}"
        lines.append(f"| online | self-play hanchan/h beside the learner, steps trained | {failed(on) or played} |")
    ar = results.get('arena_speculation')
    if ar:
        for arm in ('off', 'on'):
            e = ar.get(arm) or {}
            value = failed(e) or (f"{fmt(e.get('rows_per_forward_80'), 2)} "
                                  f"({fmt(e.get('useful_per_turn_80', e.get('rows_per_forward_80')), 2)}); "
                                  f"{fmt(e.get('model_floor_ratio'), 3)}")
            lines.append(f"| arena v3 {ar.get('network')}, {ar.get('games')} games, speculate {arm} | rows per forward "
                         f"(useful) while >= 80% run; games/s vs floor | {value} |")
        lines.append(f"| arena | games/s speculate on / off | {fmt(ar.get('games_per_s_on_over_off'), 3)} |")
    for name, err in (results.get('errors') or {}).items():
        lines.append(f'| {name} | FAILED | {err.splitlines()[-1][:100] if err else ""} |')
    lines.append(f"\ntotal {fmt(meta.get('total_s'))} s of a {meta.get('budget_s')} s budget")
    return '\n'.join(lines) + '\n'


def run(a):
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
        'meta': {
            'mode': 'cpu-smoke' if a.cpu_smoke else 'gpu', 'device': device,
            'device_name': torch.cuda.get_device_name(0) if cuda else 'cpu', 'cuda_available': torch.cuda.is_available(),
            'torch': torch.__version__, 'torch_cuda': torch.version.cuda, 'cpu_count': os.cpu_count(),
            'sp_threads_per_process': _sp_threads(),
            'commit': _git_commit(), 'started': datetime.datetime.now(datetime.timezone.utc).isoformat(),
            'budget_s': sizes['budget_s'], 'parts': a.parts, 'sizes': {k: v for k, v in sizes.items()},
        },
        'setup': read_json(a.setup_json) if a.setup_json else {'status': 'skipped', 'seconds': 0.0},
        'errors': {},
    }
    results_path = out_dir / RESULTS

    def save():  # under ``lock`` once the parts run
        results['meta']['total_s'] = round(time.time() - t0_wall, 1)
        write_json(results_path, results)
        (out_dir / TABLE).write_text(table(results))

    save()
    def make_popen(children):
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

    def kill(p):
        from mortal.learning.supervisor import signal_group
        if p.poll() is None:
            signal_group(p.pid, 9)
        p.wait()

    lock = threading.Lock()

    def run_part(name, fn, children):
        """Run one part; its result (or failure) goes into ``results`` and is saved at once."""
        t = time.monotonic()
        try:
            if not cuda and not a.cpu_smoke:
                rec = {'status': 'skipped: torch sees no CUDA device (see setup)'}
            else:
                rec = fn()
        except Exception as ex:  # one part failing must not lose the others
            rec = {'status': f'failed: {type(ex).__name__}: {ex}'}
            with lock:
                results['errors'][name] = traceback.format_exc()
        finally:
            for p in children:
                kill(p)
            children.clear()
        rec['part_s'] = round(time.monotonic() - t, 2)
        with lock:
            results[name] = rec
            save()

    work = pathlib.Path(tempfile.mkdtemp(prefix='mortal-gpu-bench-'))

    def fn_of(fn, ctx):
        return lambda: fn(ctx)

    shared = {}  # what one part leaves for a later one (the trainer's config path)

    def context(children):
        return {'shared': shared, 'sizes': sizes, 'device': device, 'work': work, 'logs': logs, 'popen': make_popen(children),
                'kill': kill, 'cap': lambda want: min(want, deadline - time.monotonic())}

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
            children = []
            online = threading.Thread(target=run_part, args=('online', fn_of(part_online, context(children)),
                                                             children))
            online.start()
        for name, fn in parts:
            if name != 'online' or online is None:
                children = []
                run_part(name, fn_of(fn, context(children)), children)
        if online is not None:
            online.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save()
    print(table(results))
    print(f'results: {results_path}')
    return 0 if cuda or a.cpu_smoke else 2


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
