"""The learner's save/test cycle: what a ``Trainer`` does every ``save_every`` steps, and its progress line.

``SaveCycle`` is a part of ``mortal.train.Trainer`` (a mixin, as ``mortal.learning.learner_checkpoint`` and
``mortal.learning.server_traffic``, so that ``trainer.on_save()`` and ``trainer.test_play()`` stay the trainer's own
methods). At each save it averages the loss sums over the ranks and writes them to TensorBoard with the learning
rate, the exploration factors (online) and the instruments (``mortal.learning.diagnostics``), then saves the
checkpoint, submits the parameters when the save missed a submit, and every ``test_every`` steps test-plays
(``mortal.learning.guards``): online, that ends the learner (``TestPlayDone``), and its supervisor starts a fresh one.
Its lines are logged as ``mortal.train``, the trainer's logger.
"""

import logging

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)


class TestPlayDone(Exception):
    """Online learner finished a test play: the child exits 0 and the supervisor starts a fresh one."""


class SaveCycle:
    """The trainer's save/test cycle. The host (``mortal.train.Trainer``) provides ``online``, ``steps``,
    ``save_every``, ``submit_every``, ``test_every``, ``stats``, ``stat_batches`` and ``reset_stats()``,
    ``loss_weights``, ``offline_stream``, ``scheduler``, ``models``, ``ema``, ``device``, ``dist``, ``writer``,
    ``instruments``, ``guards``, ``test_player``, ``play_settings()``, ``save()``, ``submit_param()``, and the
    progress bar ``pb``."""

    def on_save(self) -> None:
        """Every ``save_every`` steps: TensorBoard, checkpoint, a missed submit, and test play when due (rank 0;
        the loss means are those of all ranks)."""
        self.stats = self.dist.average(self.stats)
        if not self.dist.is_main:
            self.reset_stats()
            return
        if self.pb is not None:
            self.pb.close()
            self.pb = None
        self._write_tensorboard()
        self.reset_stats()
        self.log_total_steps()

        self.save()
        if self.online and self.steps % self.submit_every != 0:
            self.submit_param(is_idle=False)
        if self.steps % self.test_every == 0:
            self.test_play()
        self.pb = self._progress_bar()

    def _write_tensorboard(self) -> None:
        """The means of the loss sums over the batches summed since the last write (``stat_batches``: ``save_every``,
        or fewer when the learner resumed from a step between two saves; a term that is off is not written), the
        learning rate, the exploration factors (online) and the instruments."""
        n = max(self.stat_batches, 1)
        w = self.writer
        on = {'cql_loss': self.loss_weights.with_cql, 'anchor_loss': self.loss_weights.anchor > 0,
              'offline_cql_loss': self.offline_stream is not None,
              'counterfactual_loss': self.loss_weights.counterfactual > 0}
        for name in self.stats:  # in reset_stats' order; a term that is off is not written
            if on.get(name, True):
                w.add_scalar(f'loss/{name}', self.stats[name] / n, self.steps)
        w.add_scalar('hparam/lr', self.scheduler.get_last_lr()[0], self.steps)
        if self.online:
            settings = self.play_settings()
            w.add_scalar('hparam/epsilon_factor', settings['epsilon_factor'], self.steps)
            w.add_scalar('hparam/temp_factor', settings['temp_factor'], self.steps)
        self.instruments.write(w, self.steps, trained=self.models, ema=self.ema, device=self.device)
        w.flush()

    def steps_to_next_test(self):
        """Steps left until the next test play (0 right at one), as Mortal's progress line; None when this
        trainer never test-plays (its test player has ``enabled = False``, as the offline bootstrap's without
        ``[bootstrap] offline_test_every``)."""
        if not getattr(self.test_player, 'enabled', True):
            return None
        return (self.test_every - self.steps % self.test_every) % self.test_every

    def log_total_steps(self) -> None:
        """Mortal's ``total steps: N (~steps to the next test play)`` line; without the countdown when there is
        no test play."""
        to_test = self.steps_to_next_test()
        if to_test is None:
            logger.info('total steps: %s', f'{self.steps:,}')
        else:
            logger.info('total steps: %s (~%s)', f'{self.steps:,}', f'{to_test:,}')

    def test_play(self) -> None:
        """Test play, best.pth and (online) the long-run guards (``mortal.learning.guards.Guards.test_play``);
        online, then TestPlayDone: the learner exits and its supervisor starts a fresh one."""
        self.guards.test_play()
        if self.online:
            raise TestPlayDone()

    def _progress_bar(self):
        if not self.dist.is_main:
            return None
        from tqdm.auto import tqdm
        return tqdm(total=self.save_every, desc='TRAIN', initial=self.steps % self.save_every, unit='batch',
                    dynamic_ncols=True, ascii=True)
