"""The ``trainer`` part of ``bench/gpu.py``: ``Trainer.train_batch`` steps/s with AMP off and on, on real samples,
the peak GPU memory of each, and the peak of a test play beside the AMP-on trainer.

The driver's side (``part_trainer``) runs the worker (``bench/gpu.py trainer-worker``) in a process of its own
within its time cap; the worker (``trainer_worker``) writes its record as it goes.
"""

import copy
import glob
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
