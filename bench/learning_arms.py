"""The arms of ``bench/learning.py``, shared with ``bench/learning_flaw.py``: the start point (``make_start``), an
online arm's config and run (``arm_config``, ``run_arm``), the offline-only control (``run_offline``) and the step
count that matches it to an online arm (``control_steps``). Both scripts import this module; neither imports the
other's (``learning.py`` runs ``learning_flaw`` for its ``flaw`` subcommand).
"""

import math
import os
import pathlib
import re
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# ---------------------------------------------------------------------------- start point

def start_config(start, *, version, games, flaw='', boot=None):
    """Write ``start/config.toml``: the quickstart's full preset with ``[bootstrap] games``, ``flaw`` (a planted
    flaw of every rule-based player, ``mortal.play.flaws``; '' = none) and the ``[bootstrap]`` overrides ``boot``
    (e.g. ``{'val_games': 64}``). Returns its path."""
    import toml
    from mortal.tools.quickstart_config import write_config

    cfg_path = write_config(start, preset='full', version=version)
    cfg = toml.load(cfg_path)
    cfg['bootstrap'].update(games=games, **(boot or {}), **({'flaw': flaw} if flaw else {}))
    cfg_path.write_text(toml.dumps(cfg))
    return cfg_path


def link_logs(src, dst, games, key):
    """Symlink the rule-based logs of ``src`` (a ``[bootstrap] log_dir``) that a bootstrap of ``games`` training
    hanchan with seed key ``key`` would play (deals 0 .. games/4 - 1, 4 rotations each) and every validation log
    into ``dst`` (another ``log_dir``), so that its gen-logs step finds them played. Returns the links made."""
    from mortal.tools.rulebase_games import SPLITS
    src, dst = pathlib.Path(src).resolve(), pathlib.Path(dst)
    names = {'train': [f'{nonce}_{key}_{s}.json.gz' for nonce in range(-(-games // 4)) for s in SPLITS],
             'val': sorted(p.name for p in (src / 'val').glob('*.json.gz'))}
    made = 0
    for split, files in names.items():
        (dst / split).mkdir(parents=True, exist_ok=True)
        for name in files:
            if (src / split / name).is_file() and not (dst / split / name).exists():
                (dst / split / name).symlink_to(src / split / name)
                made += 1
    return made


def make_start(out, *, version, games, grp_games, progress, flaw='', boot=None, logs=None, grp=None):
    """Bootstrap the start point into ``out/start`` (resumable; a finished one, with ``online/baseline.pth``, is
    returned untouched); ``flaw``: a planted flaw of every rule-based player (``[bootstrap] flaw``,
    ``mortal.play.flaws``); ``boot``: ``[bootstrap]`` overrides; ``logs``: a ``log_dir`` of rule-based logs played
    before (same keys) whose first ``games`` hanchan and validation logs are linked in (``link_logs``); ``grp``: a
    GRP checkpoint to use as the reward model instead of training one (copied to ``[grp] state_file``; still
    checked against uniform). Returns the start dir."""
    import toml
    from mortal.tools import bootstrap
    from mortal.config import load_config, typed

    start = pathlib.Path(out, 'start').resolve()
    if (start / 'online' / 'baseline.pth').exists():
        # A finished start is reused as it is: rewriting its config from today's template would resume its GRP
        # or offline run under other settings, and the arms and control already trained from it would no longer
        # share one start.
        return start
    cfg_path = start_config(start, version=version, games=games, flaw=flaw, boot=boot)
    config = load_config(cfg_path)
    if logs:
        boot_cfg = bootstrap.bootstrap_config(config)
        link_logs(logs, boot_cfg.log_dir, games, boot_cfg.seed_key)
    bootstrap.run_steps(config, ('gen-logs',), progress=progress)
    grp_file = typed(config).grp.state_file
    if grp and not os.path.exists(grp_file):
        shutil.copyfile(grp, grp_file)
    if grp_games:
        # Extra hanchan (another seed key) for the reward model only; the offline model keeps the first `games`.
        grp_dir = start / 'bootstrap' / 'grp_logs'
        extra = dict(config, bootstrap={**config['bootstrap'], 'games': grp_games, 'val_games': 0,
                                        'seed_key': config['bootstrap']['seed_key'] + 2, 'log_dir': str(grp_dir)})
        bootstrap.gen_logs(extra, progress=progress)
        globs = config['grp']['dataset']['train_globs'] + [str(grp_dir / 'train' / '**' / '*.json.gz')]
        config['grp']['dataset']['train_globs'] = globs
        cfg = toml.load(cfg_path)
        cfg['grp']['dataset']['train_globs'] = globs
        cfg_path.write_text(toml.dumps(cfg))
    # config_path: a GRP no better than uniform switches [env] reward to 'points' in the file the arms read
    bootstrap.run_steps(config, ('train-grp', 'train-offline', 'prepare'), progress=progress, config_path=cfg_path)
    return start


# ---------------------------------------------------------------------------- one arm: the real processes

def parse_sets(items):
    """``['a.b.c=VALUE', ...]`` -> ``[(['a', 'b', 'c'], value)]`` with VALUE parsed as TOML (bare words as
    strings). Raises SystemExit naming a malformed item."""
    import toml
    out = []
    for item in items:
        if '=' not in item:
            raise SystemExit(f'--set {item!r}: expected SECTION.KEY=VALUE')
        key, raw = item.split('=', 1)
        try:
            value = toml.loads(f'v = {raw}')['v']
        except toml.TomlDecodeError:
            value = raw
        out.append((key.strip().split('.'), value))
    return out


def arm_config(start, arm_dir, sets, port, clients=1):
    """Write ``arm_dir/config.toml``: the start's config with its own online paths and the overrides; with
    ``clients`` > 1, ``[train_play.client2]`` ... as copies of ``[train_play.default]`` (after the overrides), each
    with its own ``log_dir`` (a client empties its folder every round)."""
    import toml
    from mortal.tools.quickstart_config import render_config

    start_cfg = toml.load(start / 'config.toml')
    cfg = toml.loads(render_config(arm_dir, preset='full', port=port, version=start_cfg['control']['version']))
    # The reward model, offline logs (probe) and bootstrap settings stay the start's, and so does the kyoku reward
    # (check_grp may have switched the start to 'points').
    for section in ('grp', 'dataset', 'bootstrap'):
        cfg[section] = start_cfg[section]
    if 'reward' in start_cfg.get('env', {}):
        cfg.setdefault('env', {})['reward'] = start_cfg['env']['reward']
    for keys, value in sets:
        node = cfg
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    default = cfg['train_play']['default']
    for profile in client_profiles(clients):
        cfg['train_play'][profile] = {**default, 'log_dir': f"{default['log_dir'].rstrip('/')}_{profile}"}
    path = arm_dir / 'config.toml'
    path.write_text(toml.dumps(cfg))
    return path, cfg


def mark_tag(minutes):
    """File tag of a ``--mark-minutes`` value: ``30 -> '030m'``, ``7.5 -> '007.5m'`` (distinct per value)."""
    whole, frac = divmod(minutes, 1)
    return f'{int(whole):03d}' + (f'{frac:g}'[1:] if frac else '') + 'm'


def check_marks(marks, minutes):
    """``--mark-minutes`` values: finite, > 0, distinct, within ``--minutes`` when given. Returns an error text or
    None."""
    for m in marks:
        if not (math.isfinite(m) and m > 0):
            return f'--mark-minutes {m:g} must be a finite number of minutes > 0'
        if minutes and m > minutes:
            return f'--mark-minutes {m:g} is past --minutes {minutes:g}: it would never be taken'
    tags = [mark_tag(m) for m in marks]
    if len(set(tags)) < len(tags):
        return f'--mark-minutes {" ".join(f"{m:g}" for m in marks)} repeats a value'
    return None


def checkpoint_steps(state_file):
    from mortal.model.checkpoint import load_checkpoint
    try:
        return int(load_checkpoint(state_file)['steps'])
    except Exception:  # being replaced right now, or not written yet
        return None


def run_arm(out, arm, *, sets, steps, minutes, snapshot_every, log, mark_minutes=(), clients=1):
    """Train one arm with the real three processes; returns ``{'steps': trained, 'seconds': online time,
    'hanchan': the trainee's hanchan (``client_hanchan``), 'clients': clients}``.

    ``clients`` > 1 starts that many self-play clients, the 2nd on ``[train_play.client2]`` and so on
    (``client_profiles``: copies of the default profile, each with its own log folder and, per process, its own
    random deals).

    At each of ``mark_minutes`` (minutes online) ``best.pth`` and the played ``state_file`` are kept as
    ``marks/best_MMMm.pth`` / ``marks/final_MMMm.pth``; ``eval`` plays them like best/final (e.g. the model at 30
    minutes of a 2-hour run)."""
    from mortal.util.fsutil import atomic_copy
    from mortal.tools.quickstart import _wait_port, start as start_proc, stop

    arm_dir, cfg_path, cfg = prepare_arm(out, arm, sets, clients=clients)
    marks = sorted(float(m) for m in mark_minutes)
    state_file = cfg['control']['state_file']
    step0 = checkpoint_steps(state_file)
    log(f'[{arm}] start steps {step0}, budget {steps} steps / {minutes} min, overrides {sets}')
    procs = {}
    t0 = time.monotonic()
    cpu = TreeCPU(procs)
    try:
        for name in ('server', 'train', 'client'):
            procs[name] = start_proc(name, cfg_path, arm_dir / 'logs')
            if name == 'server':
                _wait_port('127.0.0.1', cfg['online']['remote']['port'], procs[name], arm_dir / 'logs')
        for profile in client_profiles(clients):
            procs[f'client_{profile}'] = start_proc('client', cfg_path, arm_dir / 'logs', profile=profile)
        cpu.start()
        trained = watch_arm(procs, arm_dir, state_file, step0, t0, arm=arm, steps=steps, minutes=minutes,
                            snapshot_every=snapshot_every, marks=marks, log=log)
    finally:
        cpu_s = cpu.stop()
        stop(procs)
    elapsed = time.monotonic() - t0
    if marks:
        log(f'[{arm}] marks never reached (the run ended first): {", ".join(f"{m:g} min" for m in marks)}')
    atomic_copy(state_file, arm_dir / 'final.pth')  # the played model
    hanchan = client_hanchan(arm_dir / 'logs')
    log(f'[{arm}] trained {trained} steps in {elapsed / 60:.1f} min; {hanchan} hanchan by {clients} client(s) '
        f'({hanchan / max(elapsed / 60, 1e-9):.1f} a minute)')
    if cpu_s:
        log(f'[{arm}] CPU seconds: ' + ', '.join(f'{k} {v:.0f}' for k, v in cpu_s.items())
            + f' (of {elapsed * (os.cpu_count() or 1):.0f} on {os.cpu_count()} cores)')
    return {'steps': trained, 'seconds': elapsed, 'hanchan': hanchan, 'clients': clients,
            'sets': [['.'.join(k), v] for k, v in sets], 'cpu_s': cpu_s}


class TreeCPU:
    """CPU seconds (user + system) of each launched process and its descendants (the learner's restarts, loader
    and test-play workers), by the name it has in ``procs``; read from /proc every second on a thread, each pid's
    last reading kept, so a process that ended counts up to its last second. ``stop()`` returns ``{name: s}``
    (``{}`` without /proc)."""

    def __init__(self, procs: dict):
        import threading
        self.procs = procs
        self.seen = {}  # pid -> (name, CPU seconds)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        if os.path.isdir('/proc/self'):
            self.thread.start()

    def stop(self) -> dict:
        if not self.thread.is_alive():
            return {}
        self._sample()
        self.done.set()
        self.thread.join()
        totals = {}
        for name, seconds in self.seen.values():
            totals[name] = totals.get(name, 0.0) + seconds
        return {k: round(v, 1) for k, v in sorted(totals.items())}

    def _run(self):
        while not self.done.wait(1.0):
            self._sample()

    def _sample(self):
        tick = os.sysconf('SC_CLK_TCK')
        stats = {}
        for entry in os.listdir('/proc'):
            if entry.isdigit():
                try:
                    fields = open(f'/proc/{entry}/stat').read().rsplit(')', 1)[1].split()
                except (OSError, IndexError):
                    continue  # ended meanwhile
                stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        roots = {p.pid: name.split('_')[0] for name, p in list(self.procs.items())}
        for pid, (ppid, seconds) in stats.items():
            name, cur, hops = None, pid, 0
            while cur in stats and hops < 16:  # walk up to a launched process
                if cur in roots:
                    name = roots[cur]
                    break
                cur, hops = stats[cur][0], hops + 1
            if name is None:
                name = self.seen.get(pid, (None,))[0]
            if name is not None:
                self.seen[pid] = (name, seconds)


def client_profiles(clients):
    """The ``[train_play.<profile>]`` names of the clients after the first: ``['client2', ...]``."""
    return [f'client{i}' for i in range(2, clients + 1)]


ROUND_LINE = re.compile(r'mortal\.client: trainee rankings: \[(\d+), (\d+), (\d+), (\d+)\]')


def client_hanchan(log_dir):
    """Hanchan the trainee played, summed over the rounds the clients logged (``client*.log`` in ``log_dir``,
    their "trainee rankings: [a, b, c, d]" lines: a + b + c + d hanchan a round)."""
    total = 0
    for path in sorted(pathlib.Path(log_dir).glob('client*.log')):
        for line in path.read_text(errors='replace').splitlines():
            m = ROUND_LINE.search(line)
            if m:
                total += sum(int(g) for g in m.groups())
    return total


def prepare_arm(out, arm, sets, clients=1):
    """Empty ``OUT/arms/ARM``, write its config (``arm_config``, checked; one ``[train_play]`` profile per client)
    and start both its trainee and its baseline as the bootstrap model; returns ``(arm_dir, config path,
    config)``."""
    from mortal.model.checkpoint import INITIAL_BEST_PERF, atomic_torch_save, load_checkpoint
    from mortal.config import load_config
    from mortal.util.fsutil import empty_dir
    from mortal.tools.quickstart_config import free_port

    start = pathlib.Path(out, 'start').resolve()
    arm_dir = pathlib.Path(out, 'arms', arm).resolve()
    empty_dir(arm_dir)
    (arm_dir / 'online').mkdir()
    (arm_dir / 'snapshots').mkdir()
    (arm_dir / 'marks').mkdir()
    cfg_path, cfg = arm_config(start, arm_dir, sets, free_port(), clients=clients)
    load_config(cfg_path)  # fail early, naming the bad key
    # Trainee and baseline both start as the bootstrap model (the start dir's own mortal.pth may have trained).
    start_file = start / 'online' / 'baseline.pth'
    trainee = load_checkpoint(start_file)
    trainee['best_perf'] = dict(INITIAL_BEST_PERF)
    atomic_torch_save(trainee, arm_dir / 'online' / 'mortal.pth')
    shutil.copyfile(start_file, arm_dir / 'online' / 'baseline.pth')
    return arm_dir, cfg_path, cfg


def watch_arm(procs, arm_dir, state_file, step0, t0, *, arm, steps, minutes, snapshot_every, marks, log):
    """Keep the arm's processes running (looked at every 5 s) until ``steps`` are trained or ``minutes`` have
    passed since ``t0``; copies ``state_file`` to ``snapshots/`` every ``snapshot_every`` steps and keeps the
    models at the ``marks`` (minutes online, popped as they are reached). Returns the steps trained."""
    from mortal.util.fsutil import atomic_copy
    from mortal.tools.quickstart import keep_running

    last_mtime, trained, next_snap = None, 0, snapshot_every
    while True:
        keep_running(procs, arm_dir / 'logs', time.monotonic() + 5)
        mtime = os.path.getmtime(state_file)
        if mtime != last_mtime:
            now = checkpoint_steps(state_file)
            if now is not None:
                last_mtime, trained = mtime, now - step0
                if snapshot_every and trained >= next_snap:
                    shutil.copyfile(state_file, arm_dir / 'snapshots' / f'step_{trained:06d}.pth')
                    next_snap = (trained // snapshot_every + 1) * snapshot_every
        elapsed = time.monotonic() - t0
        while marks and elapsed >= marks[0] * 60:
            tag = mark_tag(marks.pop(0))
            best_file = arm_dir / 'online' / 'best.pth'
            if best_file.exists():
                shutil.copyfile(best_file, arm_dir / 'marks' / f'best_{tag}.pth')
            atomic_copy(state_file, arm_dir / 'marks' / f'final_{tag}.pth')
            log(f'[{arm}] mark {tag}: {trained} steps')
        if (steps and trained >= steps) or (minutes and elapsed >= minutes * 60):
            return trained


# ---------------------------------------------------------------------------- control: offline only

class _StepBudget(Exception):
    """The offline-only control reached its ``steps``."""


def run_offline(out, arm, *, epochs, lr, freeze_bn, log, steps=0, snapshot_every=0):
    """The offline-only control: continue the start's offline run (``start/bootstrap/offline/mortal.pth``, its
    optimizer included) for ``epochs`` more epochs of the bootstrap logs at constant ``lr``, with the offline loss
    (MSE + CQL + next rank), no self-play. With ``freeze_bn`` the BatchNorm statistics stay frozen, as online.
    Keeps ``OUT/arms/ARM/epoch_N.pth`` and returns the info of ``result.json``. With ``steps`` > 0 it stops after
    that many steps instead (as many epochs as that takes; the last state is ``final.pth``), keeping
    ``snapshots/step_N.pth`` every ``snapshot_every`` steps: the control of ``flaw``, matched to the online arm's
    offline samples."""
    from mortal.tools.offline_epochs import RulebaseTestPlayer, offline_config
    from mortal.config import load_config
    from mortal.util.fsutil import empty_dir
    from mortal.train import Trainer

    start = pathlib.Path(out, 'start').resolve()
    arm_dir = pathlib.Path(out, 'arms', arm).resolve()
    empty_dir(arm_dir)
    cfg = offline_config(load_config(start / 'config.toml'))
    cfg['control'].update(state_file=str(arm_dir / 'mortal.pth'), best_state_file=str(arm_dir / 'best.pth'),
                          tensorboard_dir=str(arm_dir / 'tensorboard'))
    cfg['dataset']['file_index'] = str(arm_dir / 'file_index.pth')
    cfg['optim']['scheduler'].update(peak=lr, final=lr, warm_up_steps=0, max_steps=0)
    if freeze_bn:
        cfg['freeze_bn'] = {'mortal': True}
    shutil.copyfile(start / 'bootstrap' / 'offline' / 'mortal.pth', arm_dir / 'mortal.pth')
    step0 = checkpoint_steps(arm_dir / 'mortal.pth')
    t0 = time.monotonic()
    (arm_dir / 'snapshots').mkdir()
    epoch = 0
    while epoch < epochs if not steps else checkpoint_steps(arm_dir / 'mortal.pth') - step0 < steps:
        epoch += 1
        trainer = Trainer(cfg, test_player=RulebaseTestPlayer(cfg))
        if steps:
            trainer.train_batch = _budgeted(trainer, trainer.train_batch, step0, steps, snapshot_every,
                                            arm_dir / 'snapshots')
        try:
            trainer.run()
        except _StepBudget:
            pass
        finally:
            trainer.save()
            trainer.writer.close()
        if not steps:
            shutil.copyfile(arm_dir / 'mortal.pth', arm_dir / f'epoch_{epoch}.pth')
        log(f'[{arm}] offline epoch {epoch}: {trainer.steps - step0} steps ({time.monotonic() - t0:.0f} s)')
    if steps:
        shutil.copyfile(arm_dir / 'mortal.pth', arm_dir / 'final.pth')
    sets = [['control', 'offline only'], ['epochs', epochs], ['lr', lr], ['freeze_bn', freeze_bn]]
    return {'steps': checkpoint_steps(arm_dir / 'mortal.pth') - step0, 'seconds': time.monotonic() - t0,
            'sets': sets}


def _budgeted(trainer, train_batch, step0, steps, snapshot_every, snapshot_dir):
    """``trainer.train_batch`` that raises ``_StepBudget`` once ``steps`` steps past ``step0`` are done, and saves
    a snapshot every ``snapshot_every`` steps."""
    def step(*batch):
        if trainer.steps - step0 >= steps:
            raise _StepBudget
        train_batch(*batch)
        done = trainer.steps - step0
        if snapshot_every and done % snapshot_every == 0:
            trainer.save()
            shutil.copyfile(trainer.state_file, snapshot_dir / f'step_{done:06d}.pth')
    return step


# ---------------------------------------------------------------------------- evaluation


def control_steps(online_steps, offline_batch_size, batch_size):
    """Steps of the control that draw as many offline samples as ``online_steps`` online steps with
    ``offline_batch_size`` offline rows each, at ``batch_size`` rows a step (rounded to the nearest step)."""
    return max(1, round(online_steps * offline_batch_size / batch_size))
