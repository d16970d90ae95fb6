"""The ``online`` part of ``bench/gpu.py``: the real server, trainer (supervisor + learner) and clients for a window
from the learner's first idle submission; the learner's idle fraction read from its log (``learner_idle``,
``idle_summary``), the steps it trained (``trained_steps``) and the logs the clients submitted meanwhile
(``submitted_logs``)."""

import datetime
import re
import sys
import time

from bench.gpu_common import load, write_config, write_models

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


def online_clients(ctx):
    """The online part's clients: ``online_clients``, at most half the box's cores (the learner, its loader's workers
    and the server need the rest)."""
    return max(1, min(ctx['sizes']['online_clients'], ctx['cpus'] // 2))


def part_online(ctx):
    """Real server + trainer + clients; the learner's idle fraction over the window."""
    sizes = ctx['sizes']
    work = ctx['work'] / 'online'
    clients = online_clients(ctx)
    cfg_path = write_config(work, sizes=sizes, device=ctx['device'], version=sizes['online_version'],
                            games=sizes['online_games'], clients=clients)
    config = load(cfg_path)
    write_models(config)
    procs = {}
    try:
        _run_window(ctx, config, {'MORTAL_CFG': str(cfg_path)}, procs, clients)
        stop = time.time()
    finally:
        from mortal.tools.quickstart import stop as stop_procs
        outcome = stop_procs(procs, grace=10) if procs else {}
    return _online_figures(ctx, config, stop, outcome)


def _run_window(ctx, config, env, procs, clients):
    """Start the server, the trainer and ``clients`` clients (into ``procs``), wait for the learner's first idle
    submission, then let them run for the window (cut to the budget left); raises when a process ends or the time
    runs out."""
    from mortal.tools.quickstart import _wait_port

    sizes = ctx['sizes']
    started = time.monotonic()
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
        _check_running(procs)
        time.sleep(0.2)
    window = min(sizes['online_window_s'], ctx['cap'](10**6) - sizes['online_margin_s'])
    if window <= 0:
        raise TimeoutError('no time left for the online window')
    ready_mono = time.monotonic()
    while time.monotonic() - ready_mono < window:
        _check_running(procs)
        time.sleep(0.2)


def _check_running(procs):
    """Raise RuntimeError naming the first of ``procs`` that has ended."""
    for name, p in procs.items():
        if p.poll() is not None:
            raise RuntimeError(f'{name} exited with status {p.returncode} (see logs/online_{name}.log)')


def _online_figures(ctx, config, stop, outcome):
    """The part's record from the logs of a window that ended at ``stop`` (epoch seconds); ``outcome``: how the
    processes ended."""
    sizes = ctx['sizes']
    clients = online_clients(ctx)
    text = (ctx['logs'] / 'online_train.log').read_text(errors='replace')
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
        'steps': steps, 'steps_per_s': round(steps / summary['window_s'], 3) if steps is not None else None,
        'steps_per_busy_s': round(steps / busy, 3) if steps and busy > 0 else None,
        # the clients beside a training learner, through the real server (whole rounds, so coarse over a window)
        'selfplay_logs_submitted': played,
        'selfplay_hanchan_per_hour': round(played / summary['window_s'] * 3600, 1),
        'processes': outcome,
    }
