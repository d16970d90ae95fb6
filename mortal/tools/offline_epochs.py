"""Bootstrap step 3, ``train-offline``: offline epochs of ``mortal.train.Trainer`` on the bootstrap's logs,
with early stopping on the val logs' loss (docs/operations.md)."""

import copy
import json
import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

from mortal.config import put, typed
from mortal.tools.bootstrap_layout import BootstrapError, bootstrap_config, offline_paths, train_glob, val_logs
from mortal.util.fsutil import atomic_copy, atomic_write_bytes, empty_dir

logger = logging.getLogger('mortal.tools.bootstrap')  # one logger for every bootstrap step


def offline_config(config):
    """``config`` for the offline run: ``online = false``, the bootstrap's logs, outputs under ``work_dir``."""
    boot = bootstrap_config(config)
    p = offline_paths(boot)
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
        'dataset.globs': [train_glob(boot)],
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
    """Test play against three RulebaseBots: ``test_play(seed_count, mortal, dqn, device)`` -> ``Stat``."""

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
    """``(mean loss per sample, samples)`` of one eval pass over ``files``; BootstrapError without samples."""
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


def _epoch_trainer_class():
    from collections import Counter

    from mortal.train import Trainer

    class EpochTrainer(Trainer):
        """A ``Trainer`` whose ``take_epoch_loss(batches)`` gives the mean loss since the last call."""

        def __init__(self, *args, progress=True, **kwargs):
            self.progress = progress
            self.epoch_bar = None
            self.epoch_sums = None  # the reset_stats() in Trainer.__init__ has nothing to add
            super().__init__(*args, **kwargs)
            self.epoch_sums = Counter()

        def _progress_bar(self):
            return self.epoch_bar

        def log_total_steps(self, tested=True):
            if self.epoch_bar is None:  # the epoch's bar counts the steps: no line per save beside it
                super().log_total_steps(tested)

        def train_epoch(self, label='offline', total=None):
            """``Trainer.train_epoch`` under one bar; returns the batches trained."""
            if not self.progress:
                return super().train_epoch()
            from tqdm import tqdm
            with tqdm(desc=label, total=total, unit='batch', dynamic_ncols=True, ascii=True) as bar:
                # the trainer closes its bar at every save: this one goes on until the epoch ends
                self.epoch_bar = SimpleNamespace(update=bar.update, close=lambda: None)
                try:
                    return super().train_epoch()
                finally:
                    self.epoch_bar = None

        def reset_stats(self):
            if self.epoch_sums is not None:
                self.epoch_sums.update(self.stats)  # a Counter adds the values
            super().reset_stats()

        def take_epoch_loss(self, batches):
            self.reset_stats()  # the tail since the last save joins the sums (and leaves the next save's mean)
            sums, self.epoch_sums = self.epoch_sums, Counter()
            w = self.loss_weights
            cql = w.cql * sums['cql_loss'] if w.with_cql else 0.0
            return (sums['dqn_loss'] + w.next_rank * sums['next_rank_loss'] + cql) / max(batches, 1)

    return EpochTrainer


def read_history(path):
    """``[{epoch, steps, batches, train_loss, val_loss}]`` of ``epochs.json``, [] for none."""
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
    # best.pth must be the best recorded epoch's: a stop between an epoch's record and its copy left it in the
    # state file, copied here
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
    """Step 3; returns the path of ``best.pth`` (resumable); BootstrapError for what it cannot run."""
    boot = bootstrap_config(config)
    p = offline_paths(boot)
    if os.path.exists(p['done']) and os.path.exists(p['best_state_file']):
        logger.info('train-offline: finished before (%s), skipped', p['done'])
        return p['best_state_file']
    typed_config = typed(config)
    reward, grp_file = typed_config.env.reward, typed_config.grp.state_file
    if reward == 'grp' and not os.path.exists(grp_file):
        raise BootstrapError(f'train-offline needs the GRP ({grp_file}): run train-grp first')
    max_epochs, patience = boot.offline_max_epochs, boot.offline_patience
    early = max_epochs > 1
    val_files = val_logs(boot)
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
    _keep_best_epoch(p, history, patience, early, max_epochs)
    Path(p['done']).write_text(f'steps {trainer.steps}\nepochs {len(history)}\n')
    logger.info('train-offline: %d steps in %.0f s -> %s', trainer.steps, time.monotonic() - start,
                p['best_state_file'])
    return p['best_state_file']


def _offline_epoch(trainer, history, p, val_files, max_epochs, patience) -> None:
    # train, save the tail, validate, record (epochs.json, TensorBoard, log); a new best epoch to best.pth
    epoch = len(history) + 1
    # every epoch trains the same full batches of the same logs: the last one's count is this one's total
    total = history[-1].get('batches') if history else None
    batches = trainer.train_epoch(f'offline epoch {epoch}/{max_epochs}', total=total)
    if trainer.steps == 0:
        raise BootstrapError(f"train-offline: not one full batch of {trainer.batch_size} samples "
                             'in the bootstrap logs; generate more games or lower [control] batch_size')
    if trainer.steps % trainer.save_every:
        trainer.save()  # the epoch's tail after the last save_every
    train_loss = trainer.take_epoch_loss(batches)
    val_loss, val_samples = validation_loss(trainer, val_files) if val_files else (None, None)
    history.append({'epoch': epoch, 'steps': trainer.steps, 'batches': batches, 'train_loss': train_loss,
                    'val_loss': val_loss})
    atomic_write_bytes(json.dumps(history, indent=1).encode(), p['history'])
    trainer.writer.add_scalar('bootstrap/train_loss', train_loss, epoch)
    if val_loss is None:
        trainer.writer.flush()
        logger.info('train-offline: epoch %d: %d steps, train loss %.4f (no val logs)', epoch,
                    trainer.steps, train_loss)
        return
    trainer.writer.add_scalar('bootstrap/val_loss', val_loss, epoch)
    trainer.writer.flush()
    best, _ = _best_epoch(history, patience)
    logger.info('train-offline: epoch %d/%d: %d steps, train loss %.4f, val loss %.4f on %s samples '
                '(best %.4f at epoch %d)', epoch, max_epochs, trainer.steps, train_loss, val_loss,
                f'{val_samples:,}', history[best]['val_loss'], history[best]['epoch'])
    if max_epochs > 1 and best == len(history) - 1:
        atomic_copy(p['state_file'], p['best_state_file'])


def _keep_best_epoch(p, history, patience, early, max_epochs) -> None:
    # early stopping: best.pth and the state file are the best epoch's; else best.pth is the last unless it exists
    if early:
        best, stopped = _best_epoch(history, patience)
        _sync_best(p, history, patience)
        if _checkpoint_steps(p['state_file']) != history[best]['steps']:
            # what continues this run (e.g. bench/learning.py's offline-only control) starts where prepare does
            atomic_copy(p['best_state_file'], p['state_file'])
        why = 'early stop' if stopped and len(history) < max_epochs else 'max epochs reached'  # patience can end at the limit
        logger.info('train-offline: %s after epoch %d; best.pth = epoch %d (val loss %.4f, step %d), the state '
                    'file too', why, len(history),
                    history[best]['epoch'], history[best]['val_loss'], history[best]['steps'])
    elif not os.path.exists(p['best_state_file']):
        atomic_copy(p['state_file'], p['best_state_file'])
