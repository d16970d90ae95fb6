"""The ``profile`` part of ``bench/gpu.py``: where one self-play client's cycle (one ``MortalEngine.react_batch`` and
the arena's work until the next) goes: CPU time in the arena, time in the engine (its CPU work: stacking, the copy,
launching the forward's kernels; the GPU's kernels; the wait for them) and the GPU's busy time.

Two phases of one client (``bench/gpu.py profile-worker``), each a round of ``profile_games`` games stopped after its
seconds (the games are all in flight then, as in the sweep's rounds):

* ``split`` (no profiler): every ``react_batch`` timed from outside (wall, this thread's CPU time, and on CUDA the
  span between two CUDA events around it); the rest of a cycle is the arena's;
* ``profiler``: ``torch.profiler`` over the same loop: kernels per forward, their summed GPU time (busy), and the
  CPU time of the CUDA runtime calls (launches, copies, synchronisations: the wait shows there, since the CUDA
  driver spins while it waits); the op tables go to ``logs/profile_ops.txt``.
"""

import sys
import time

from bench.gpu_common import GPU_SCRIPT, RowCounter, TimeBoxOver, load, read_json, write_config, write_json, \
    write_models


class EngineTimer:
    """Times every ``MortalEngine.react_batch`` of this process from outside: ``calls``, ``rows``, ``wall``
    (seconds inside), ``cpu`` (this thread's CPU seconds inside) and, on CUDA, ``gpu_span`` (seconds between CUDA
    events recorded before and after it, read at the end)."""

    def __init__(self, device):
        import torch
        from mortal.play.engine import MortalEngine
        self.calls = self.rows = 0
        self.wall = self.cpu = 0.0
        self.events = []
        self.cuda = torch.device(device).type == 'cuda'
        inner = MortalEngine.react_batch  # RowCounter's wrapper when one is installed (its hard limit holds)
        timer = self

        def react_batch(engine, obs, masks, invisible_obs=None):
            ev = None
            if timer.cuda:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
            w0, c0 = time.perf_counter(), time.thread_time()
            out = inner(engine, obs, masks, invisible_obs)
            timer.cpu += time.thread_time() - c0
            timer.wall += time.perf_counter() - w0
            if ev is not None:
                ev[1].record()
                timer.events.append(ev)
            timer.calls += 1
            timer.rows += len(obs)
            return out

        MortalEngine.react_batch = react_batch

    def gpu_span(self):
        """Seconds between the CUDA events of all calls (None on the CPU)."""
        if not self.cuda:
            return None
        import torch
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in self.events) / 1000


def _play_for(player, mortal, dqn, device, counter, seconds):
    """One round of ``player`` stopped after ``seconds`` (or at its end); returns the wall seconds it ran."""
    start = time.monotonic()
    counter.hard = start + seconds
    try:
        player.train_play(mortal, dqn, device)
    except TimeBoxOver:
        pass
    return time.monotonic() - start


def profile_worker(a):
    """The profile of one client: the ``split`` phase, then the ``profiler`` phase; the record in ``a.result``."""
    import torch
    from bench.gpu_selfplay import _client_models

    torch.set_num_threads(1)
    device = torch.device(a.device)
    config = load(a.config)
    version = config['control']['version']
    a.index = 0
    mortal, dqn, player = _client_models(a, config, version, device)
    counter = RowCounter()
    timer = EngineTimer(device)
    out = {'version': version, 'games': config['train_play']['default']['games'], 'device': str(device)}
    cpu0 = time.process_time()
    wall = _play_for(player, mortal, dqn, device, counter, a.split_s)
    out['split'] = _split_figures(timer, wall, time.process_time() - cpu0)
    write_json(a.result, out)
    try:  # the profiler's CUDA tracing (CUPTI) may be unavailable on a machine: the split phase stands alone
        out['profiler'] = _profiled(player, mortal, dqn, device, counter, a.profile_s, a.ops)
    except Exception as ex:
        out['profiler'] = {'status': f'failed: {type(ex).__name__}: {ex}'}
    write_json(a.result, out)
    return 0


def _split_figures(timer, wall, process_cpu):
    """ms per cycle (one forward and the arena's work after it) of the split phase."""
    n = timer.calls
    if not n:
        return {'status': 'failed: no forward in the phase'}
    per = lambda s: round(s / n * 1000, 3) if s is not None else None  # noqa: E731
    span = timer.gpu_span()
    return {'status': 'ok', 'seconds': round(wall, 2), 'forwards': n, 'rows': timer.rows,
            'rows_per_forward': round(timer.rows / n, 2), 'rows_per_s': round(timer.rows / wall, 1),
            'cycle_ms': per(wall), 'engine_ms': per(timer.wall), 'engine_cpu_ms': per(timer.cpu),
            'arena_ms': per(wall - timer.wall), 'engine_gpu_span_ms': per(span),
            'process_cpu_fraction': round(process_cpu / wall, 3)}


def _profiled(player, mortal, dqn, device, counter, seconds, ops_path):
    """The profiler phase's figures, per forward: the GPU's kernels and copies (their count and busy ms) and the CPU
    ms of the CUDA runtime's launches, copies and synchronisations; the op tables written to ``ops_path``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == 'cuda'
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    calls0 = counter.calls
    with profile(activities=acts) as prof:
        wall = _play_for(player, mortal, dqn, device, counter, seconds)
        if cuda:
            torch.cuda.synchronize()
    n = counter.calls - calls0
    if not n:
        return {'status': 'failed: no forward in the phase'}
    avgs = prof.key_averages()
    kernels = busy = 0.0
    runtime = {'launch': 0.0, 'memcpy': 0.0, 'synchronize': 0.0, 'other': 0.0}
    for e in avgs:
        if cuda and str(getattr(e, 'device_type', '')).endswith('CUDA'):
            kernels += e.count
            busy += getattr(e, 'self_device_time_total', None) or getattr(e, 'self_cuda_time_total', 0.0)
        elif e.key.startswith('cu'):
            kind = next((k for k in ('launch', 'memcpy', 'synchronize') if k in e.key.lower()), 'other')
            runtime[kind] += e.cpu_time_total
    with open(ops_path, 'w') as f:
        f.write(f'# {n} forwards in {wall:.2f} s\n')
        f.write(avgs.table(sort_by='self_cpu_time_total', row_limit=30) + '\n')
        if cuda:
            f.write(avgs.table(sort_by='self_device_time_total', row_limit=30) + '\n')
    per = lambda us: round(us / n / 1000, 3)  # noqa: E731  the profiler counts microseconds
    return {'status': 'ok', 'seconds': round(wall, 2), 'forwards': n, 'cycle_ms': round(wall / n * 1000, 3),
            'kernels_per_forward': round(kernels / n, 1) if cuda else None,
            'gpu_busy_ms': per(busy) if cuda else None,
            'runtime_cpu_ms': {k: per(v) for k, v in runtime.items()} if cuda else None,
            'note': 'the profiler adds its own CPU time to every op: cycle_ms here is above the split phase\'s'}


def part_profile(ctx):
    """The profile worker in a process of its own within ``profile_cap_s``; its record."""
    sizes = ctx['sizes']
    cap = ctx['cap'](sizes['profile_cap_s'])
    if cap < 15:
        raise TimeoutError(f'only {cap:.0f} s of the budget left')
    work = ctx['work'] / 'profile'
    cfg_path = write_config(work, sizes=sizes, device=ctx['device'], version=sizes['profile_version'],
                            games=sizes['profile_games'])
    write_models(load(cfg_path))
    result = work / 'profile.json'
    args = [sys.executable, str(GPU_SCRIPT), 'profile-worker', '--device', ctx['device'], '--config', str(cfg_path),
            '--split-s', str(sizes['profile_split_s']), '--profile-s', str(sizes['profile_profiler_s']),
            '--ops', str(ctx['logs'] / 'profile_ops.txt'), '--result', str(result)]
    if sizes['warmup']:
        args.append('--warmup')
    p = ctx['popen'](args, 'profile')
    try:
        p.wait(timeout=cap)
    finally:
        ctx['kill'](p)
    out = read_json(result) or {}
    for key in ('split', 'profiler'):
        if (out.get(key) or {}).get('status') != 'ok':
            out.setdefault(key, {})['status'] = f'failed (exit {p.returncode}; see logs/profile.log)'
    out['explained'] = explain(out.get('split') or {}, out.get('profiler') or {})
    return out


def explain(split, prof):
    """One line: the split phase's ms per cycle into the arena's CPU, the engine's CPU and the wait (the engine's
    wall beyond its CPU time, plus the runtime's synchronisations where the driver spins), with the GPU's busy ms."""
    if split.get('status') != 'ok':
        return None
    parts = [f"{split['cycle_ms']:.1f} ms per cycle of {split['rows_per_forward']:.0f} rows: arena "
             f"{split['arena_ms']:.1f}, engine {split['engine_ms']:.1f} "
             f"(its thread's CPU {split['engine_cpu_ms']:.1f})"]
    if prof.get('status') == 'ok' and prof.get('gpu_busy_ms') is not None:
        rt = prof['runtime_cpu_ms']
        parts.append(f"GPU busy {prof['gpu_busy_ms']:.1f} ms in {prof['kernels_per_forward']:.0f} kernels; under the "
                     f"profiler the runtime's launches took {rt['launch']:.1f} ms of CPU, copies {rt['memcpy']:.1f}, "
                     f"synchronisations {rt['synchronize']:.1f}")
    return '; '.join(parts)
