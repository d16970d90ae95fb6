"""The learner's test play and best.pth, the rollback on degradation (``[guard]``) and the baseline's sync with
the server (docs/operations.md)."""

from __future__ import annotations

import logging
import math
import os
from datetime import datetime
from glob import glob, escape as glob_escape
from os import path

from mortal.learning import gate
from mortal.learning.optimizer import load_optimizer_state
from mortal.net import wire
from mortal.model.checkpoint import (INITIAL_BEST_PERF, CheckpointError, check_fits_config, first_non_finite,
                                     load_checkpoint, load_model_pair, read_baseline)
from mortal.util.fsutil import atomic_copy, empty_dir, stamped_name
from mortal.play.player import TEST_SEED
from mortal.stat import DISPLAY_PTS  # test-play avg pt: display and Mortal's best.pth rule, never a training signal

logger = logging.getLogger('mortal.train')  # the learner's lines (log format)
ROLLBACKS_KEPT = 5  # replaced state files kept as <state_file>.<time>.rollback (the oldest removed)

# The checkpoint's extra entry 'guard' (docs/operations.md): the state of the long-run guards.
INITIAL_GUARD = {'worse_streak': 0, 'rollbacks': 0, 'lr_scale': 1.0, 'epsilon_scale': 1.0, 'baseline_version': 0,
                 'test_plays': 0, 'baseline_digest': ''}


class Diverged(RuntimeError):
    """The weights hold NaN or inf at a save or a submit: nothing is saved or sent, and the learner exits with
    status 1."""


def check_finite(models: dict, steps: int, saved_steps, state_file: str) -> None:
    """Diverged when a weight of ``models`` (``{checkpoint entry: module}``) holds NaN or inf, before it is saved or
    sent to the clients; ``saved_steps``: the step ``state_file`` holds (None: not written)."""
    if (bad := first_non_finite({e: m.state_dict() for e, m in models.items()})) is not None:
        kept = 'not written' if saved_steps is None else f'left at step {saved_steps:,}'
        raise Diverged(f'training diverged: {bad} holds NaN or inf at step {steps:,}; {state_file} is {kept}; '
                       f'lower [optim] lr, or restore a checkpoint')


def is_better(avg_pt: float, avg_rank: float, best_perf: dict) -> bool:
    """Mortal's best.pth rule: avg pt not worse AND avg rank not worse than the best so far."""
    return avg_pt >= best_perf['avg_pt'] and avg_rank <= best_perf['avg_rank']


def _pt_and_rank(units: dict) -> tuple:
    """``(avg_pt, avg_rank)`` over every game of ``{nonce: [ranks 1-4]}``, pt by ``DISPLAY_PTS``."""
    ranks = [r for rs in units.values() for r in rs]
    return sum(DISPLAY_PTS[r - 1] for r in ranks) / len(ranks), sum(ranks) / len(ranks)


class Guards:
    """Test play, best.pth and the long-run guards of the learner ``trainer``; reads ``[test_play]`` and ``[guard]``."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.cfg = cfg = trainer.cfg.test_play
        self.sprt = gate.Sprt(cfg.sprt_delta, cfg.sprt_alpha, cfg.sprt_beta) if cfg.best_rule == 'sprt' else None

    def test_play(self) -> None:
        """Play ``[test_play] games`` against ``[baseline.test]``, judge (``best_rule`` with ``play_units``, else
        Mortal's rule), maybe replace best.pth, then (online) the guards; the models go back to training mode."""
        t = self.trainer
        # Nothing to compare with yet: the first test play makes best.pth, as Mortal's does.
        first = (not path.exists(t.best_state_file) and not t.best_perf.get('deals')
                 and t.best_perf.get('avg_rank', 4.0) >= INITIAL_BEST_PERF['avg_rank'])
        stat, verdict = self._play(first)
        t.mortal.train()
        t.dqn.train()
        avg_pt = stat.avg_pt(DISPLAY_PTS)
        avg_rank = stat.avg_rank
        # with nothing to compare with, better (logged below)
        better = first or (verdict.better if verdict is not None else is_better(avg_pt, avg_rank, t.best_perf))
        too_few = None
        if better and not first and verdict is not None and len(verdict.units) < max(self.cfg.min_deals, 1):
            better, too_few = False, len(verdict.units)
        past_best = dict(t.best_perf)
        if better:
            t.best_perf = {'avg_pt': avg_pt, 'avg_rank': avg_rank}
            if verdict is not None:
                t.best_perf['deals'] = {int(n): [int(r) for r in rs] for n, rs in verdict.units.items()}
        self._write_result(stat, verdict, first, avg_pt, avg_rank)
        if too_few is not None:
            logger.info('best.pth not replaced: this test play has %d deals, fewer than [test_play] min_deals %d '
                        '(a CI over so few deals is noise)', too_few, self.cfg.min_deals)
        if better:
            t.save()  # it records the new best_perf; best.pth is a copy of it (the played weights)
            logger.info('a new record has been made, pt: %.4f -> %.4f, rank: %.4f -> %.4f, saving to %s',
                        past_best['avg_pt'], avg_pt, past_best['avg_rank'], avg_rank, t.best_state_file)
            atomic_copy(t.state_file, t.best_state_file)
        if verdict is not None and self.cfg.fresh_deals:
            t.guard['test_plays'] += 1
            t.save()  # the next test play meets the next deals, also after this learner's restart
        if t.online and verdict is not None:
            self.run_guards(verdict, became_best=better)

    def _play(self, first: bool) -> tuple:
        """``(stat, verdict)``; ``verdict`` None for a player without ``play_units``."""
        t, cfg = self.trainer, self.cfg
        mortal, dqn = t.played()
        deals = cfg.games // 4
        if not hasattr(t.test_player, 'play_units'):
            return t.test_player.test_play(deals, mortal, dqn, t.device), None
        t.test_player.begin()
        reference = gate.reference_of(t.best_perf)
        if cfg.fresh_deals and path.exists(t.best_state_file):
            reference = self._best_replay()
        # Mortal's fixed first nonce, or with fresh_deals the next unused block
        nonce = TEST_SEED[0] + (t.guard['test_plays'] * deals if cfg.fresh_deals else 0)
        verdict = gate.run_test_play(
            lambda first, count: t.test_player.play_units(first, count, mortal, dqn, t.device),
            nonce_start=nonce, deals=deals, reference=reference,
            rule='paired' if first and cfg.best_rule == 'sprt' else cfg.best_rule,  # a full record
            confidence=cfg.confidence, sprt=self.sprt, chunk_deals=cfg.sprt_chunk // 4,
            mortal_better=lambda units: is_better(*_pt_and_rank(units), t.best_perf))
        return t.test_player.stat(), verdict

    def _write_result(self, stat, verdict, first: bool, avg_pt: float, avg_rank: float) -> None:
        """The test play's log lines and TensorBoard values (the paired ones with a ``verdict``)."""
        t = self.trainer
        logger.info('avg rank: %.6f', avg_rank)
        logger.info('avg pt: %.6f', avg_pt)
        stat.write_tensorboard(t.writer, t.steps, DISPLAY_PTS)
        if verdict is not None:
            text = verdict.describe()
            if first:  # nothing to beat yet: a verdict word here contradicted the 'new record' line that follows
                text = text.rsplit(': ', 1)[0] + ': the first test play (no best.pth yet), so it becomes best.pth'
            logger.info('test play: %s', text)
            t.writer.add_scalar('test_play/paired_diff', verdict.diff, t.steps)
            if not math.isnan(verdict.ci):
                t.writer.add_scalar('test_play/paired_diff_ci', verdict.ci, t.steps)
            t.writer.add_scalar('test_play/games', verdict.games, t.steps)
            if verdict.llr is not None:
                t.writer.add_scalar('test_play/sprt_llr', verdict.llr, t.steps)
        t.writer.flush()

    def _best_replay(self):
        """``(first_nonce, count) -> units`` of best.pth on the challenger's deals (logs under ``<log_dir>_best``)."""
        t = self.trainer
        brain, dqn = (m.to(t.device) for m in load_model_pair(t.best_state_file)[:2])
        log_dir = path.normpath(t.test_player.log_dir) + '_best'
        empty_dir(log_dir)
        return lambda first, count: t.test_player.play_units(first, count, brain, dqn, t.device,
                                                             log_dir=log_dir, name='best')

    def run_guards(self, verdict, *, became_best: bool = False) -> None:
        """After an online test play: the degradation alarm; saves the checkpoint when the guards' state changed."""
        t = self.trainer
        before = dict(t.guard)
        g = t.cfg.guard
        t.guard['worse_streak'] = t.guard['worse_streak'] + 1 if verdict.worse else 0
        reasons = []
        if g.rollback_after and t.guard['worse_streak'] >= g.rollback_after:
            reasons.append(f"{t.guard['worse_streak']} test plays in a row significantly worse than best.pth "
                           f'(last: {verdict.describe()})')
        drift, q_gap = t.instruments.last.get('policy_drift'), t.instruments.last.get('q_gap')
        if became_best:  # the model just became best.pth: rolling back would restore itself
            drift = q_gap = None
        if g.max_policy_drift and drift is not None and drift > g.max_policy_drift:
            reasons.append(f"diag/policy_drift {drift:.3f} above [guard] max_policy_drift {g.max_policy_drift}")
        if g.min_q_gap and q_gap is not None and q_gap < g.min_q_gap:
            reasons.append(f"diag/q_gap {q_gap:.3f} below [guard] min_q_gap {g.min_q_gap}")
        if reasons:
            rollback(t, g, '; '.join(reasons))
        t.writer.add_scalar('guard/worse_streak', t.guard['worse_streak'], t.steps)
        if t.guard != before:
            t.save()


def rollback(t, g, reason: str) -> None:
    """Restore best.pth into the learner ``t`` and its ``state_file`` (steps, schedule, ``best_perf`` go on), the
    replaced file kept as ``<state_file>.<stamp>.rollback`` (``g``: ``[guard]``); lr and ε scaled. Only logged
    when best.pth is missing or does not fit."""
    models = ((t.mortal, 'mortal'), (t.dqn, 'current_dqn'), (t.aux_net, 'aux_net'))
    try:
        best = load_checkpoint(t.best_state_file, map_location=t.device)
        for model, entry in models:
            check_fits_config(model, best[entry], entry=entry, source=t.best_state_file,
                              ckpt_cfg=best.get('config'), cfg=t.cfg)
    except Exception as ex:  # missing, corrupt or foreign: the guard must never stop training
        logger.error('ROLLBACK not possible (%s): %s: %s', reason, type(ex).__name__, ex)
        return
    kept = _keep_replaced(t.state_file, ROLLBACKS_KEPT)
    for model, entry in models:
        model.load_state_dict(best[entry])
    try:
        if not best.get('optimizer'):
            raise ValueError('it has none')
        load_optimizer_state(t.optimizer, best['optimizer'])
    except Exception as ex:  # another optimizer layout: the weights still roll back, with fresh moments
        logger.warning('optimizer state of %s not restored (%s): starting it fresh', t.best_state_file, ex)
        t.optimizer.state.clear()
    t.optimizer.zero_grad(set_to_none=True)
    t.guard.update(rollbacks=t.guard['rollbacks'] + 1, worse_streak=0,
                   lr_scale=t.guard['lr_scale'] * g.lr_factor,
                   epsilon_scale=t.guard['epsilon_scale'] * g.epsilon_factor)
    t.scheduler.refresh()
    line = (f"ROLLBACK #{t.guard['rollbacks']} at step {t.steps}: {reason}; {t.state_file} restored "
            f"from {t.best_state_file} (its step {best.get('steps', '?')}), the replaced one kept as {kept}; "
            f"lr x{t.guard['lr_scale']:g}, epsilon x{t.guard['epsilon_scale']:g}")
    t.save()
    logger.warning('%s', line)
    t.writer.add_scalar('guard/rollbacks', t.guard['rollbacks'], t.steps)
    t.writer.add_text('guard/events', line, t.steps)


def _keep_replaced(state_file: str, keep: int) -> str:
    """Copy ``state_file`` to a new timestamped ``.rollback`` name; remove the oldest beyond ``keep``."""
    kept = stamped_name(state_file, datetime.now().strftime('%Y%m%d-%H%M%S'), '.rollback')
    atomic_copy(state_file, kept)
    old = sorted(glob(f'{glob_escape(state_file)}.*.rollback'), key=path.getmtime)
    for name in old[:-keep]:
        os.remove(name)
    return kept


def sync_baseline(t) -> None:
    """Submit ``[baseline.train] state_file`` to the server (new weights bump ``baseline_version``); a missing or
    unusable file, or a refusal, is logged and skipped (clients play their own file, as Mortal's)."""
    cfg = t.cfg.baseline
    baseline = cfg.train.state_file if cfg is not None and cfg.train is not None else None
    if not baseline:
        return
    try:
        mortal, dqn, arch = read_baseline(baseline)
    except (OSError, CheckpointError) as ex:
        logger.warning('baseline not submitted to the server (clients need their own file): %s', ex)
        return
    digest = wire.baseline_digest(mortal, dqn)
    if digest != t.guard['baseline_digest']:
        if t.guard['baseline_digest']:
            t.guard['baseline_version'] += 1
            logger.info('%s has changed since it was last submitted (rotated by hand?): baseline version %d',
                        baseline, t.guard['baseline_version'])
        t.guard['baseline_digest'] = digest
        if path.exists(t.state_file):
            t.save()  # the version survives a crash before the next save
    msg = {'type': 'submit_baseline', 'mortal': wire.pack_state_dict(mortal), 'dqn': wire.pack_state_dict(dqn),
           'arch': arch, 'baseline_version': t.guard['baseline_version'], 'baseline_digest': digest}
    try:
        wire.request_with_retry(t.server.remote, msg, sleep=t.server.sleep)
    except wire.RequestRefused as ex:  # e.g. an older server: clients keep their own files
        logger.warning('baseline not submitted to the server: %s', ex)
        return
    logger.info('baseline has been submitted (version %d, digest %s)', t.guard['baseline_version'],
                digest[:12])
