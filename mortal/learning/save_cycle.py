"""The helpers of the learner's save/test cycle (``mortal.train.Trainer.on_save``), and its progress line."""

import logging

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)


class TestPlayDone(Exception):
    """Online learner finished a test play: the child exits 0 and the supervisor starts a fresh one."""


def write_scalars(writer, steps: int, stats: dict, batches: int, *, loss_weights, offline_mix: bool, lr: float,
                  settings, instruments, trained, device) -> None:
    """Write one save's TensorBoard scalars at ``steps`` and flush: ``loss/<name>`` means over ``batches``
    (terms that are off are not written), ``hparam/lr``, online the exploration factor, then the instruments."""
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
    """Steps until the next test play; None when ``test_player`` never plays.

    At a multiple of ``test_every``: 0 while that step's test play is to come (``tested`` False), else
    ``test_every``."""
    if not getattr(test_player, 'enabled', True):
        return None
    left = (test_every - steps % test_every) % test_every
    return test_every if left == 0 and tested else left


def log_total_steps(steps: int, to_test) -> None:
    """Mortal's ``total steps: N (~steps to the next test play)`` line (no countdown if ``to_test`` is None)."""
    if to_test is None:
        logger.info('total steps: %s', f'{steps:,}')
    else:
        logger.info('total steps: %s (~%s)', f'{steps:,}', f'{to_test:,}')


def progress_bar(save_every: int, steps: int):
    """Mortal's ``TRAIN`` bar over the ``save_every`` batches of one save cycle, starting where ``steps`` is in it."""
    from tqdm.auto import tqdm
    return tqdm(total=save_every, desc='TRAIN', initial=steps % save_every, unit='batch', dynamic_ncols=True,
                ascii=True)
