"""Bootstrap a model without Mortal's weights:
``python -m mortal.bootstrap {gen-logs,train-grp,train-offline,prepare,all}``.

Steps (each resumable: a finished step is skipped, an interrupted one continues):

1. ``gen-logs``: hanchan of four ``mjai.bot.rulebase.RulebaseBot`` seats, played by ``mortal.play.arena.OneVsThree``
   over a pool of processes (the bot's move search holds the interpreter lock ~5 ms a call), written as gzip
   mjai logs ``{nonce}_{key}_{a|b|c|d}.json.gz`` under ``[bootstrap] log_dir``/``train`` and ``/val``.
   Every bot discards a random legal tile with probability ``[bootstrap] epsilon`` (not after riichi):
   four identical deterministic bots would replay the same game in all four seat rotations of a deal, so
   without the noise three of every four logs would be byte-identical copies. With ``epsilon = 0`` only
   rotation ``a`` is kept.
2. ``train-grp``: ``mortal.train_grp`` on those logs for ``[bootstrap] grp_steps`` steps -> ``[grp] state_file``.
3. ``train-offline``: one offline run of ``mortal.train.Trainer`` (``online = false``, CQL on) on the train logs
   with the config's ``[resnet]``/``[control] version``; state under ``[bootstrap] work_dir``/``offline``.
   There is no Mortal baseline yet, so its test play (every ``[bootstrap] offline_test_every`` steps, 0 = never)
   is against three RulebaseBots; ``best.pth`` is the best tested checkpoint, or the last one when none ran.
4. ``prepare``: the online directory: ``best.pth`` copied to ``[control] state_file`` (with ``best_perf`` reset,
   since the online test play is against the baseline, not the bots) and to ``[baseline.train]``/
   ``[baseline.test] state_file``.

``all`` runs the four in order. The settings live in the config's ``[bootstrap]`` table (see ``DEFAULTS``).
"""

if __package__ in (None, ''):  # run as a script: python mortal/bootstrap.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import copy
import logging
import os
import random
import sys
import time
from pathlib import Path

from mortal.config import SCHEMA, lookup
from mortal.entry import drop_rust_backtrace
from mortal.util.fsutil import atomic_copy, empty_dir

logger = logging.getLogger(__name__)

STEPS = ('gen-logs', 'train-grp', 'train-offline', 'prepare')
SPLITS = 'abcd'
# [bootstrap] keys and defaults come from the config schema (one source of truth); None = required.
DEFAULTS = {name: (None if key.required else key.default) for name, key in SCHEMA['bootstrap'].items()}


class BootstrapError(RuntimeError):
    """A bootstrap step cannot run or failed; the message names the step and the reason."""


def bootstrap_config(config):
    """The ``[bootstrap]`` table with defaults filled in. Raises ``BootstrapError`` naming a missing key."""
    table = dict(config.get('bootstrap') or {})
    missing = [k for k, v in DEFAULTS.items() if v is None and k not in table]
    if missing:
        raise BootstrapError(f'[bootstrap] lacks key(s) {missing}')
    unknown = sorted(set(table) - set(DEFAULTS))
    if unknown:
        logger.warning('[bootstrap] unknown key(s) ignored: %s', unknown)
    for k, v in DEFAULTS.items():
        table.setdefault(k, v)
    for k in ('games', 'val_games', 'grp_steps', 'workers', 'offline_test_every', 'offline_test_games'):
        if not isinstance(table[k], int) or table[k] < 0:
            raise BootstrapError(f'[bootstrap] {k} must be an integer >= 0, got {table[k]!r}')
    if not isinstance(table['offline_lr'], (int, float)) or table['offline_lr'] < 0:
        raise BootstrapError(f"[bootstrap] offline_lr must be a number >= 0, got {table['offline_lr']!r}")
    if not 0 <= table['epsilon'] < 1:
        raise BootstrapError(f"[bootstrap] epsilon must be within [0, 1), got {table['epsilon']!r}")
    if table['offline_test_games'] % 4:
        raise BootstrapError('[bootstrap] offline_test_games must be a multiple of 4')
    return table


# ---------------------------------------------------------------------------- step 1: rule-based games

def _exploring_rulebase_class():
    from mjai.bot.rulebase import RulebaseBot

    class ExploringRulebaseBot(RulebaseBot):
        """``RulebaseBot`` that, with probability ``epsilon``, discards a uniformly random legal tile instead
        (never while riichi is declared or accepted, where the discard is constrained), and whose other decisions
        go through ``flaw`` (``mortal.play.flaws``; None = the bot's own)."""

        def __init__(self, player_id, epsilon, rng, flaw=None):
            super().__init__(player_id)
            self.epsilon = epsilon
            self.rng = rng
            self.flaw = flaw

        def think(self):
            if (self.epsilon and self.can_discard and not self.self_riichi_declared
                    and self.rng.random() < self.epsilon):
                # forbidden_tiles is keyed without the red-five mark ('5mr' -> '5m')
                forbidden = self.forbidden_tiles
                tiles = sorted({t for t in self.tehai_mjai if not forbidden.get(t[:2], True)})
                if tiles:
                    return self.action_discard(self.rng.choice(tiles))
            decision = super().think()
            return self.flaw(self, decision) if self.flaw else decision

    return ExploringRulebaseBot


def play_set(task):
    """Worker: play the four seat rotations of one deal with rule-based bots in every seat.

    ``task`` = (log_dir, nonce, key, epsilon[, flaw]) (flaw: a name of ``mortal.play.flaws.FLAWS`` planted in every
    bot, '' = none). Writes ``{nonce}_{key}_{a..d}.json.gz`` (only ``a`` when
    epsilon is 0). Returns ``(nonce, substitutions, error or None)``; never raises, so one broken game
    does not stop the pool.
    """
    log_dir, nonce, key, epsilon, *flaw = task
    drop_rust_backtrace()  # also when the pool was started by a library caller, not by main()
    try:
        from mortal.play.agent import MjaiBotAgent
        from mortal.play.arena import OneVsThree
        from mortal.play.flaws import flaw_function

        bot_cls = _exploring_rulebase_class()
        flaw_fn = flaw_function(flaw[0] if flaw else None)
        counter = iter(range(1 << 30))

        def factory(seat):  # deterministic per (nonce, key, creation order)
            return bot_cls(seat, epsilon, random.Random(f'{nonce}:{key}:{next(counter)}'), flaw_fn)

        agents = [MjaiBotAgent(factory, name='rulebase') for _ in range(2)]
        OneVsThree(disable_progress_bar=True, log_dir=log_dir).py_vs_py(
            agents[0], agents[1], seed_start=(nonce, key), seed_count=1)
        if epsilon == 0:  # identical bots, identical deal: rotations b-d are copies of a
            for split in SPLITS[1:]:
                Path(log_dir, f'{nonce}_{key}_{split}.json.gz').unlink(missing_ok=True)
        return nonce, sum(a.substitutions for a in agents), None
    except Exception as e:  # reported by the parent; the set is retried on the next run
        return nonce, 0, f'{type(e).__name__}: {e}'


def _set_done(log_dir, nonce, key, splits):
    return all(Path(log_dir, f'{nonce}_{key}_{s}.json.gz').is_file() for s in splits)


def plan_sets(log_dir, games, key, epsilon):
    """Nonces 0.. of the deals needed for ``games`` hanchan, and those already on disk.

    Returns ``(todo, done)`` lists of nonces. One deal gives 4 logs (1 when epsilon is 0).
    """
    per_set = 4 if epsilon > 0 else 1
    n_sets = -(-games // per_set)
    splits = SPLITS[:per_set]
    todo, done = [], []
    for nonce in range(n_sets):
        (done if _set_done(log_dir, nonce, key, splits) else todo).append(nonce)
    return todo, done


def gen_logs(config, *, workers=None, progress=True):
    """Step 1 (see the module docstring). Returns the number of new logs written.

    Raises ``BootstrapError`` when some deals failed (the others are kept; rerun to retry).
    """
    import multiprocessing as mp
    from tqdm import tqdm

    boot = bootstrap_config(config)
    eps = boot['epsilon']
    workers = workers or boot['workers'] or os.cpu_count() or 1
    if boot['flaw']:
        logger.info('gen-logs: every bot plays with the planted flaw %r (mortal.play.flaws)', boot['flaw'])
    tasks = []
    for split, games, key in (('train', boot['games'], boot['seed_key']),
                              ('val', boot['val_games'], boot['seed_key'] + 1)):
        log_dir = os.path.join(boot['log_dir'], split)
        os.makedirs(log_dir, exist_ok=True)
        todo, done = plan_sets(log_dir, games, key, eps)
        logger.info('gen-logs %s: %d deals on disk, %d to play (%d hanchan wanted) in %s',
                    split, len(done), len(todo), games, log_dir)
        tasks += [(log_dir, nonce, key, eps, boot['flaw']) for nonce in todo]
    if not tasks:
        logger.info('gen-logs: nothing to do')
        return 0
    per_set = 4 if eps > 0 else 1
    failures, substitutions = [], 0
    # tqdm's default lock is a multiprocessing semaphore that the forkserver's resource tracker then
    # reports as leaked at exit; the bar is only drawn from this thread
    import threading
    tqdm.set_lock(threading.RLock())
    ctx = mp.get_context('forkserver')
    start = time.monotonic()
    # import by name so that workers find play_set even when this module runs as __main__
    from mortal import bootstrap as this
    with ctx.Pool(min(workers, len(tasks))) as pool, \
            tqdm(total=len(tasks) * per_set, unit='game', desc='gen-logs', disable=not progress) as bar:
        finished = 0
        for nonce, subs, err in pool.imap_unordered(this.play_set, tasks):
            finished += 1
            substitutions += subs
            if err:
                failures.append((nonce, err))
                logger.error('gen-logs: deal %d failed: %s', nonce, err)
            else:
                bar.update(per_set)
            if not progress and (finished % max(1, len(tasks) // 10) == 0 or finished == len(tasks)):
                logger.info('gen-logs: %d/%d deals played (%.0f s)', finished, len(tasks),
                            time.monotonic() - start)
    elapsed = time.monotonic() - start
    written = (len(tasks) - len(failures)) * per_set
    logger.info('gen-logs: %d logs in %.0f s with %d processes (%.2f s per game per process); '
                '%d illegal bot reactions replaced', written, elapsed, workers,
                elapsed * min(workers, len(tasks)) / max(written, 1), substitutions)
    _drop_file_indexes(config)
    if failures:
        raise BootstrapError(f'gen-logs: {len(failures)} of {len(tasks)} deals failed (first: deal '
                             f'{failures[0][0]}: {failures[0][1]}); rerun to retry them')
    return written


def _drop_file_indexes(config):
    """New logs make the cached file lists stale: remove them so the trainers rebuild them."""
    boot = bootstrap_config(config)
    for path in (lookup(config, 'grp.dataset.file_index'), _offline_paths(boot)['file_index']):
        if path and os.path.exists(path):
            os.remove(path)


# ---------------------------------------------------------------------------- step 2: GRP

def _grp_config(config, boot):
    grp = copy.deepcopy(config['grp'])
    grp['dataset']['train_globs'] = [os.path.join(boot['log_dir'], 'train', '*.json.gz')]
    grp['dataset']['val_globs'] = [os.path.join(boot['log_dir'], 'val', '*.json.gz')]
    return grp


def _grp_steps_done(state_file):
    from mortal.model.checkpoint import load_checkpoint
    if not os.path.exists(state_file):
        return 0
    return int(load_checkpoint(state_file).get('steps', 0))


def train_grp(config, *, progress=True):
    """Step 2: train the GRP to ``[bootstrap] grp_steps`` (resuming its checkpoint). Returns the steps."""
    from mortal import train_grp as tg

    boot = bootstrap_config(config)
    grp = _grp_config(config, boot)
    target = boot['grp_steps']
    save_every = grp['control']['save_every']
    if target % save_every:
        raise BootstrapError(f'[bootstrap] grp_steps = {target} must be a multiple of [grp.control] '
                             f'save_every = {save_every} (the GRP is saved only then)')
    done = _grp_steps_done(grp['state_file'])
    if done >= target:
        logger.info('train-grp: %s already at step %d >= %d, skipped', grp['state_file'], done, target)
        return done
    os.makedirs(os.path.dirname(os.path.abspath(grp['state_file'])), exist_ok=True)
    start = time.monotonic()
    steps = tg.train(grp, max_steps=target, num_workers=0, progress=progress)
    logger.info('train-grp: %d steps in %.0f s -> %s', steps, time.monotonic() - start, grp['state_file'])
    return steps


# ---------------------------------------------------------------------------- step 3: offline Mortal

def _offline_paths(boot):
    root = os.path.join(boot['work_dir'], 'offline')
    return {
        'root': root,
        'state_file': os.path.join(root, 'mortal.pth'),
        'best_state_file': os.path.join(root, 'best.pth'),
        'tensorboard_dir': os.path.join(root, 'tensorboard'),
        'test_log_dir': os.path.join(root, 'test_play'),
        'file_index': os.path.join(root, 'file_index.pth'),
        'done': os.path.join(root, 'DONE'),
    }


def offline_config(config):
    """The config of the offline run: the given one with ``online = false``, the bootstrap train logs as
    dataset and every output under ``[bootstrap] work_dir``/``offline``."""
    boot = bootstrap_config(config)
    p = _offline_paths(boot)
    cfg = copy.deepcopy(config)
    control = cfg['control']
    control['online'] = False
    control['state_file'] = p['state_file']
    control['best_state_file'] = p['best_state_file']
    control['tensorboard_dir'] = p['tensorboard_dir']
    test_every = boot['offline_test_every']
    if test_every:
        if test_every % control['save_every']:
            raise BootstrapError(f'[bootstrap] offline_test_every = {test_every} must be a multiple of '
                                 f"[control] save_every = {control['save_every']}")
        control['test_every'] = test_every
    else:
        control['test_every'] = control['save_every'] * 10**9  # never
    cfg['dataset']['globs'] = [os.path.join(boot['log_dir'], 'train', '*.json.gz')]
    cfg['dataset']['file_index'] = p['file_index']
    cfg['dataset']['player_names_files'] = []
    cfg['test_play'] = {'games': boot['offline_test_games'], 'log_dir': p['test_log_dir']}
    cfg['freeze_bn'] = {'mortal': False}  # offline learns the BatchNorm statistics (Mortal)
    if boot['offline_lr']:
        # online rates (Mortal: 1e-5) are too slow for a bootstrap from scratch
        cfg['optim']['scheduler'].update(peak=float(boot['offline_lr']), final=float(boot['offline_lr']),
                                         warm_up_steps=0, max_steps=0)
    return cfg


class RulebaseTestPlayer:
    """Test play against three RulebaseBots (the offline run has no Mortal baseline to play against).

    ``test_play(seed_count, mortal, dqn, device) -> mortal.stat.Stat`` of the challenger named ``mortal``,
    on the fixed test seeds of ``mortal.play.player``. ``enabled`` is False when ``[bootstrap] offline_test_every`` is
    0 (the trainer then prints no countdown to a test play that never comes).
    """

    def __init__(self, config):
        self.version = config['control']['version']
        self.log_dir = os.path.abspath(config['test_play']['log_dir'])
        self.enabled = bool((config.get('bootstrap') or {}).get('offline_test_every',
                                                                DEFAULTS['offline_test_every']))

    def test_play(self, seed_count, mortal, dqn, device):
        import torch
        from mortal.play.agent import MjaiBotAgent
        from mortal.play.arena import OneVsThree
        from mortal.play.engine import MortalEngine
        from mortal.play.player import TEST_SEED
        from mortal.stat import Stat

        engine = MortalEngine(mortal, dqn, is_oracle=False, version=self.version, device=torch.device(device),
                              name='mortal')
        empty_dir(self.log_dir)
        OneVsThree(disable_progress_bar=False, log_dir=self.log_dir).py_vs_py(
            engine, MjaiBotAgent(name='rulebase'), seed_start=TEST_SEED, seed_count=seed_count)
        return Stat.from_dir(self.log_dir, 'mortal')


def train_offline(config):
    """Step 3. Returns the path of ``best.pth``. Skipped when a previous run finished."""
    from mortal.train import Trainer

    boot = bootstrap_config(config)
    p = _offline_paths(boot)
    if os.path.exists(p['done']) and os.path.exists(p['best_state_file']):
        logger.info('train-offline: finished before (%s), skipped', p['done'])
        return p['best_state_file']
    if not os.path.exists(config['grp']['state_file']):
        raise BootstrapError(f"train-offline needs the GRP ({config['grp']['state_file']}): run train-grp first")
    cfg = offline_config(config)
    os.makedirs(p['root'], exist_ok=True)
    start = time.monotonic()
    trainer = Trainer(cfg, test_player=RulebaseTestPlayer(cfg))
    try:
        trainer.run()
    finally:
        trainer.writer.close()
    if trainer.steps == 0:
        raise BootstrapError(f"train-offline: not one full batch of {cfg['control']['batch_size']} samples in "
                             'the bootstrap logs; generate more games or lower [control] batch_size')
    if trainer.steps % trainer.save_every:
        trainer.save()  # the epoch's tail after the last save_every
    if not os.path.exists(p['best_state_file']):
        atomic_copy(p['state_file'], p['best_state_file'])
    Path(p['done']).write_text(f'steps {trainer.steps}\n')
    logger.info('train-offline: %d steps in %.0f s -> %s', trainer.steps, time.monotonic() - start,
                p['best_state_file'])
    return p['best_state_file']


# ---------------------------------------------------------------------------- step 4: online dir

def prepare(config, *, force=False):
    """Step 4: copy the offline ``best.pth`` to the online trainer state and the baselines.

    Existing targets are kept unless ``force``. Returns the list of files written.
    """
    from mortal.model.checkpoint import INITIAL_BEST_PERF, atomic_torch_save, load_checkpoint

    boot = bootstrap_config(config)
    best = _offline_paths(boot)['best_state_file']
    if not os.path.exists(best):
        raise BootstrapError(f'prepare needs {best}: run train-offline first')
    written = []
    state_file = config['control']['state_file']
    if force or not os.path.exists(state_file):
        state = load_checkpoint(best)
        # the offline best was measured against RulebaseBots; online test play is against the baseline
        state['best_perf'] = dict(INITIAL_BEST_PERF)
        atomic_torch_save(state, state_file)
        written.append(state_file)
    for slot in ('train', 'test'):
        target = lookup(config, f'baseline.{slot}.state_file')
        if target and target not in written and (force or not os.path.exists(target)):
            atomic_copy(best, target)
            written.append(target)
    logger.info('prepare: wrote %s', written or 'nothing (all targets exist; --force to overwrite)')
    return written


# ---------------------------------------------------------------------------- driver

def run_steps(config, steps, *, force=False, progress=True):
    """Run the named steps in order; returns ``{step: seconds}``."""
    timings = {}
    for step in steps:
        start = time.monotonic()
        logger.info('=== bootstrap %s', step)
        if step == 'gen-logs':
            gen_logs(config, progress=progress)
        elif step == 'train-grp':
            train_grp(config, progress=progress)
        elif step == 'train-offline':
            train_offline(config)
        elif step == 'prepare':
            prepare(config, force=force)
        else:
            raise BootstrapError(f'unknown step {step!r}; one of {STEPS} or all')
        timings[step] = time.monotonic() - start
    return timings


def main(argv=None):
    """``python -m mortal.bootstrap STEP [-c PATH] [--force] [--no-progress]``; returns the exit status (2: config
    error, 1: a failed step)."""
    from mortal import entry
    from mortal.config import TRAIN_SECTIONS, ConfigError

    parser = entry.parser('Bootstrap a model from rule-based play ([bootstrap] table).',
                          prog='python -m mortal.bootstrap')
    parser.add_argument('step', choices=STEPS + ('all',))
    parser.add_argument('--force', action='store_true', help='prepare: overwrite existing online checkpoints')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    args = entry.start(parser, argv)
    try:
        config = entry.load_config(args, TRAIN_SECTIONS + ('grp.control', 'grp.dataset', 'grp.optim'))
        bootstrap_config(config)
    except (ConfigError, BootstrapError) as e:
        return entry.error(e)
    steps = STEPS if args.step == 'all' else (args.step,)
    try:
        timings = run_steps(config, steps, force=args.force, progress=not args.no_progress)
    except BootstrapError as e:
        return entry.error(e, 1)
    for step, secs in timings.items():
        print(f'{step}: {secs:.0f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
