"""One-command tour of the whole pipeline on a small model: ``python -m mortal.tools.quickstart``.

Writes a config, bootstraps, runs server, trainer and client until one test play and the training after it,
then evaluates; ``--short`` shrinks every size for CI (docs/operations.md, "The quickstart")."""

if __package__ in (None, ''):  # run as a script: python mortal/tools/quickstart.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import glob
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from mortal.config import ENV_PROFILE
from mortal.learning.supervisor import signal_group
from mortal.tools.quickstart_config import PRESETS, write_config

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]  # the repository
PROCESSES = ('server', 'train', 'client')  # start order; stopped in reverse
GRACE_SECONDS = 15  # between SIGTERM and SIGKILL


def child_env(config_path):
    """Environment of the pipeline's processes: the config, unbuffered, no Rust backtraces, no progress bars."""
    env = dict(os.environ)
    env.pop('RUST_BACKTRACE', None)
    env['TQDM_DISABLE'] = '1'  # tqdm reads its defaults from TQDM_* (a bar given disable= explicitly keeps it)
    env['MORTAL_CFG'] = str(config_path)
    env['PYTHONUNBUFFERED'] = '1'
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), env.get('PYTHONPATH')]))
    if (os.cpu_count() or 1) <= 4:
        # three processes share the few cores: one intra-op thread each avoids oversubscription
        env.setdefault('OMP_NUM_THREADS', '1')
    return env


def start(name, config_path, log_dir, profile=None):
    """Start ``python -m mortal.<name>`` in its own session, output to ``log_dir/<name>[_<profile>].log``."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(config_path)
    if profile is not None:
        env[ENV_PROFILE] = profile
    with open(log_dir / (f'{name}.log' if profile is None else f'{name}_{profile}.log'), 'ab') as log:
        proc = subprocess.Popen([sys.executable, '-m', f'mortal.{name}'], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # the child holds its own descriptor
    logger.info('started %s (pid %d), log %s', name, proc.pid, log_dir / f'{name}.log')
    return proc


def stop(procs, grace=GRACE_SECONDS):
    """SIGTERM each group of ``procs`` in reverse, SIGKILL after ``grace`` s; ``{name: 'exited N' | 'killed'}``."""
    outcome = {}
    for p in reversed(list(procs.values())):
        if p.poll() is None:
            signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for name, p in procs.items():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
            outcome[name] = f'exited {p.returncode}'
        except subprocess.TimeoutExpired:
            signal_group(p.pid, signal.SIGKILL)
            p.wait()
            outcome[name] = 'killed'
    return outcome


def _tail(path, lines=25):
    try:
        return '\n'.join(Path(path).read_text(errors='replace').splitlines()[-lines:])
    except OSError:
        return '(no log)'


def read_scalars(tb_dir, prefix='test_play/'):
    """``{tag: [(step, value), ...]}`` of the top-level run in ``tb_dir`` for tags starting with ``prefix``."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
    if not glob.glob(os.path.join(tb_dir, '*tfevents*')):
        return {}
    acc = EventAccumulator(tb_dir, size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags().get('scalars', []) if tag.startswith(prefix)}


def learner_starts(tb_dir):
    """Learner processes that have started training so far: each opens its own event file in ``tb_dir`` as it
    starts, and writes its first scalars at its first save (a stop before that would land in its start)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    return sum(any(event.HasField('summary') for event in EventFileLoader(f).Load())
               for f in glob.glob(os.path.join(tb_dir, 'events.out.tfevents.*')))


def _check_alive(procs, log_dir):
    for name, p in procs.items():
        if p.poll() is not None:
            raise RuntimeError(f'{name} exited with status {p.returncode}; last lines of its log:\n'
                               + _tail(Path(log_dir) / f'{name}.log'))


def keep_running(procs, log_dir, until, poll=5.0):
    """Let the processes run until ``time.monotonic() >= until``; raises ``RuntimeError`` if one dies."""
    while time.monotonic() < until:
        _check_alive(procs, log_dir)
        time.sleep(min(poll, max(0.0, until - time.monotonic())))


def wait_for_online(procs, tb_dir, log_dir, timeout, poll=3.0, *, tests_before=0, starts_before=0, restarts=True):
    """Block until a new test play and then a learner restart (``restarts``: ``[online] restart_after_test_play``)
    or else a save of the same learner after it; RuntimeError if a process dies or at ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        _check_alive(procs, log_dir)
        scalars = read_scalars(tb_dir, prefix='')
        tests = scalars.get('test_play/avg_ranking', [])
        tested = len(tests) > tests_before
        starts = learner_starts(tb_dir) - starts_before
        trained_on = tested and any(step > tests[-1][0] for step, _ in scalars.get('loss/dqn_loss', []))
        state = (tested, starts, trained_on)
        if state != last:
            then = 'its restart' if restarts else 'a save after it'
            logger.info('online: %s', 'waiting for the learner\'s first save' if not starts else
                        f'learner started {starts} time(s); '
                        + (f'test play done, waiting for {then}' if tested else 'training until its first test play'))
            last = state
        if tested and (starts >= 2 if restarts else trained_on):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f'online phase: no test play + {"restart" if restarts else "save after it"} within '
                               f'{timeout} s (test_play logged: {tested}, learner starts: {starts}); see '
                               f'{log_dir}/*.log')
        time.sleep(poll)


EVAL_KEY = 0x71756963  # 'quic': duplicate key of the summary's evaluation deals (not a self-play key)


def same_weights(path_a, path_b) -> bool:
    """Whether two checkpoints have equal ``mortal`` and ``current_dqn`` state dicts; False when one is unreadable
    (it is then played, and play_duplicate reports it)."""
    import torch
    from mortal.model.checkpoint import CheckpointError, load_checkpoint
    try:
        a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    except (OSError, CheckpointError):
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    for key in ('mortal', 'current_dqn'):
        sa, sb = a.get(key), b.get(key)
        if not isinstance(sa, dict) or not isinstance(sb, dict) or sa.keys() != sb.keys():
            return False
        if not all(isinstance(sa[k], torch.Tensor) and isinstance(sb[k], torch.Tensor) and torch.equal(sa[k], sb[k])
                   for k in sa):
            return False
    return True


def _games_bar(label, total, progress):
    """A tqdm bar over ``total`` games, hidden unless ``progress``: evaluations run for minutes."""
    import threading
    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())  # as play_duplicate: no multiprocessing semaphore in the parent
    return tqdm(total=total, desc=label, unit='game', dynamic_ncols=True, disable=not progress)


def _play_eval_deals(challenger, champion, sets, progress, label):
    """``play_duplicate`` on the summary's deals (``EVAL_KEY``): ``{nonce: [4 ranks]}``."""
    from mortal.play.evaluation import play_duplicate
    bar = _games_bar(label, sets * 4, progress)
    try:
        return play_duplicate(challenger, champion, sets=sets, key=EVAL_KEY, workers=os.cpu_count() or 1,
                              progress=bar.update)
    finally:
        bar.close()


def evaluate_against_start(config, sets, progress=False):
    """``{'best'|'final': summarize(...)}`` against 3x the start on ``sets`` deals (final = best: not replayed)."""
    from mortal.config import typed
    from mortal.play.evaluation import summarize
    cfg = typed(config)
    start = ('mortal', cfg.baseline.test.state_file)
    out = {}
    for label, state_file in (('best', cfg.control.best_state_file), ('final', cfg.control.state_file)):
        if not os.path.exists(state_file):
            continue
        if label == 'final' and 'best' in out and same_weights(cfg.control.best_state_file, state_file):
            out[label] = {**out['best'], 'same_as': 'best'}
        else:
            out[label] = summarize(_play_eval_deals(('mortal', state_file), start, sets, progress,
                                                    f'eval {label} vs 3x start'))
    return out


def evaluate_start_vs_rulebase(config, sets, progress=False):
    """``summarize(...)`` of the start model against 3 RulebaseBots, None without the file."""
    from mortal.config import typed
    from mortal.play.evaluation import summarize
    start = typed(config).baseline.test.state_file
    if not os.path.exists(start):
        return None
    return summarize(_play_eval_deals(('mortal', start), ('rulebase', None), sets, progress, 'start vs 3 RulebaseBots'))


def run(work_dir, *, preset='full', port=None, progress=True, online_minutes=0.0, version=3, eval_sets=None,
        rulebase_sets=None):
    """The whole quickstart; returns paths, timings and results. A rerun continues where it stopped."""
    from mortal.tools import bootstrap
    from mortal.config import load_config, typed
    t0 = time.monotonic()
    timings = {}

    def timed(step, fn, *args, **kwargs):
        start = time.monotonic()
        out = fn(*args, **kwargs)
        timings[step] = time.monotonic() - start
        return out

    eval_sets = PRESETS[preset]['eval_sets'] if eval_sets is None else eval_sets
    rulebase_sets = PRESETS[preset]['rulebase_sets'] if rulebase_sets is None else rulebase_sets
    work = Path(work_dir).expanduser().resolve()
    cfg_path = write_config(work, preset=preset, port=port, version=version, relative=True)  # a movable work dir
    logger.info('config: %s', cfg_path)
    logging.getLogger('mortal.config').setLevel(logging.ERROR)  # the [bootstrap] table is ours
    config = load_config(cfg_path)

    # train-grp's GRP check writes the kyoku reward it chose ([env] reward) into cfg_path, which the processes read
    timings.update(bootstrap.run_steps(config, bootstrap.STEPS, progress=progress, config_path=cfg_path))

    cfg = typed(config)
    tb_dir = cfg.control.tensorboard_dir
    log_dir = work / 'logs'
    stopped = timed('online', _run_online, cfg, cfg_path, log_dir, PRESETS[preset]['online_timeout'], online_minutes)
    evaluation = timed('eval', evaluate_against_start, config, eval_sets, progress=progress) if eval_sets else {}
    rulebase = (timed('rulebase', evaluate_start_vs_rulebase, config, rulebase_sets, progress=progress)
                if rulebase_sets else None)

    plots = work / 'plots'
    subprocess.run([sys.executable, str(ROOT / 'scripts' / 'plot_tb.py'), tb_dir, '--out', str(plots)],
                   check=False, stdout=subprocess.DEVNULL)
    timings['total'] = time.monotonic() - t0
    return {
        'work_dir': str(work),
        'config': str(cfg_path),
        'server': f'{cfg.online.remote.host}:{cfg.online.remote.port}',  # quickstart picks a free port
        'tensorboard': [tb_dir, str(work / 'bootstrap' / 'offline' / 'tensorboard'), cfg.grp.control.tensorboard_dir],
        'checkpoints': {'state_file': cfg.control.state_file, 'best_state_file': cfg.control.best_state_file,
                        'baseline': cfg.baseline.train.state_file, 'grp': cfg.grp.state_file,
                        'offline_best': str(work / 'bootstrap' / 'offline' / 'best.pth')},
        'logs': str(log_dir),
        'plots': str(plots),
        'test_play': read_scalars(tb_dir),
        'evaluation': evaluation,
        'rulebase': rulebase,
        'reward': cfg.env.reward,  # the GRP check's choice (bootstrap.check_grp)
        'stopped': stopped,
        'timings': timings,
    }


def _run_online(cfg, cfg_path, log_dir, timeout, online_minutes):
    """Run ``PROCESSES`` until the first test play and the training after it (and ``online_minutes``); their exit
    states."""
    tb_dir = cfg.control.tensorboard_dir
    procs = {}
    t1 = time.monotonic()
    before = dict(tests_before=len(read_scalars(tb_dir).get('test_play/avg_ranking', [])),
                  starts_before=learner_starts(tb_dir))
    try:
        for name in PROCESSES:
            procs[name] = start(name, cfg_path, log_dir)
            if name == 'server':
                _wait_port(cfg.online.remote.host, cfg.online.remote.port, procs[name], log_dir)
        wait_for_online(procs, tb_dir, log_dir, timeout, restarts=cfg.online.restart_after_test_play, **before)
        if online_minutes:
            logger.info('online: running until %.0f min have passed', online_minutes)
            keep_running(procs, log_dir, t1 + online_minutes * 60)
    finally:
        stopped = stop(procs)
        logger.info('stopped: %s', stopped)
    return stopped


def _wait_port(host, port, proc, log_dir, timeout=60):
    """Wait until the server accepts connections; RuntimeError if it dies or never listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _check_alive({'server': proc}, log_dir)
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f'server did not listen on {host}:{port} within {timeout} s')


def report(result, out=sys.stdout):
    """Print where everything is, the test_play results and the timings."""
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p('=' * 70)
    p(f"quickstart finished in {result['timings']['total'] / 60:.1f} min "
      f"({', '.join(f'{k} {v:.0f} s' for k, v in result['timings'].items() if k != 'total')})")
    p(f"work dir:     {result['work_dir']}")
    p(f"config:       {result['config']}")
    if result.get('server'):
        p(f"server:       {result['server']}  ([online.remote] in the config)")
    p(f"TensorBoard:  tensorboard --logdir {result['tensorboard'][0]}")
    for extra in result['tensorboard'][1:]:
        p(f'              (bootstrap: {extra})')
    for name, path in result['checkpoints'].items():
        note = '' if os.path.exists(path) else '  (not written)'
        if name == 'grp' and not note and result.get('reward') not in (None, 'grp'):  # only the reward reads it
            note = f"  (unused: [env] reward = '{result['reward']}')"
        p(f'checkpoint:   {name:<16} {path}{note}')
    p(f"process logs: {result['logs']}")
    p(f"plots:        {result['plots']}")
    tp = result['test_play']
    if tp.get('test_play/avg_ranking'):
        p('test_play (challenger `mortal` vs 3x baseline; avg rank 2.5 = even):')
        pts = dict(tp.get('test_play/avg_pt', []))
        rows = tp['test_play/avg_ranking']
        lines = [f'  step {step:>6}: avg rank {rank:.3f}, avg pt {pts.get(step, float("nan")):+.2f}'
                 for step, rank in rows]
        if len(rows) > 12:
            lines[3:-8] = [f'  ... ({len(rows) - 11} more; all in TensorBoard)']
        p('\n'.join(lines))
    if ev := result.get('evaluation'):
        from mortal.play.evaluation import format_summary
        p('evaluation against 3x the start model on the same duplicate deals (start = 2.500 exactly; '
          'lower is better, 95% CI):')
        for label, summary in ev.items():
            same = f"  (same weights as {summary['same_as']}: not played again)" if summary.get('same_as') else ''
            p(f'  {label:<5} {format_summary(summary)}{same}')
    if rb := result.get('rulebase'):
        from mortal.play.duplicate import unreliable_note
        note = unreliable_note(rb['deals'])
        p(f"start vs 3 RulebaseBots: avg rank {rb['avg_rank']:.3f} ± {rb['avg_rank_ci']:.3f} "
          f"(95% CI, {rb['deals']} deals = {rb['games']} games; {note + '; ' if note else ''}2.500 = even)")
    if ev or rb:
        p('  reading them: a start cloned from a few rule-based hanchan is expected below its teacher, and online '
          'training this short level with its start (README, "Does online training make the model stronger?")')
    if result.get('reward'):
        p(f"kyoku reward: [env] reward = '{result['reward']}' (chosen by the bootstrap's GRP check)")
    normal = any(v == 'exited 143' for v in result['stopped'].values())
    p(f"processes:    {result['stopped']}{'  (143: stopped by SIGTERM, the normal end)' if normal else ''}")
    for line in next_commands(result['config'], result['tensorboard'][0]):
        p(line)


def next_commands(config, tensorboard_dir) -> list:
    """The summary's last lines: the commands to go on with this run in three terminals, and TensorBoard."""
    export = f'export MORTAL_CFG={shlex.quote(str(config))}'
    return ['next: go on with this run in three terminals (in each, from the repository root: the export, then one '
            'command; the server first):',
            f'  {export}',
            '  export OMP_NUM_THREADS=1    # CPU: small models run far faster single-threaded',
            '  python -m mortal.server      # terminal 1',
            '  python -m mortal.train       # terminal 2: the learner (under its supervisor)',
            '  python -m mortal.client      # terminal 3 (a 2nd client: its own [train_play.<name>], '
            'TRAIN_PLAY_PROFILE=<name>)',
            f'  tensorboard --logdir {shlex.quote(str(tensorboard_dir))}',
            'edits to the config take effect when a process is restarted (this config trains on after each test '
            'play: [online] restart_after_test_play = false; true restarts the learner after each, as Mortal): '
            'docs/operations.md']


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through run()'s finally, which stops the children


def main(argv=None):
    """``python -m mortal.tools.quickstart [--short] [--work-dir DIR] ...``; returns 0, or 1 after a failed step."""
    from mortal import entry
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = entry.parser(__doc__.split('\n\n')[0], config=False, prog='python -m mortal.tools.quickstart')
    parser.add_argument('--work-dir', default='work/quickstart', help='where everything goes (default: %(default)s)')
    parser.add_argument('--short', action='store_true', help='CI-sized run (a couple of minutes)')
    parser.add_argument('--port', type=int, default=None, help='server port (default: a free one)')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    parser.add_argument('--online-minutes', type=float, default=0.0,
                        help='keep server/trainer/client running this long (default: stop after the first '
                             'test play and the training after it); rerun with the same --work-dir to continue')
    parser.add_argument('--version', type=int, choices=(3, 4), default=3,
                        help='feature version (default: %(default)s; 4 adds the single-player block and its search)')
    parser.add_argument('--eval-sets', type=int, default=None,
                        help='duplicate deals (4 games each) of the final evaluation against the start model '
                             '(default: 100, --short 4; 0 = none)')
    parser.add_argument('--rulebase-sets', type=int, default=None,
                        help='duplicate deals (4 games each) of the start model against 3 RulebaseBots in the '
                             'summary (default: 40, --short 2; 0 = none)')
    args = entry.start(parser, argv)
    logging.getLogger('tensorboard').setLevel(logging.WARNING)  # its directory watcher chatters at INFO
    try:
        result = run(args.work_dir, preset='short' if args.short else 'full', port=args.port,
                     progress=not args.no_progress, online_minutes=args.online_minutes, version=args.version,
                     eval_sets=args.eval_sets, rulebase_sets=args.rulebase_sets)
    except KeyboardInterrupt:  # Ctrl-C: run()'s cleanup has stopped the children; no traceback for a chosen stop
        logger.warning('quickstart stopped by Ctrl-C; %s keeps what was done: rerun the same command to continue',
                       args.work_dir)
        return 130
    except Exception as e:
        logger.error('quickstart failed: %s', e)
        return 1
    report(result)
    return 0


if __name__ == '__main__':
    sys.exit(main())
