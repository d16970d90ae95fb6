"""Bootstrap a model without Mortal's weights:
``python -m mortal.tools.bootstrap {gen-logs,train-grp,train-offline,prepare,all}``.

Steps (each resumable: a finished step is skipped, an interrupted one continues):

1. ``gen-logs``: hanchan of four ``mjai.bot.rulebase.RulebaseBot`` seats, played by ``mortal.play.arena.OneVsThree``
   over a pool of processes (the bot's move search holds the interpreter lock ~5 ms a call), written as gzip
   mjai logs ``{nonce}_{key}_{a|b|c|d}.json.gz`` under ``[bootstrap] log_dir``/``train`` and ``/val``.
   Every bot discards a random legal tile with probability ``[bootstrap] epsilon`` (not after riichi):
   four identical deterministic bots would replay the same game in all four seat rotations of a deal, so
   without the noise three of every four logs would be byte-identical copies. With ``epsilon = 0`` only
   rotation ``a`` is kept.
2. ``train-grp``: ``mortal.train_grp`` on those logs for ``[bootstrap] grp_steps`` steps -> ``[grp] state_file``;
   with ``[bootstrap] grp_patience`` P > 0, ``grp_steps`` is the most: training stops after P validations
   (every ``[grp.control] save_every`` steps) without a new lowest cross entropy on the val logs, and the best
   validated weights are kept. Then ``check_grp``: a GRP whose cross entropy over the val logs is not below
   the uniform prediction's (ln 24 = 3.178) is not handed on: one warning line names both, and the kyoku reward
   falls back to ``[env] reward = 'points'`` (``mortal.data.reward``). The reward chosen is logged, set in the
   config and written into the config file the bootstrap was started with (``[env] reward``), which the online
   processes then read.
3. ``train-offline``: offline epochs of ``mortal.train.Trainer`` (``online = false``, CQL on) on the train logs
   with the config's ``[resnet]``/``[control] version``; state under ``[bootstrap] work_dir``/``offline``. After
   each epoch (one ``Trainer`` pass: ``[dataset] num_epochs`` over the logs) the offline loss (the training
   terms, no gradient, BatchNorm on its running statistics) is measured on the val logs; both losses are logged,
   written to ``epochs.json`` and to TensorBoard (``bootstrap/train_loss``, ``bootstrap/val_loss``, step = epoch)
   in the offline run's ``tensorboard`` dir. With ``[bootstrap] offline_max_epochs`` E > 1 the run stops after
   ``offline_patience`` epochs without a new lowest validation loss (or at E), and ``best.pth`` is the checkpoint
   of the epoch with the lowest one (early stopping), copied back to the state file ``mortal.pth`` at the end (so a
   continuation of the offline run starts from it too). With E = 1 (the default) it is one epoch, as before:
   there is no Mortal baseline yet, so its test play (every ``[bootstrap] offline_test_every`` steps, 0 = never)
   is against three RulebaseBots, and ``best.pth`` is the best tested checkpoint, or the last one when none ran
   (with E > 1 the test play's pick goes to ``best_test_play.pth`` instead).
4. ``prepare``: the online directory: ``best.pth`` copied to ``[control] state_file`` (with ``best_perf`` reset,
   since the online test play is against the baseline, not the bots) and to ``[baseline.train]``/
   ``[baseline.test] state_file``.

``all`` runs the four in order. The settings live in the config's ``[bootstrap]`` table (its keys and defaults:
``mortal.config_schema.Bootstrap``).
"""

if __package__ in (None, ''):  # run as a script: python mortal/tools/bootstrap.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import copy
import glob
import json
import logging
import os
import random
import re
import sys
import time
from pathlib import Path

from mortal.config import ConfigError, checked_section, lookup, put, typed
from mortal.entry import drop_rust_backtrace
from mortal.util.fsutil import atomic_copy, atomic_write_bytes, empty_dir

logger = logging.getLogger(__name__)

STEPS = ('gen-logs', 'train-grp', 'train-offline', 'prepare')
SPLITS = 'abcd'


class BootstrapError(RuntimeError):
    """A bootstrap step cannot run or failed; the message names the step and the reason."""


def bootstrap_config(config, *, path=None):
    """The typed ``[bootstrap]`` table (``mortal.config_schema.Bootstrap``: its defaults and ranges). Raises
    ``BootstrapError`` naming the missing table or each offending key, and ``path`` (default: ``$MORTAL_CFG`` or
    ``config.toml``)."""
    try:
        return checked_section(config, 'bootstrap', path=path)
    except ConfigError as e:
        raise BootstrapError(str(e)) from None


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
        # The arena resets each bot every kyoku with the start_game it sends before each start_kyoku: mjai's Bot keeps
        # call, discard and dora events from start_game on (mjai's Match sends one a hanchan), and a meld of an earlier
        # kyoku in its hand string breaks find_improving_tiles (tests/test_teacher_whole.py).
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
    eps = boot.epsilon
    workers = workers or boot.workers or os.cpu_count() or 1
    if boot.flaw:
        logger.info('gen-logs: every bot plays with the planted flaw %r (mortal.play.flaws)', boot.flaw)
    tasks = []
    for split, games, key in (('train', boot.games, boot.seed_key), ('val', boot.val_games, boot.seed_key + 1)):
        log_dir = os.path.join(boot.log_dir, split)
        os.makedirs(log_dir, exist_ok=True)
        todo, done = plan_sets(log_dir, games, key, eps)
        logger.info('gen-logs %s: %d deals on disk, %d to play (%d hanchan wanted) in %s',
                    split, len(done), len(todo), games, log_dir)
        tasks += [(log_dir, nonce, key, eps, boot.flaw) for nonce in todo]
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
    from mortal.tools import bootstrap as this
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
    grp = typed(config).grp
    for path in (grp.dataset.file_index if grp and grp.dataset else None,
                 _offline_paths(bootstrap_config(config))['file_index']):
        if path and os.path.exists(path):
            os.remove(path)


# ---------------------------------------------------------------------------- step 2: GRP

def _grp_config(config, boot):
    """The typed ``[grp]`` the bootstrap trains: the config's, on the bootstrap's train and val logs."""
    grp = typed(config).grp
    dataset = grp.dataset.model_copy(update={'train_globs': [os.path.join(boot.log_dir, 'train', '*.json.gz')],
                                             'val_globs': [os.path.join(boot.log_dir, 'val', '*.json.gz')]})
    return grp.model_copy(update={'dataset': dataset})


def _grp_steps_done(state_file):
    """``(steps, stopped)`` of the GRP checkpoint: its step count and whether early stopping ended it."""
    from mortal.model.checkpoint import load_checkpoint
    if not os.path.exists(state_file):
        return 0, False
    state = load_checkpoint(state_file)
    return int(state.get('steps', 0)), bool((state.get('early_stopping') or {}).get('stopped'))


def train_grp(config, *, progress=True):
    """Step 2: train the GRP to ``[bootstrap] grp_steps`` (resuming its checkpoint), with early stopping when
    ``[bootstrap] grp_patience`` > 0 (``mortal.train_grp.train``'s ``patience``). Returns the steps. Skipped when
    the checkpoint has reached ``grp_steps`` or was stopped early."""
    from mortal import train_grp as tg

    boot = bootstrap_config(config)
    grp = _grp_config(config, boot)
    target = boot.grp_steps
    save_every = grp.control.save_every
    if target % save_every:
        raise BootstrapError(f'[bootstrap] grp_steps = {target} must be a multiple of [grp.control] '
                             f'save_every = {save_every} (the GRP is saved only then)')
    done, stopped = _grp_steps_done(grp.state_file)
    if done >= target or stopped:
        logger.info('train-grp: %s already at step %d%s, skipped', grp.state_file, done,
                    ' (stopped early)' if stopped else f' >= {target}')
        return done
    os.makedirs(os.path.dirname(os.path.abspath(grp.state_file)), exist_ok=True)
    start = time.monotonic()
    steps = tg.train(grp, max_steps=target, num_workers=0, progress=progress, patience=boot.grp_patience)
    logger.info('train-grp: %d steps in %.0f s -> %s', steps, time.monotonic() - start, grp.state_file)
    return steps


def _val_logs(boot):
    """The bootstrap's validation logs (``[bootstrap] log_dir``/val), sorted."""
    return sorted(glob.glob(os.path.join(boot.log_dir, 'val', '*.json.gz')))


def check_grp(config, config_path=None):
    """Refuse a GRP that is no better than uniform: the reward the online run will use.

    Measures the GRP of ``[grp] state_file`` on every sample (all game prefixes) of the bootstrap's val logs:
    mean cross entropy over the 24 rank orders, in nats. Not below ``mortal.train_grp.UNIFORM_CE`` (ln 24 =
    3.178, the uniform prediction's) -> one warning line naming both, and ``[env] reward = 'points'`` (the scaled
    point change, ``mortal.data.reward``); below -> ``[env] reward = 'grp'`` (Mortal's). A config that already
    says ``'points'`` keeps it (only logged). Without val logs or GRP file nothing is measured and the config's
    reward stands. The choice is logged, set in ``config`` (``[env] reward``) and, with ``config_path``, written
    into that TOML file (``write_reward``).

    Returns ``{'reward': 'grp'|'points', 'ce': float or None, 'uniform': ln 24, 'val_games': int}``.
    Raises what ``mortal.data.reward.load_grp`` raises for an unusable GRP file.
    """
    from mortal.data.reward import load_grp
    from mortal.train_grp import UNIFORM_CE, load_samples, mean_ce

    boot = bootstrap_config(config)
    cfg = typed(config)
    configured = cfg.env.reward
    files = _val_logs(boot)
    grp_file = cfg.grp.state_file
    ce = None
    samples = load_samples(files) if files and os.path.exists(grp_file) else []
    if samples:
        ce = mean_ce(load_grp(grp_file, cfg.grp.network), samples)
    if ce is None:
        reward = configured
        logger.warning('train-grp: no GRP or no validation logs to check it on (%s, %d val logs): the kyoku '
                       "reward stays [env] reward = '%s'", grp_file, len(files), reward)
    elif configured == 'points':
        reward = 'points'
        logger.info("train-grp: [env] reward = 'points' set in the config (GRP validation cross entropy %.4f, "
                    'uniform ln 24 = %.4f, %d val games)', ce, UNIFORM_CE, len(files))
    elif ce >= UNIFORM_CE:
        reward = 'points'
        logger.warning("train-grp: GRP not handed on: its validation cross entropy %.4f is not below uniform's "
                       "ln 24 = %.4f on %d val games; the kyoku reward falls back to [env] reward = 'points' "
                       '(score change, mortal.data.reward)', ce, UNIFORM_CE, len(files))
    else:
        reward = 'grp'
        logger.info("train-grp: kyoku reward [env] reward = 'grp': GRP validation cross entropy %.4f < uniform "
                    'ln 24 = %.4f on %d val games', ce, UNIFORM_CE, len(files))
    put(config, 'env.reward', reward)
    if config_path:
        write_reward(config_path, reward)
    return {'reward': reward, 'ce': ce, 'uniform': UNIFORM_CE, 'val_games': len(files)}


_TABLE_HEADER = re.compile(r'^\s*\[')
_ENV_HEADER = re.compile(r'^\s*\[\s*env\s*\]\s*(#.*)?$')
_REWARD_LINE = re.compile(r'^\s*reward\s*=')


def write_reward(path, reward):
    """Set ``[env] reward = '<reward>'`` in the TOML file ``path``, keeping every other line (and comment) as it
    is: the line of the key is replaced, or one is added right under the ``[env]`` header, or an ``[env]`` table
    is appended. Nothing is written when the file already says so. Returns whether the file was changed.

    Raises BootstrapError when the edited text would not read back as TOML with that value (e.g. ``[env]`` given
    as dotted keys or an inline table): set the key by hand then.
    """
    from mortal.config import tomllib

    text = Path(path).read_text(encoding='utf-8')
    if lookup(tomllib.loads(text), 'env.reward') == reward:
        return False
    lines = text.splitlines(keepends=True)
    line = f"reward = '{reward}'  # written by mortal.tools.bootstrap (check_grp)\n"
    header = next((i for i, x in enumerate(lines) if _ENV_HEADER.match(x)), None)
    if header is None:
        lines.append(('\n' if text and not text.endswith('\n\n') else '') + '[env]\n' + line)
    else:
        end = next((j for j in range(header + 1, len(lines)) if _TABLE_HEADER.match(lines[j])), len(lines))
        at = next((j for j in range(header + 1, end) if _REWARD_LINE.match(lines[j])), None)
        if at is None:
            lines.insert(header + 1, line)
        else:
            lines[at] = line
    new = ''.join(lines)
    try:
        ok = lookup(tomllib.loads(new), 'env.reward') == reward
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        raise BootstrapError(f"cannot write [env] reward = '{reward}' into {path}: set it there by hand")
    atomic_write_bytes(new.encode('utf-8'), path)
    logger.info("wrote [env] reward = '%s' into %s", reward, path)
    return True


# ---------------------------------------------------------------------------- step 3: offline Mortal

def _offline_paths(boot):
    root = os.path.join(boot.work_dir, 'offline')
    return {
        'root': root,
        'state_file': os.path.join(root, 'mortal.pth'),
        'best_state_file': os.path.join(root, 'best.pth'),
        'best_test_play': os.path.join(root, 'best_test_play.pth'),  # the test play's pick when early stopping
        'history': os.path.join(root, 'epochs.json'),
        'tensorboard_dir': os.path.join(root, 'tensorboard'),
        'test_log_dir': os.path.join(root, 'test_play'),
        'file_index': os.path.join(root, 'file_index.pth'),
        'done': os.path.join(root, 'DONE'),
    }


def offline_config(config):
    """The config of the offline run: the given one with ``online = false``, the bootstrap train logs as
    dataset and every output under ``[bootstrap] work_dir``/``offline``. With ``offline_max_epochs`` > 1 the
    trainer's own best (test play) goes to ``best_test_play.pth``: ``best.pth`` is the lowest validation loss's
    epoch then."""
    boot = bootstrap_config(config)
    p = _offline_paths(boot)
    save_every = typed(config).control.save_every
    test_every = boot.offline_test_every
    if test_every % save_every:  # 0 (never) is a multiple
        raise BootstrapError(f'[bootstrap] offline_test_every = {test_every} must be a multiple of '
                             f'[control] save_every = {save_every}')
    changes = {
        'control.online': False,
        'control.state_file': p['state_file'],
        'control.best_state_file': p['best_test_play'] if boot.offline_max_epochs > 1 else p['best_state_file'],
        'control.tensorboard_dir': p['tensorboard_dir'],
        'control.test_every': test_every or save_every * 10**9,  # 0: never
        'dataset.globs': [os.path.join(boot.log_dir, 'train', '*.json.gz')],
        'dataset.file_index': p['file_index'],
        'dataset.player_names_files': [],
        'test_play': {'games': boot.offline_test_games, 'log_dir': p['test_log_dir']},
        'freeze_bn': {'mortal': False},  # offline learns the BatchNorm statistics (Mortal)
    }
    if boot.offline_lr:  # online rates (Mortal: 1e-5) are too slow for a bootstrap from scratch
        changes.update({f'optim.scheduler.{key}': value for key, value in (
            ('peak', boot.offline_lr), ('final', boot.offline_lr), ('warm_up_steps', 0), ('max_steps', 0))})
    cfg = copy.deepcopy(config)
    for dotted, value in changes.items():
        put(cfg, dotted, value)
    return cfg


class RulebaseTestPlayer:
    """Test play against three RulebaseBots (the offline run has no Mortal baseline to play against).

    ``test_play(seed_count, mortal, dqn, device) -> mortal.stat.Stat`` of the challenger named ``mortal``,
    on the fixed test seeds of ``mortal.play.player``. ``enabled`` is False when ``[bootstrap] offline_test_every`` is
    0 (the trainer then prints no countdown to a test play that never comes).
    """

    def __init__(self, config):
        cfg = typed(config)
        self.version = cfg.control.version
        self.log_dir = os.path.abspath(cfg.test_play.log_dir)
        self.enabled = cfg.bootstrap is not None and cfg.bootstrap.offline_test_every > 0

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


def validation_loss(trainer, files):
    """The offline loss of ``trainer``'s models on the logs ``files``: ``(mean loss per sample, samples)``.

    The terms and weights of training (``mortal.learning.loss.learner_loss`` with the trainer's ``LossWeights``:
    0.5 MSE to the Monte-Carlo target + CQL + next-rank CE, in the config's ``[env]`` reward), over every seat's
    every decision of one pass over ``files`` (no augmentation, all batches including the last short one), without
    gradient and in eval mode (BatchNorm on its running statistics, no dropout), so it is the same at any batch
    size. Raises BootstrapError when the logs give no sample.
    """
    import torch
    from mortal.data.dataloader import learner_loader
    from mortal.learning.diagnostics import eval_mode
    from mortal.learning.intake import obs_on_device
    from mortal.learning.loss import learner_loss

    cfg = copy.deepcopy(trainer.config)
    for key, value in (('num_epochs', 1), ('enable_augmentation', False), ('reserve_ratio', 0.0)):
        put(cfg, f'dataset.{key}', value)
    loader = learner_loader(cfg, trainer.version, list(files), [], batch_size=trainer.batch_size, num_workers=0)
    dev = trainer.device
    total, count = 0.0, 0
    with torch.no_grad(), eval_mode(trainer.mortal, trainer.dqn, trainer.aux_net):
        for obs, actions, masks, steps_to_done, rewards, ranks, *_cf in loader:  # offline: no counterfactual
            n = obs.shape[0]
            obs = obs_on_device(obs, trainer.device, trainer.version)
            actions = actions.to(dtype=torch.int64, device=dev)
            masks = masks.to(dtype=torch.bool, device=dev)
            q_target = (trainer.gamma ** steps_to_done.to(dev) * rewards.to(dev)).to(torch.float32)
            with torch.autocast(dev.type, enabled=trainer.enable_amp):
                phi = trainer.mortal(obs)
                q_out = trainer.dqn(phi, masks)
                next_rank_logits, = trainer.aux_net(phi)
                terms = learner_loss(q_out, next_rank_logits, actions, q_target,
                                     ranks.to(dtype=torch.int64, device=dev), masks=masks, online_rows=n,
                                     weights=trainer.loss_weights)
            total += float(terms.total) * n
            count += n
    if not count:
        raise BootstrapError(f'train-offline: no validation sample in {len(files)} val logs')
    return total / count, count


class _EpochBar:
    """The trainer's progress bar for one whole offline epoch: the trainer closes and reopens its bar at every save
    (``save_every`` batches, Mortal's cadence); this one ignores those closes and is closed by ``finish``, so the
    console shows one bar per epoch. ``bar``: a tqdm bar (total unknown: the loader's batches are counted as they
    come)."""

    def __init__(self, bar):
        self.bar = bar

    def update(self, n=1):
        self.bar.update(n)

    def close(self):
        pass  # a save inside the epoch: the same bar goes on

    def finish(self):
        self.bar.close()


def _epoch_trainer_class():
    from mortal.train import Trainer

    class EpochTrainer(Trainer):
        """A ``Trainer`` that also sums its loss terms over an epoch (its per-save sums are reset at each save):
        ``take_epoch_loss(batches)`` -> the mean training loss (the weighted total of ``learner_loss``) of the
        ``batches`` trained since the last call (or since it was made). Its progress bar spans an epoch
        (``epoch_bar``; none when ``progress`` is off)."""

        def __init__(self, *args, progress=True, **kwargs):
            self.progress = progress
            self.epoch_bar = None
            super().__init__(*args, **kwargs)  # its reset_stats() comes before epoch_sums exists: nothing to add
            self.epoch_sums = {}

        def _progress_bar(self):
            return self.epoch_bar

        def log_total_steps(self, tested=True):
            if self.epoch_bar is None:  # the epoch's bar counts the steps: no line per save beside it
                super().log_total_steps(tested)

        def train_epoch(self, label='offline'):
            """``Trainer.train_epoch`` under one bar labelled ``label``; returns the batches trained."""
            if self.progress:
                from tqdm import tqdm
                self.epoch_bar = _EpochBar(tqdm(desc=label, unit='batch', dynamic_ncols=True, ascii=True))
            try:
                return super().train_epoch()
            finally:
                if self.epoch_bar is not None:
                    self.epoch_bar.finish()
                    self.epoch_bar = None

        def reset_stats(self):
            sums = getattr(self, 'epoch_sums', None)
            if sums is not None:
                for name, value in self.stats.items():
                    sums[name] = sums.get(name, 0.0) + value
            super().reset_stats()

        def take_epoch_loss(self, batches):
            self.reset_stats()  # the tail since the last save joins the sums (and leaves the next save's mean)
            sums, self.epoch_sums = self.epoch_sums, {}
            w = self.loss_weights
            total = (sums.get('dqn_loss', 0.0) + w.next_rank * sums.get('next_rank_loss', 0.0)
                     + (w.cql * sums.get('cql_loss', 0.0) if w.with_cql else 0.0))
            return total / max(batches, 1)

    return EpochTrainer


def read_history(path):
    """The offline epochs recorded so far (``epochs.json``): a list of ``{epoch, steps, train_loss, val_loss}``
    (``val_loss`` None without val logs); [] when there is none."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []


def _best_epoch(history, patience):
    """``(index of the lowest val loss or -1, stop)`` (``mortal.train_grp.early_stopping_state``)."""
    from mortal.train_grp import early_stopping_state
    return early_stopping_state([h['val_loss'] for h in history], patience)


def _checkpoint_steps(path):
    from mortal.model.checkpoint import load_checkpoint
    if not os.path.exists(path):
        return None
    return int(load_checkpoint(path, map_location='cpu').get('steps', -1))


def _sync_best(p, history, patience):
    """Early stopping's ``best.pth`` must be the checkpoint of the best recorded epoch. Each epoch's record is
    written before its copy: a stop between the two leaves the state file at that very epoch, copied here."""
    best, _ = _best_epoch(history, patience)
    if best < 0:
        return
    want = history[best]['steps']
    if _checkpoint_steps(p['best_state_file']) == want:
        return
    if _checkpoint_steps(p['state_file']) == want:
        atomic_copy(p['state_file'], p['best_state_file'])
        logger.info('train-offline: best.pth restored from the state file (epoch %d)', history[best]['epoch'])
    else:
        raise BootstrapError(f"train-offline: {p['best_state_file']} is not the best epoch's checkpoint (epoch "
                             f"{history[best]['epoch']}, step {want}) and the state file has moved on; remove "
                             f"{p['root']} to train the offline model again")


def train_offline(config, *, progress=True):
    """Step 3 (see the module docstring): offline epochs, each followed by the validation loss, with early
    stopping when ``[bootstrap] offline_max_epochs`` > 1. Returns the path of ``best.pth``. Skipped when a previous
    run finished (``DONE``); an interrupted one continues from its last checkpoint and ``epochs.json``.
    ``progress``: one bar per epoch.

    Raises BootstrapError: no GRP for the 'grp' reward, early stopping without val logs, not one full batch.
    """
    boot = bootstrap_config(config)
    p = _offline_paths(boot)
    if os.path.exists(p['done']) and os.path.exists(p['best_state_file']):
        logger.info('train-offline: finished before (%s), skipped', p['done'])
        return p['best_state_file']
    typed_config = typed(config)
    reward, grp_file = typed_config.env.reward, typed_config.grp.state_file
    if reward == 'grp' and not os.path.exists(grp_file):
        raise BootstrapError(f'train-offline needs the GRP ({grp_file}): run train-grp first')
    max_epochs, patience = boot.offline_max_epochs, boot.offline_patience
    early = max_epochs > 1
    val_files = _val_logs(boot)
    if early and not val_files:
        raise BootstrapError(f"train-offline: offline_max_epochs = {max_epochs} picks the epoch by the validation "
                             f"loss, but {boot.log_dir}/val has no logs ([bootstrap] val_games)")
    cfg = offline_config(config)
    os.makedirs(p['root'], exist_ok=True)
    history = read_history(p['history'])
    start = time.monotonic()
    trainer = _epoch_trainer_class()(cfg, test_player=RulebaseTestPlayer(cfg), progress=progress)
    logger.info("train-offline: kyoku reward [env] reward = '%s'; at most %d epoch(s)%s", reward, max_epochs,
                f', patience {patience}' if early else '')
    try:
        if early:
            _sync_best(p, history, patience)
        while len(history) < max_epochs and not (early and _best_epoch(history, patience)[1]):
            _offline_epoch(trainer, history, p, val_files, max_epochs, patience)
    finally:
        trainer.writer.close()
    _keep_best_epoch(p, history, patience, early)
    Path(p['done']).write_text(f'steps {trainer.steps}\nepochs {len(history)}\n')
    logger.info('train-offline: %d steps in %.0f s -> %s', trainer.steps, time.monotonic() - start,
                p['best_state_file'])
    return p['best_state_file']


def _offline_epoch(trainer, history, p, val_files, max_epochs, patience) -> None:
    """One epoch of ``train_offline``: train, save its tail, the validation loss, the record appended to
    ``history`` (and ``epochs.json``), TensorBoard and the log line; with early stopping (``max_epochs`` > 1) a
    new best epoch is copied to best.pth."""
    epoch = len(history) + 1
    batches = trainer.train_epoch(f'offline epoch {epoch}/{max_epochs}')
    if trainer.steps == 0:
        raise BootstrapError(f"train-offline: not one full batch of {trainer.batch_size} samples "
                             'in the bootstrap logs; generate more games or lower [control] batch_size')
    if trainer.steps % trainer.save_every:
        trainer.save()  # the epoch's tail after the last save_every
    train_loss = trainer.take_epoch_loss(batches)
    val_loss = val_samples = None
    if val_files:
        val_loss, val_samples = validation_loss(trainer, val_files)
    history.append({'epoch': epoch, 'steps': trainer.steps, 'train_loss': train_loss, 'val_loss': val_loss})
    atomic_write_bytes(json.dumps(history, indent=1).encode(), p['history'])
    trainer.writer.add_scalar('bootstrap/train_loss', train_loss, epoch)
    if val_loss is not None:
        trainer.writer.add_scalar('bootstrap/val_loss', val_loss, epoch)
    trainer.writer.flush()
    if val_loss is None:
        logger.info('train-offline: epoch %d: %d steps, train loss %.4f (no val logs)', epoch,
                    trainer.steps, train_loss)
        return
    best, _ = _best_epoch(history, patience)
    logger.info('train-offline: epoch %d/%d: %d steps, train loss %.4f, val loss %.4f on %s samples '
                '(best %.4f at epoch %d)', epoch, max_epochs, trainer.steps, train_loss, val_loss,
                f'{val_samples:,}', history[best]['val_loss'], history[best]['epoch'])
    if max_epochs > 1 and best == len(history) - 1:
        atomic_copy(p['state_file'], p['best_state_file'])


def _keep_best_epoch(p, history, patience, early) -> None:
    """After the epochs: with early stopping best.pth and the state file are the best epoch's (logged); without,
    best.pth is the last state file unless it exists."""
    if early:
        best, stopped = _best_epoch(history, patience)
        _sync_best(p, history, patience)
        if _checkpoint_steps(p['state_file']) != history[best]['steps']:
            # what continues this run (e.g. bench/learning.py's offline-only control) starts where prepare does
            atomic_copy(p['best_state_file'], p['state_file'])
        logger.info('train-offline: %s after epoch %d; best.pth = epoch %d (val loss %.4f, step %d), the state '
                    'file too', 'early stop' if stopped else 'max epochs reached', len(history),
                    history[best]['epoch'], history[best]['val_loss'], history[best]['steps'])
    elif not os.path.exists(p['best_state_file']):
        atomic_copy(p['state_file'], p['best_state_file'])


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
    cfg = typed(config)
    state_file = cfg.control.state_file
    if force or not os.path.exists(state_file):
        state = load_checkpoint(best)
        # the offline best was measured against RulebaseBots; online test play is against the baseline
        state['best_perf'] = dict(INITIAL_BEST_PERF)
        atomic_torch_save(state, state_file)
        written.append(state_file)
    slots = (cfg.baseline.train, cfg.baseline.test) if cfg.baseline is not None else ()
    for target in [slot.state_file for slot in slots if slot is not None]:
        if target and target not in written and (force or not os.path.exists(target)):
            atomic_copy(best, target)
            written.append(target)
    logger.info('prepare: wrote %s', written or 'nothing (all targets exist; --force to overwrite)')
    return written


# ---------------------------------------------------------------------------- driver

def run_steps(config, steps, *, force=False, progress=True, config_path=None):
    """Run the named steps in order; returns ``{step: seconds}``. ``train-grp`` is followed by ``check_grp``
    (the reward choice, written into ``config_path`` when given)."""
    from contextlib import nullcontext

    from tqdm.contrib.logging import logging_redirect_tqdm

    timings = {}
    # a log line while a bar is drawn goes above the bar (tqdm.write), not into it
    with logging_redirect_tqdm() if progress else nullcontext():
        for step in steps:
            start = time.monotonic()
            logger.info('=== bootstrap %s', step)
            if step == 'gen-logs':
                gen_logs(config, progress=progress)
            elif step == 'train-grp':
                train_grp(config, progress=progress)
                check_grp(config, config_path)
            elif step == 'train-offline':
                train_offline(config, progress=progress)
            elif step == 'prepare':
                prepare(config, force=force)
            else:
                raise BootstrapError(f'unknown step {step!r}; one of {STEPS} or all')
            timings[step] = time.monotonic() - start
    return timings


def main(argv=None):
    """``python -m mortal.tools.bootstrap STEP [-c PATH] [--force] [--no-progress]``; returns the exit status (2: config
    error, 1: a failed step)."""
    from mortal import entry
    from mortal.config import TRAIN_SECTIONS, resolve_path

    parser = entry.parser('Bootstrap a model from rule-based play ([bootstrap] table).',
                          prog='python -m mortal.tools.bootstrap')
    parser.add_argument('step', choices=STEPS + ('all',))
    parser.add_argument('--force', action='store_true', help='prepare: overwrite existing online checkpoints')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    args = entry.start(parser, argv)
    config_path = resolve_path(args.config, args.overrides)
    try:
        config = entry.load_config(args, TRAIN_SECTIONS + ('grp.control', 'grp.dataset', 'grp.optim'))
        bootstrap_config(config, path=config_path)
    except (ConfigError, BootstrapError) as e:
        return entry.error(e)
    entry.check_devices(config, entry.TRAIN_DEVICES + entry.GRP_DEVICES)
    steps = STEPS if args.step == 'all' else (args.step,)
    try:
        timings = run_steps(config, steps, force=args.force, progress=not args.no_progress, config_path=config_path)
    except BootstrapError as e:
        return entry.error(e, 1)
    for step, secs in timings.items():
        print(f'{step}: {secs:.0f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
