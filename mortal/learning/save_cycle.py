"""The helpers of the learner's save/test cycle (``mortal.train.Trainer.on_save``), and its progress line.

Every ``save_every`` steps the trainer averages the loss sums over the ranks and writes them to TensorBoard with the
learning rate, the exploration factor (online) and the instruments (``write_scalars``), saves the checkpoint,
submits the parameters when the save missed a submit, and every ``test_every`` steps test-plays
(``mortal.learning.guards``): online, that ends the learner (``TestPlayDone``), and its supervisor starts a fresh one.
Its lines are logged as ``mortal.train``, the trainer's logger.
"""

import logging

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)


class TestPlayDone(Exception):
    """Online learner finished a test play: the child exits 0 and the supervisor starts a fresh one."""


def write_scalars(writer, steps: int, stats: dict, batches: int, *, loss_weights, offline_mix: bool, lr: float,
                  settings, instruments, trained, device) -> None:
    """Write one save's TensorBoard scalars at ``steps`` and flush ``writer``: ``loss/<name>``, the mean of each
    loss sum of ``stats`` over ``batches`` (the batches summed since the last write: ``save_every``, or fewer after a
    resume between two saves; a term that is off, by ``loss_weights`` (``LossWeights``) or ``offline_mix`` (False: no
    ``[online] offline_batch_size``), is not written), ``hparam/lr`` = ``lr``, online the exploration factor of
    ``settings`` (``server_traffic.play_settings``; None offline), then ``instruments.write`` (``trained``: the
    models, ``device``)."""
    n = max(batches, 1)
    on = {'cql_loss': loss_weights.with_cql, 'anchor_loss': loss_weights.anchor > 0,
          'offline_cql_loss': offline_mix, 'counterfactual_loss': loss_weights.counterfactual > 0}
    for name in stats:  # in Trainer.reset_stats' order
        if on.get(name, True):
            writer.add_scalar(f'loss/{name}', stats[name] / n, steps)
    writer.add_scalar('hparam/lr', lr, steps)
    if settings is not None:
        writer.add_scalar('hparam/epsilon_factor', settings['epsilon_factor'], steps)
    instruments.write(writer, steps, trained=trained, device=device)
    writer.flush()


def steps_to_next_test(steps: int, test_every: int, test_player, *, tested: bool = True):
    """Steps left from ``steps`` until the next test play, for the progress line; None when ``test_player`` never
    plays (its ``enabled`` is False, as the offline bootstrap's without ``[bootstrap] offline_test_every``). At a
    multiple of ``test_every`` it is 0 when that step's test play is still to come (``tested`` False: the line
    before it), else ``test_every`` (a learner starting there has had that test play)."""
    if not getattr(test_player, 'enabled', True):
        return None
    left = (test_every - steps % test_every) % test_every
    return test_every if left == 0 and tested else left


def log_total_steps(steps: int, to_test) -> None:
    """Mortal's ``total steps: N (~steps to the next test play)`` line; without the countdown when ``to_test`` is
    None (no test play)."""
    if to_test is None:
        logger.info('total steps: %s', f'{steps:,}')
    else:
        logger.info('total steps: %s (~%s)', f'{steps:,}', f'{to_test:,}')


def progress_bar(save_every: int, steps: int):
    """Mortal's ``TRAIN`` bar over the ``save_every`` batches of one save cycle, starting where ``steps`` is in it."""
    from tqdm.auto import tqdm
    return tqdm(total=save_every, desc='TRAIN', initial=steps % save_every, unit='batch', dynamic_ncols=True,
                ascii=True)
