"""The ``selfplay_sweep`` part of ``bench/gpu.py``: the box's hanchan per hour of the client's self-play path with
1, 2, 4, 8 and 12 client processes (as many as the box has cores for) on the same card, at feature version 3 and 4.

One set of client processes (``bench/gpu.py selfplay-worker``) is started once and kept for the whole part: per
version each loads and warms up its models, then per client count N the driver lets clients 0..N-1 play for that
count's time (the others wait) and collects their records. A client plays whole rounds (``TrainPlayer.train_play``),
starting another only while it should end within the count's box; a round still running at the hard limit is
stopped. Every game that ends is timed (a wrapper of ``OneVsThree._finish``), so a figure always comes from finished
games:

* ``basis = 'whole rounds'``: every client finished a round; a client's rate is its finished rounds' games over their
  wall time, and the box's hanchan/h is the clients' rates summed (they play at the same time);
* ``basis = 'games finished in the window'``: some client finished no round; a client's rate is the games that ended
  within its window over the window (biased low: a round's games start together and end late);
* no game finished: ``hanchan_per_hour`` is None and ``status`` says so; ``hanchan_per_hour_from_rows`` is then the
  rows/s over the rows per game of this version's finished rounds elsewhere in the part (an estimate, named so).

The counts run largest first (the box's figure), then 1 (the reference), then the others (``sweep_order``). The
first runs until its first round ends (within ``first_hard_s``): its round time sizes the later counts
(``plan_counts``): as many as the version's time left holds with a whole round each are measured, the others are
skipped and say why. A round is long whatever its games: about 1,500 forwards one after the other (a hanchan's
decisions), with its first game ending at about 0.6-0.8 of it (measured on CPU, 32 games), so a count without a
whole round has no honest figure.
"""

import json
import os
import pathlib
import sys
import time

from bench.gpu_common import (GPU_SCRIPT, RowCounter, TimeBoxOver, cuda_peak, cuda_reset, load, read_json,
                              write_config, write_json, write_models)


def client_counts(sizes, cpus):
    """The client counts of the sweep: ``sizes['clients']`` up to the box's cores (a client keeps about one core
    busy; at least the first count)."""
    counts = [n for n in sizes['clients'] if n <= max(1, cpus)]
    return counts or list(sizes['clients'][:1])


class FinishClock:
    """Times every real game of this process that ends well (``OneVsThree._finish`` wrapped, as ``RowCounter``
    wraps the engine): ``times`` holds their ``time.monotonic()``."""

    def __init__(self):
        from mortal.play.arena import OneVsThree
        self.times = []
        orig = OneVsThree.__dict__.get('_unwrapped_finish', OneVsThree._finish)
        OneVsThree._unwrapped_finish = orig
        clock = self

        def _finish(arena, g, rankings):
            orig(arena, g, rankings)
            if g.failed is None:
                clock.times.append(time.monotonic())

        OneVsThree._finish = _finish

    def between(self, t0, t1):
        """Games that ended in ``[t0, t1]`` (monotonic seconds)."""
        return sum(t0 <= t <= t1 for t in self.times)


def _wait_file(path, deadline):
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f'{path} did not appear in time')
        time.sleep(0.05)


# ---------------------------------------------------------------------------- worker: one self-play client

def selfplay_worker(a):
    """One client process: per version, warm up, then per client count wait for the driver's go and, when its index
    is below the count, play within the count's box and hard limit (read from the go file)."""
    import torch
    from mortal.features import obs_v4

    torch.set_num_threads(1)
    device = torch.device(a.device)
    counter, clock = RowCounter(), FinishClock()
    out = {'client': a.index, 'device': str(device), 'versions': {}}
    versions = [int(v) for v in a.versions.split(',')]
    counts = [int(n) for n in a.counts.split(',')]
    flags = pathlib.Path(a.flags)
    for i, version in enumerate(versions):
        recs = out['versions'][str(version)] = {}
        config = load(a.configs.split(',')[i])
        t0 = time.monotonic()
        mortal, dqn, player = _client_models(a, config, version, device)
        cuda_reset(device)
        out[f'warmup_s_v{version}'] = round(time.monotonic() - t0, 2)
        write_json(a.result, out)
        (flags / f'ready.{version}.{a.index}').touch()
        for n in counts:
            go = flags / f'go.{version}.{n}'
            _wait_file(go, a.deadline)
            order = json.loads(go.read_text())
            if a.index >= n or order.get('skip'):
                continue
            obs_v4.SP_THREADS = max(1, (os.cpu_count() or 1) // n)  # the clients share the box's cores
            rec = recs[str(n)] = {'status': 'started', 'version': version, 'clients': n}
            cuda_reset(device)
            start = time.monotonic()
            counter.hard = start + order['hard_s']
            _play_box(rec, player, mortal, dqn, device, order['box_s'], counter, clock, start)
            write_json(a.result, out)
            (flags / f'done.{version}.{n}.{a.index}').touch()
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
    state = torch.load(config['control']['state_file'], weights_only=True)
    mortal = Brain(version=version, conv_channels=r['conv_channels'], num_blocks=r['num_blocks'])
    mortal.load_state_dict(state['mortal'])
    dqn = DQN(version=version)
    dqn.load_state_dict(state['current_dqn'])
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


def _play_box(rec, player, mortal, dqn, device, box, counter, clock, start):
    """Rounds of ``player`` from ``start`` (monotonic) while the next one should end within ``box`` s, or until
    ``counter`` stops one at its hard limit; their figures go into ``rec``."""
    rows0, calls0 = counter.rows, counter.calls
    rounds, games, played_s, last = 0, 0, 0.0, None
    cpu0 = time.process_time()
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
    stop = time.monotonic()
    wall = stop - start
    rows, calls = counter.rows - rows0, counter.calls - calls0
    finished = clock.between(start, stop)
    if rounds:
        rate, basis = games / played_s * 3600, 'whole rounds'
    elif finished:
        rate, basis = finished / wall * 3600, 'games finished in the window'
    else:
        rate, basis = None, None
    rec.update(
        rounds=rounds, games=games, round_games=player.seed_count * 4, round_s=round(played_s / rounds, 2)
        if rounds else None, games_finished=finished, seconds=round(wall, 3),
        hanchan_per_hour=round(rate, 1) if rate is not None else None, basis=basis,
        cpu_fraction=round((time.process_time() - cpu0) / wall, 3) if wall > 0 else None,
        rows=rows, rows_per_s=round(rows / wall, 1) if wall > 0 else None,
        rows_per_forward=round(rows / calls, 2) if calls else None,
        rows_per_game=round(rows / games, 1) if games and not rec['aborted'] else None,
        peak_memory=cuda_peak(device))


# ---------------------------------------------------------------------------- the driver's side

def part_selfplay(ctx):
    """The sweep: ``max(counts)`` client processes, per version of ``sweep_versions`` (3, then 4) each client count
    in turn. Returns ``{'counts': [...], 'v3': {'1': entry, '2': entry, ...}, 'v4': {...}}``."""
    sizes = ctx['sizes']
    counts = sweep_order(client_counts(sizes, ctx['cpus']))
    cap = ctx['cap'](sizes['sweep_cap_s'])
    if cap < 20:
        raise TimeoutError(f'only {cap:.0f} s of the budget left')
    deadline = time.monotonic() + cap
    work = ctx['work'] / 'sweep'
    versions = tuple(sizes['sweep_versions'])
    configs = []
    for version in versions:
        cfg_path = write_config(work / f'v{version}', sizes=sizes, device=ctx['device'], version=version,
                                games=sizes['games'][version], clients=max(counts))
        write_models(load(cfg_path))
        configs.append(str(cfg_path))
    flags = work / 'flags'
    flags.mkdir(parents=True, exist_ok=True)
    procs, results = _start_clients(ctx, counts, work, versions, configs, flags, cap)
    out = {'counts': sorted(counts), 'order': counts, 'cpus': ctx['cpus'],
           'network': f"{sizes['channels']}x{sizes['blocks']}"}
    try:
        for version in versions:
            share = sizes['version_share'][version] if version != versions[-1] else 1.0
            v_deadline = min(deadline, time.monotonic() + share * (deadline - time.monotonic()))
            out[f'v{version}'] = _run_version(ctx, version, counts, procs, results, flags, v_deadline)
    finally:
        for p in procs:
            ctx['kill'](p)
    per_game = _rows_per_game(out)
    for version in versions:
        for entry in out[f'v{version}'].values():
            _finish_entry(entry, per_game.get(version))
    return out


def _start_clients(ctx, counts, work, versions, configs, flags, cap):
    """Start ``max(counts)`` worker processes; returns them and their result files."""
    sizes = ctx['sizes']
    procs, results = [], []
    worker_deadline = time.time() + cap - 3  # wall clock: each worker converts it to its monotonic clock
    for i in range(max(counts)):
        result = work / f'client{i}.json'
        results.append(result)
        args = [sys.executable, str(GPU_SCRIPT), 'selfplay-worker', '--index', str(i), '--device', ctx['device'],
                '--versions', ','.join(map(str, versions)), '--configs', ','.join(configs),
                '--counts', ','.join(map(str, counts)),
                '--flags', str(flags), '--result', str(result), '--deadline-wall', str(worker_deadline)]
        if sizes['warmup']:
            args.append('--warmup')
        procs.append(ctx['popen'](args, f'sweep_client{i}'))
    return procs, results


def _run_version(ctx, version, counts, procs, results, flags, v_deadline):
    """Each client count of ``version`` in turn (``counts`` in ``sweep_order``), within ``v_deadline`` (monotonic);
    returns ``{str(N): entry}``."""
    sizes = ctx['sizes']
    entries = {}
    while not all((flags / f'ready.{version}.{i}').exists() for i in range(len(procs))):
        if any(p.poll() is not None for p in procs) or time.monotonic() > v_deadline:
            for n in counts:
                entries[str(n)] = {'status': f'failed: a client ended or ran out of time before version {version} '
                                             '(see logs/sweep_client*.log)', 'clients': n, 'version': version}
                (flags / f'go.{version}.{n}').write_text(json.dumps({'skip': True}))
            return entries
        time.sleep(0.05)
    first = counts[0]
    left = v_deadline - time.monotonic() - sizes['count_overhead_s']
    plan = {first: (min(sizes['first_hard_s'][version], left), sizes['box_s'][version])}
    for k, n in enumerate(counts):
        if k == 1:  # the first count's round time sizes the others
            ref = entries[str(first)].get('round_s') if entries[str(first)].get('status') == 'ok' else None
            plan, skipped = plan_counts(counts[1:], first, ref, v_deadline - time.monotonic(), sizes, version)
            for m, why in skipped.items():
                entries[str(m)] = {'status': why, 'clients': m, 'version': version}
        go = flags / f'go.{version}.{n}'
        if n not in plan or plan[n][0] < sizes['min_hard_s']:
            go.write_text(json.dumps({'skip': True}))
            entries.setdefault(str(n), {'status': f"skipped: {max(plan.get(n, (0,))[0], 0):.0f} s left of version "
                                                  f"{version}'s time", 'clients': n, 'version': version})
            continue
        hard, box = plan[n]
        go.write_text(json.dumps({'box_s': box, 'hard_s': hard}))
        entry = entries[str(n)] = _collect(procs[:n], results[:n], flags, version, n, time.monotonic() + hard + 30)
        entry.update(box_s=round(box, 1), hard_s=round(hard, 1), games_per_round=sizes['games'][version])
    return entries


def sweep_order(counts):
    """The order the counts are measured in: the largest (the box's figure) first, then 1 (the reference), then the
    others nearest the middle of the range (the geometric mean of 1 and the largest) first."""
    import math
    top = max(counts)
    rest = sorted((n for n in counts if n not in (top, 1)), key=lambda n: abs(math.log(n) - math.log(top) / 2))
    return [top] + ([1] if 1 in counts and top != 1 else []) + rest


def plan_counts(rest, first, ref_round, left, sizes, version):
    """The hard limit and box of each later client count, and why the others are skipped.

    ``rest``: the counts after the first (``first`` clients), in ``sweep_order``; ``ref_round``: the first count's
    round time (s; None when no round ended); ``left``: seconds left of the version's time. Without a round time the
    counts share ``left`` equally (each at most ``hard_max_s``). With one, a count needs ``ref_round *
    round_slowdown`` plus ``count_overhead_s`` for a whole round: as many counts as ``left`` holds are measured, in
    their order, each with an equal share of it; the others are skipped, saying why. Returns ``({count: (hard_s,
    box_s)}, {count: reason})``; a box equal to the hard limit starts another round only when it should end within
    it."""
    overhead = sizes['count_overhead_s']
    if not rest:
        return {}, {}
    if not ref_round:
        hard = min(left / len(rest) - overhead, sizes['hard_max_s'])
        return {n: (hard, min(sizes['box_s'][version], hard)) for n in rest}, {}
    need = ref_round * sizes['round_slowdown'] + overhead
    fit = min(len(rest), int(max(left, 0) // need))
    hard = left / fit - overhead if fit else 0.0
    skipped = {n: f"skipped: a round took {ref_round:.0f} s with {first} client(s); the {max(left, 0):.0f} s left of "
                  f"version {version}'s time held {fit} of the {len(rest)} later counts" for n in rest[fit:]}
    return {n: (hard, hard) for n in rest[:fit]}, skipped


def _collect(procs, results, flags, version, n, wait_until):
    """The entry of one client count: the records of its ``n`` clients, summed (or why it failed)."""
    entry = {'version': version, 'clients': n}
    while not all((flags / f'done.{version}.{n}.{i}').exists() for i in range(n)):
        if any(p.poll() is not None for p in procs) or time.monotonic() > wait_until:
            entry['status'] = 'failed: a client ended or overran its hard limit (see logs/sweep_client*.log)'
            return entry
        time.sleep(0.05)
    recs = [((read_json(r) or {}).get('versions', {}).get(str(version)) or {}).get(str(n)) for r in results]
    if not all(r and r.get('status') == 'ok' for r in recs):
        entry['status'] = 'failed: a client record is missing (see logs/sweep_client*.log)'
        entry['per_client'] = recs
        return entry
    rates = [r['hanchan_per_hour'] for r in recs]
    finished_all = all(r['rounds'] for r in recs)
    entry.update(
        status='ok', games_finished=sum(r['games_finished'] for r in recs),
        rounds=sum(r['rounds'] for r in recs), round_s=max((r['round_s'] or 0) for r in recs) or None,
        basis='whole rounds' if finished_all else 'games finished in the window',
        hanchan_per_hour=round(sum(x or 0 for x in rates), 1) if any(rates) else None,
        rows_per_s=round(sum(r['rows_per_s'] for r in recs), 1),
        rows_per_forward=round(sum(r['rows_per_forward'] or 0 for r in recs) / n, 2),
        seconds=max(r['seconds'] for r in recs), aborted=any(r['aborted'] for r in recs), per_client=recs)
    if entry['hanchan_per_hour'] is None:
        entry['basis'] = None
    return entry


def _rows_per_game(out):
    """Per version, the mean rows per game over the finished rounds of the part (None when none finished)."""
    per_game = {}
    for version in (3, 4):
        vals = [c['rows_per_game'] for e in (out.get(f'v{version}') or {}).values() for c in e.get('per_client') or []
                if c and c.get('rows_per_game')]
        if vals:
            per_game[version] = sum(vals) / len(vals)
    return per_game


def _finish_entry(entry, per_game):
    """A count's estimate from its rows (rows/s over rows per game of finished rounds), and a status that says when
    no game finished."""
    if entry.get('status') != 'ok':
        return
    if per_game and entry.get('rows_per_s'):
        entry['rows_per_game_ref'] = round(per_game, 1)
        entry['hanchan_per_hour_from_rows'] = round(entry['rows_per_s'] / per_game * 3600, 1)
    if entry.get('hanchan_per_hour') is None:
        entry['note'] = (f"no game finished in {entry['seconds']:.0f} s (rounds of {entry.get('games_per_round')} "
                         "games): hanchan/h only estimated from rows")


def best_counts(sweep):
    """``{version: (clients, hanchan/h)}`` of the best measured (finished-games) figure of each version."""
    best = {}
    for version in (3, 4):
        for n, e in (sweep.get(f'v{version}') or {}).items():
            h = (e or {}).get('hanchan_per_hour')
            if h is not None and (version not in best or h > best[version][1]):
                best[version] = (int(n), h)
    return best
