"""The ``trainer`` part of ``bench/gpu.py``: ``Trainer.train_batch`` steps/s with AMP off and on, on real samples,
the peak GPU memory of each, and the peak of a test play beside the AMP-on trainer.

The driver's side (``part_trainer``) runs the worker (``bench/gpu.py trainer-worker``) in a process of its own
within its time cap; the worker (``trainer_worker``) writes its record as it goes.

Run as a script, the learner's step on the CPU: ``step`` (one tree), ``interleave`` (``--old`` and ``--new`` trees in
turn), ``arms`` (compile, AMP). ``--online`` is the quickstart's online learner alone, no client: real batches of the
fixture logs, the anchor, the in-process offline mix of 64, saves (TensorBoard, checkpoint, the probe) and packed
submits every 20 steps; it prints the learner's CPU ms per online sample (docs/performance_gpu.md, "The online
learner alone")::

    python bench/gpu_trainer.py interleave --online --old OLD_CHECKOUT --version 3 --batch 64 --warmup 20 \
        --steps 320 --rounds 3 --threads 1 --metric cpu_ms_per_online_sample
"""

if __name__ == '__main__':  # a script: --tree's mortal/ (default this checkout's) first on the path, then this root
    import sys
    import pathlib
    sys.path[:1] = ([sys.argv[sys.argv.index('--tree') + 1]] if '--tree' in sys.argv else []) + [
        str(pathlib.Path(__file__).resolve().parent.parent)]

import copy
import glob
import json
import logging
import pathlib
import subprocess
import sys
import time

from bench.gpu_common import (FIXTURE_LOGS, GPU_SCRIPT, ROOT, RowCounter, TimeBoxOver, cuda_peak, cuda_reset, load,
                              read_json, write_config, write_json, write_models)


class _NullWriter:
    """A SummaryWriter that writes nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _NoTestPlay:
    """A test player that never plays (the timed trainer never reaches a save)."""

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
        trainer, out[key] = _timed_trainer(Trainer, base, amp, batches, device, a.box)
        write_json(a.result, out)

    # The test play of the AMP-on trainer (its models, optimizer and gradients stay resident, as in the learner).
    out['test_play'] = {'status': 'started'}
    write_json(a.result, out)
    out['test_play'] = _test_play_peak(base, trainer, device, a.test_box)
    write_json(a.result, out)
    return 0


def _timed_trainer(Trainer, base, amp, batches, device, box):
    """A ``Trainer`` of ``base`` with ``enable_amp = amp`` and its record: ``train_batch`` steps over ``box``
    seconds (after 3 steps not timed), steps/s, samples/s and the peak memory."""
    import torch

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
    # cuDNN's benchmark tries algorithms with workspaces as large as the free memory allows: a peak of the first
    # steps that a smaller card would not reach; the steady peak is the training's own
    warmup_peak = cuda_peak(device)
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    steps, start = 0, time.monotonic()
    while steps < 2 or time.monotonic() - start < box:
        trainer.train_batch(*batches[steps % len(batches)])
        steps += 1
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    wall = time.monotonic() - start
    steady = cuda_peak(device)
    return trainer, {'status': 'ok', 'enable_amp': amp, 'steps': steps, 'seconds': round(wall, 3),
                     'steps_per_s': round(steps / wall, 3),
                     'samples_per_s': round(steps * len(batches[0][0]) / wall, 1),
                     'opt_step_every': trainer.opt_step_every, 'init_s': round(init_s, 2),
                     'peak_memory': _max_peak(warmup_peak, steady), 'peak_memory_warmup': warmup_peak,
                     'peak_memory_steady': steady}


def _max_peak(a, b):
    """The larger of two ``cuda_peak`` records, key by key (None on the CPU)."""
    return {k: None if a[k] is None else max(a[k], b[k]) for k in a}


def _test_play_peak(base, trainer, device, box):
    """The record of a test play (``[test_play] games`` in flight) of ``trainer``'s played models, stopped after
    ``box`` seconds: the peak memory is at its start, when every game is in flight."""
    import torch
    from mortal.config import section
    from mortal.play.player import TEST_SEED, TestPlayer, load_baseline_engine

    counter = RowCounter()
    baseline = load_baseline_engine(section(base, 'baseline.test'))
    player = TestPlayer(base, baseline_engine=baseline)
    player.begin()
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    start = time.monotonic()
    counter.hard = start + box
    counter.min_calls = 3  # the first forwards (every game in flight) hold the peak; 3000 games take a while to deal
    finished = True
    try:
        player.play_units(TEST_SEED[0], base['test_play']['games'] // 4, *trainer.played(), device)
    except TimeBoxOver:
        finished = False
    return {'status': 'ok', 'games_in_flight': base['test_play']['games'], 'finished': finished,
            'seconds': round(time.monotonic() - start, 2), 'rows': counter.rows,
            'rows_per_forward': round(counter.rows / counter.calls, 1) if counter.calls else None,
            'peak_memory': cuda_peak(device)}


def part_trainer(ctx):
    """The trainer worker in a process of its own within ``trainer_cap_s``; its record, each figure it did not
    reach marked failed."""
    sizes = ctx['sizes']
    cap = ctx['cap'](sizes['trainer_cap_s'])
    if cap < 15:
        raise TimeoutError(f'only {cap:.0f} s of the budget left')
    work = ctx['work'] / 'trainer'
    cfg_path = write_config(work, sizes=sizes, device=ctx['device'], version=sizes['trainer_version'],
                            games=sizes['games'][sizes['trainer_version']], trainer=True)
    write_models(load(cfg_path))
    result = work / 'trainer.json'
    p = ctx['popen']([sys.executable, str(GPU_SCRIPT), 'trainer-worker', '--config',
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


# ---------------------------------------------------------------------------- the step on the CPU (issue 32 part 5)

# Ops that launch no kernel on a GPU (views, shape and bookkeeping): left out of the kernel count of a step.
NO_KERNEL_OPS = {'aten::view', 'aten::as_strided', 'aten::unsqueeze', 'aten::squeeze', 'aten::t', 'aten::expand',
                 'aten::empty', 'aten::empty_strided', 'aten::resize_', 'aten::detach', 'aten::reshape',
                 'aten::_reshape_alias', 'aten::permute', 'aten::transpose', 'aten::select', 'aten::slice',
                 'aten::alias', 'aten::_unsafe_view', 'aten::empty_like', 'aten::lift_fresh', 'aten::result_type',
                 'aten::is_nonzero', 'aten::_local_scalar_dense', 'aten::item', 'aten::unbind', 'aten::flatten',
                 'aten::set_', 'aten::stride', 'aten::size', 'aten::numel', 'aten::_has_compatible_shallow_copy_type',
                 'aten::contiguous', 'aten::resolve_conj', 'aten::resolve_neg', 'aten::conj', 'aten::split',
                 'aten::narrow', 'aten::expand_as', 'aten::view_as', 'aten::chunk', 'aten::dim'}


# The online settings of the quickstart's embedded config (mortal/tools/quickstart_config.py) that ``--online`` adds.
EMBEDDED_ONLINE = {'control': {'save_every': 20, 'submit_every': 20}, 'online': {'anchor_weight': 1.0,
                                                                                  'offline_batch_size': 64}}


def step_config(work, channels, blocks, batch, version, amp=False, compile_=False, device='cpu', online=False):
    """The trainer part's config on ``device`` at this network and batch (models written), loaded; ``online``: with
    ``EMBEDDED_ONLINE`` (the offline mix and the probe read the fixture logs; no test play)."""
    sizes = {'test_games': 4, 'num_workers': 0, 'channels': channels, 'blocks': blocks}
    cfg_path = write_config(work, sizes=sizes, device=device, version=version, games=4, trainer=True)
    config = load(cfg_path)
    config['control'].update(batch_size=batch, enable_amp=amp, enable_compile=compile_)
    if online:
        for section, values in EMBEDDED_ONLINE.items():
            config[section].update(values)
    write_models(config)
    return config


class _CountingRemote:
    """The server's side of a parameter submit: accepts it (the learner still packs the weights)."""

    def request(self, msg):
        return {'status': 'ok', 'param_version': 1}


def _phase_clock(trainer, times):
    """Wrap the parts of ``trainer``'s step so that their wall time adds up in ``times`` (also profiler ranges)."""
    import torch
    import mortal.train as tr
    from mortal.learning import intake

    def wrap(name, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            with torch.profiler.record_function(name):
                try:
                    return fn(*args, **kwargs)
                finally:
                    times[name] = times.get(name, 0.0) + time.perf_counter() - t
        return timed

    restore = [(intake, 'batch_on_device', intake.batch_on_device), (tr, 'learner_loss', tr.learner_loss),
               (tr, 'optimizer_step', tr.optimizer_step), (torch.Tensor, 'backward', torch.Tensor.backward)]
    intake.batch_on_device = wrap('to device (+ unpack, mask check)', intake.batch_on_device)
    tr.learner_loss = wrap('loss terms', tr.learner_loss)
    tr.optimizer_step = wrap('optimizer (AdamW, clip, every opt_step_every)', tr.optimizer_step)
    torch.Tensor.backward = wrap('backward', torch.Tensor.backward)
    trainer.mortal.forward = wrap('forward: Brain', trainer.mortal.forward)
    trainer.dqn.forward = wrap('forward: DQN', trainer.dqn.forward)
    trainer.aux_net.forward = wrap('forward: aux next-rank head', trainer.aux_net.forward)
    trainer._account = wrap('loss sums + q stats (host syncs)', trainer._account)
    return restore


def step_worker(a):
    """Steps/s of ``Trainer.train_batch`` on the CPU at ``--channels x --blocks``, batch ``--batch`` (real samples);
    with ``--phases`` the wall time per part of the step, with ``--profile`` torch.profiler's op table and the count
    of ops that would launch a GPU kernel. Prints one JSON line."""
    import tempfile
    import torch
    from mortal.train import Trainer
    torch.manual_seed(0)
    if a.threads:
        torch.set_num_threads(a.threads)
    if not a.online:
        Trainer._load_probe = lambda self: None
    if a.dense_stem:  # the first convolution as F.conv1d and Mish as F.mish, as on a GPU (the CPU's are other ops)
        import mortal.model.networks as networks
        networks._stem = None
        if hasattr(networks, 'Mish'):
            networks.Mish.forward = torch.nn.Mish.forward
    work = tempfile.mkdtemp(prefix='step-')
    config = step_config(work, a.channels, a.blocks, a.batch, a.version, amp=a.amp, compile_=a.compile,
                         device=a.device, online=a.online)
    t = time.perf_counter()
    batches = _batches(config, a)
    load_ms = 1e3 * (time.perf_counter() - t) / len(batches)  # the loader in this process (num_workers = 0)
    if a.online:  # saves with TensorBoard, checkpoint, probe; submits packed for an accepting server
        from torch.utils.tensorboard import SummaryWriter
        trainer = Trainer(config, test_player=_NoTestPlay(), remote=_CountingRemote(),
                          writer=SummaryWriter(work + '/tb'))
        logging.getLogger('mortal').setLevel(logging.WARNING)  # a line per submit and save
    else:
        trainer = Trainer(config, test_player=_NoTestPlay(), remote=object(), writer=_NullWriter())
    t = time.perf_counter()
    for i in range(a.warmup):  # compile (when on) and the allocator's first fill: not timed
        trainer.train_batch(*batches[i % len(batches)])
    out = {'tree': a.tree, 'channels': a.channels, 'blocks': a.blocks, 'batch': a.batch, 'amp': a.amp,
           'compile': a.compile, 'warmup_s': round(time.perf_counter() - t, 2), 'threads': torch.get_num_threads()}
    times = {}
    if a.phases or a.profile:
        _phase_clock(trainer, times)
    prof = None
    if a.profile:
        acts = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if a.device.startswith('cuda') else [])
        prof = torch.profiler.profile(activities=acts, record_shapes=True)
        prof.__enter__()
    _sync(a.device)
    t, cpu = time.perf_counter(), time.process_time()
    for i in range(a.steps):
        trainer.train_batch(*batches[i % len(batches)])
    _sync(a.device)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    if prof is not None:
        prof.__exit__(None, None, None)
        out['kernels_per_step'] = {k: v / a.steps for k, v in _kernel_count(prof, times).items()}
        print(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=25), file=sys.stderr)
    if a.phases:  # a save's TensorBoard writes (every save_every steps), into a real event file
        from torch.utils.tensorboard import SummaryWriter
        from mortal.train import write_scalars
        writer = SummaryWriter(work + '/tb')
        for key in ('tensorboard_ms_first_save', 'tensorboard_ms_per_save'):  # the first pays for first use
            t = time.perf_counter()
            write_scalars(writer, trainer.steps, trainer.stats, trainer.stat_batches,
                          loss_weights=trainer.loss_weights, offline_mix=False, lr=1e-4,
                          settings=trainer.play_settings(), instruments=trainer.instruments,
                          trained=trainer.models, device=trainer.device)
            out[key] = round(1e3 * (time.perf_counter() - t), 2)
        writer.close()
    if a.online:
        probe = trainer.instruments.probe
        out.update(cpu_ms_per_online_sample=round(1e3 * cpu / (a.steps * a.batch), 4),
                   probe_size=len(probe) if probe is not None else None)
    out.update(steps=a.steps, ms_per_step=round(1e3 * wall / a.steps, 2), load_ms_per_batch=round(load_ms, 1),
               samples_per_s=round(a.steps * a.batch / wall, 1),
               # the process's CPU seconds: on a shared box less bent by other processes than the wall clock
               samples_per_cpu_s=round(a.steps * a.batch / cpu, 1),
               phases_ms={k: round(1e3 * v / a.steps, 3) for k, v in times.items()})
    print(json.dumps(out))
    return 0


def _batches(config, a):
    """Up to 4 real batches of ``a.batch``, pinned for a GPU as the learner's loader pins them."""
    batches = real_batches(config, a.version, a.batch, limit=4)
    return [tuple(t.pin_memory() for t in b) for b in batches] if a.device.startswith('cuda') else batches


def _sync(device):
    """Wait for a GPU's queue (a timing boundary); nothing on the CPU."""
    if device.startswith('cuda'):
        import torch
        torch.cuda.synchronize(device)


def _kernel_count(prof, phases=()):
    """Ops of the profile that would launch a GPU kernel (aten ops with no aten op below them, views left out):
    ``{phase: count}`` for each profiler range named in ``phases`` and ``'all'``."""
    def leaves(e):
        kids = [c for c in e.cpu_children if c.name.startswith('aten::')]
        if e.name.startswith('aten::') and not kids:
            return 0 if e.name in NO_KERNEL_OPS else 1
        return sum(leaves(c) for c in e.cpu_children)
    top = [e for e in prof.events() if e.cpu_parent is None]
    out = {'all': sum(leaves(e) for e in top)}
    for e in prof.events():
        if e.name in phases:
            out[e.name] = out.get(e.name, 0) + leaves(e)
    return out


def interleave(a):
    """``step_worker`` of ``--old`` and ``--new`` trees in turn, ``--rounds`` times each (A B A B ...): each tree's
    samples/s and the new/old ratio per pair (median, min, max)."""
    import statistics
    runs = {'old': [], 'new': []}
    ratios = []
    for _ in range(a.rounds):
        for which in ('old', 'new'):
            tree = getattr(a, which)
            cmd = [sys.executable, __file__, 'step', '--tree', tree, '--channels', str(a.channels), '--blocks',
                   str(a.blocks), '--batch', str(a.batch), '--steps', str(a.steps), '--warmup', str(a.warmup),
                   '--version', str(a.version), '--threads', str(a.threads), '--device', a.device] + (
                       ['--amp'] if a.amp else []) + (['--online'] if a.online else [])
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[which].append(json.loads(res.stdout.strip().splitlines()[-1])[a.metric])
        ratios.append(runs['new'][-1] / runs['old'][-1])
    print(json.dumps({'metric': a.metric, 'old': runs['old'], 'new': runs['new'],
                      'ratio_median': round(statistics.median(ratios), 3),
                      'ratio_min': round(min(ratios), 3), 'ratio_max': round(max(ratios), 3)}))


def arms_worker(a):
    """``[control] enable_compile`` and AMP (bf16 autocast on the CPU) against the plain step, in one process with
    their steps interleaved (eager, compile, amp, eager, ...: the machine's noise falls on all alike); each arm's
    samples/s over ``--rounds`` blocks of ``--steps`` steps, after ``--warmup`` steps (compiling) not timed."""
    import tempfile
    import statistics
    import torch
    from mortal.train import Trainer
    Trainer._load_probe = lambda self: None
    if a.threads:
        torch.set_num_threads(a.threads)
    flags = {'eager': (False, False), 'compile': (False, True), 'amp': (True, False), 'amp+compile': (True, True)}
    trainers, out, batches = {}, {}, None
    for arm in a.arms.split(','):
        torch.manual_seed(0)
        config = step_config(tempfile.mkdtemp(prefix='arm-'), a.channels, a.blocks, a.batch, a.version,
                             amp=flags[arm][0], compile_=flags[arm][1], device=a.device)
        batches = batches or _batches(config, a)
        trainers[arm] = Trainer(config, test_player=_NoTestPlay(), remote=object(), writer=_NullWriter())
        t = time.perf_counter()
        for i in range(a.warmup):
            trainers[arm].train_batch(*batches[i % len(batches)])
        out[arm] = {'warmup_s': round(time.perf_counter() - t, 1), 'samples_per_s': [], 'samples_per_cpu_s': []}
    for r in range(a.rounds):
        for arm, trainer in trainers.items():
            _sync(a.device)
            t, cpu = time.perf_counter(), time.process_time()
            for i in range(a.steps):
                trainer.train_batch(*batches[i % len(batches)])
            _sync(a.device)
            out[arm]['samples_per_s'].append(round(a.steps * a.batch / (time.perf_counter() - t), 1))
            out[arm]['samples_per_cpu_s'].append(round(a.steps * a.batch / (time.process_time() - cpu), 1))
    for arm in out:  # the ratio of each round's pair (the noise of a moment falls on both): median, min, max
        for key in ('samples_per_s', 'samples_per_cpu_s'):
            out[arm][key + '_median'] = statistics.median(out[arm][key])
            if 'eager' in out:
                pairs = sorted(x / e for x, e in zip(out[arm][key], out['eager'][key]))
                out[arm][key + '_over_eager'] = [round(statistics.median(pairs), 3), round(pairs[0], 3),
                                                 round(pairs[-1], 3)]
    print(json.dumps({'channels': a.channels, 'blocks': a.blocks, 'batch': a.batch, 'arms': out}))
    return 0


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description='the learner step on the CPU: steps/s, its parts, old against new')
    sub = p.add_subparsers(dest='cmd', required=True)
    for name in ('step', 'interleave', 'arms'):
        s = sub.add_parser(name)
        s.add_argument('--channels', type=int, default=32)
        s.add_argument('--blocks', type=int, default=2)
        s.add_argument('--batch', type=int, default=256)
        s.add_argument('--version', type=int, default=4)
        s.add_argument('--steps', type=int, default=20)
        s.add_argument('--warmup', type=int, default=3)
        s.add_argument('--amp', action='store_true', help='bf16 autocast on the CPU')
        s.add_argument('--threads', type=int, default=0, help='torch threads (0: torch\'s default)')
        s.add_argument('--device', default='cpu', help="cpu, or cuda:0 (the device run: --amp is fp16 there)")
    for name in ('step', 'interleave'):
        sub.choices[name].add_argument(
            '--online', action='store_true', help="the embedded config's online learner: anchor, offline mix 64, "
            'save and submit every 20 steps (TensorBoard, checkpoint, probe); --batch is the online rows')
    s = sub.choices['step']
    s.add_argument('--tree', default=str(ROOT), help='the source tree whose mortal/ runs')
    s.add_argument('--compile', action='store_true', help='[control] enable_compile')
    s.add_argument('--phases', action='store_true')
    s.add_argument('--profile', action='store_true')
    s.add_argument('--dense-stem', action='store_true',
                   help="the Brain's first convolution dense and F.mish, as on a GPU (kernel counts of the GPU's path)")
    i = sub.choices['interleave']
    i.add_argument('--old', required=True)
    i.add_argument('--new', default=str(ROOT))
    i.add_argument('--rounds', type=int, default=3)
    i.add_argument('--metric', choices=('samples_per_s', 'samples_per_cpu_s', 'cpu_ms_per_online_sample'),
                   default='samples_per_cpu_s')
    sub.choices['arms'].add_argument('--arms', default='eager,compile,amp')
    sub.choices['arms'].add_argument('--rounds', type=int, default=3)
    a = p.parse_args(argv)
    return {'step': step_worker, 'interleave': interleave, 'arms': arms_worker}[a.cmd](a)


if __name__ == '__main__':
    sys.exit(main())
