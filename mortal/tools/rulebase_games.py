"""Bootstrap step 1, ``gen-logs``: hanchan of four exploring ``RulebaseBot`` seats as gzip mjai logs."""

import logging
import os
import random
import time
from pathlib import Path

from mortal.config import typed
from mortal.entry import drop_rust_backtrace
from mortal.tools.bootstrap_layout import BootstrapError, bootstrap_config, offline_paths

logger = logging.getLogger('mortal.tools.bootstrap')  # one logger for every bootstrap step

SPLITS = 'abcd'


def _exploring_rulebase_class():
    from mjai.bot.rulebase import RulebaseBot

    class ExploringRulebaseBot(RulebaseBot):
        """``RulebaseBot`` discarding at random with probability ``epsilon``."""

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
    """Worker: one deal's seat rotations; returns ``(nonce, substitutions, error or None)``, never raises."""
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
        # The arena sends each bot a start_game before every start_kyoku: mjai's Bot keeps events from start_game
        # on, and an earlier kyoku's meld breaks find_improving_tiles (tests/test_teacher_whole.py).
        OneVsThree(disable_progress_bar=True, log_dir=log_dir).py_vs_py(
            agents[0], agents[1], seed_start=(nonce, key), seed_count=1)
        if epsilon == 0:  # identical bots, identical deal: rotations b-d are copies of a
            for split in SPLITS[1:]:
                Path(log_dir, f'{nonce}_{key}_{split}.json.gz').unlink(missing_ok=True)
        return nonce, sum(a.substitutions for a in agents), None
    except Exception as e:  # reported by the parent; the set is retried on the next run
        return nonce, 0, f'{type(e).__name__}: {e}'


def plan_sets(log_dir, games, key, epsilon):
    """``(todo, done)`` nonces of the deals needed for ``games`` hanchan, by whether their logs exist."""
    per_set = 4 if epsilon > 0 else 1
    todo, done = [], []
    for nonce in range(-(-games // per_set)):
        on_disk = all(Path(log_dir, f'{nonce}_{key}_{s}.json.gz').is_file() for s in SPLITS[:per_set])
        (done if on_disk else todo).append(nonce)
    return todo, done


def gen_logs(config, *, progress=True):
    """Step 1; returns the new logs written. ``BootstrapError`` when some deals failed (rerun to retry)."""
    import multiprocessing as mp
    from tqdm import tqdm
    boot = bootstrap_config(config)
    eps = boot.epsilon
    workers = boot.workers or os.cpu_count() or 1
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
    # tqdm's default lock, a multiprocessing semaphore, is reported leaked at exit; one thread draws the bar
    import threading
    tqdm.set_lock(threading.RLock())
    ctx = mp.get_context('forkserver')
    start = time.monotonic()
    with ctx.Pool(min(workers, len(tasks))) as pool, \
            tqdm(total=len(tasks) * per_set, unit='game', desc='gen-logs', disable=not progress) as bar:
        for finished, (nonce, subs, err) in enumerate(pool.imap_unordered(play_set, tasks), 1):
            substitutions += subs
            if err:
                failures.append((nonce, err))
                logger.error('gen-logs: deal %d failed: %s', nonce, err)
            else:
                bar.update(per_set)
            if not progress and (finished % max(1, len(tasks) // 10) == 0 or finished == len(tasks)):
                logger.info('gen-logs: %d/%d deals played (%.0f s)', finished, len(tasks),
                            time.monotonic() - start)
        # workers that exit, unlike terminated ones, release their tqdm semaphore (else resource_tracker warns)
        pool.close()
        pool.join()
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
                 offline_paths(bootstrap_config(config))['file_index']):
        if path and os.path.exists(path):
            os.remove(path)
