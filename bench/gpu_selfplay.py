"""The ``selfplay`` part of ``bench/gpu.py``: hanchan per hour of the client's self-play path, at feature version 3
and 4, with 1 or 2 client processes playing at once on the same card.

The driver's side (``part_selfplay``) starts the clients (``bench/gpu.py selfplay-worker``), lets every version
start when all of them are ready, and sums their records; a client (``selfplay_worker``) warms up each version and
plays rounds within its time box.
"""

import os
import pathlib
import subprocess
import sys
import time

from bench.gpu_common import (GPU_SCRIPT, RowCounter, TimeBoxOver, cuda_peak, cuda_reset, load, read_json,
                              write_config, write_json, write_models)


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

    torch.set_num_threads(1)
    device = torch.device(a.device)
    counter = RowCounter()
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
        mortal, dqn, player = _client_models(a, config, version, device)
        cuda_reset(device)
        rec['warmup_s'] = round(time.monotonic() - t0, 2)
        pathlib.Path(f'{a.ready}.{version}').touch()
        _wait_file(f'{a.go}.{version}', 120)
        start = time.monotonic()
        # later versions keep their expected share (box + warm-up), not their hard limits (maxima)
        reserve = sum(boxes[i + 1:]) + 15 * (len(versions) - i - 1)
        counter.hard = min(start + hards[i], end - reserve)
        _play_box(rec, player, mortal, dqn, device, box, counter, start)
        write_json(a.result, out)
        del mortal, dqn, player
        cuda_reset(device)
    return 0


def _client_models(a, config, version, device):
    """The client's ``(mortal, dqn, TrainPlayer)`` of ``version`` on ``device``, warmed up (the first CUDA forward,
    and at version 4 the single-player core's tables)."""
    import torch
    from mortal.model.networks import Brain, DQN
    from mortal.play.player import TrainPlayer

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
    return mortal, dqn, player


def _play_box(rec, player, mortal, dqn, device, box, counter, start):
    """Rounds of ``player`` from ``start`` (monotonic) while the next one should end within ``box`` s, or until
    ``counter`` stops one at its hard limit; their figures go into ``rec``."""
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


# ---------------------------------------------------------------------------- the driver's side

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
    procs, results, flags = _start_clients(ctx, clients, work, configs, cap)
    problem = _step_versions(ctx, procs, flags, clients, deadline)
    per_client = [read_json(r) or {} for r in results]
    _estimate_stopped_rounds(per_client, earlier)
    return {f'v{version}': _version_entry(sizes, clients, version, per_client, problem) for version in (3, 4)}


def _start_clients(ctx, clients, work, configs, cap):
    """Start the ``clients`` worker processes; returns their processes, their result files and the flags folder."""
    sizes = ctx['sizes']
    procs, results = [], []
    flags = work / 'flags'
    flags.mkdir(exist_ok=True)
    worker_deadline = time.time() + cap - 5  # wall clock: the workers compare with their monotonic clock below
    for i in range(clients):
        result = work / f'client{i}.json'
        results.append(result)
        args = [sys.executable, str(GPU_SCRIPT), 'selfplay-worker', '--index', str(i),
                '--device', ctx['device'], '--versions', '3,4', '--configs', ','.join(configs),
                '--boxes', f"{sizes['box_s'][3]},{sizes['box_s'][4]}",
                '--hards', f"{sizes['hard_s'][clients][3]},{sizes['hard_s'][clients][4]}", '--ready', str(flags / f'ready{i}'),
                '--go', str(flags / 'go'), '--result', str(result), '--deadline-wall', str(worker_deadline)]
        if sizes['warmup']:
            args.append('--warmup')
        procs.append(ctx['popen'](args, f'selfplay{clients}_client{i}'))
    return procs, results, flags


def _step_versions(ctx, procs, flags, clients, deadline):
    """Start each version when every client is ready for it, wait for the clients to end, and kill what is left;
    returns what went wrong (None: nothing), after which the clients' records are read (a version they did not
    reach counts as failed)."""
    problem = None
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
    return problem


def _estimate_stopped_rounds(per_client, earlier):
    """A round stopped at its hard limit: hanchan/h = rows/s / rows per game of finished rounds, of this version if
    any finished (in this part or the 1-client part before it, ``earlier``), else of version 3; set in place."""
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


def _version_entry(sizes, clients, version, per_client, problem):
    """The part's entry of one version: the clients' figures summed, or why it failed."""
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
    return entry
