"""Schedules of the learning rate, ε and T against trainer steps (``[schedule.lr]``, ``[schedule.epsilon]``,
``[schedule.temp]``).

Each is a factor on the configured value: on ``[optim.scheduler]``'s learning rate (which keeps Mortal's warm-up and
cosine shape), and on each ``[train_play.<profile>]``'s ``boltzmann_epsilon`` and ``boltzmann_temp``. The trainer
evaluates the ε and T factors at its step count and sends them to the clients with its parameters
(``submit_param``), so a client far away follows the trainer without reading its steps. Kinds:

- ``'constant'``: 1 (Mortal's behaviour, the default).
- ``'inverse'``: ``1 / (1 + rate * steps)``, e.g. ``rate = 1e-7`` for the ``epsilon / (1 + steps * 1e-7)`` that
  Mortal users apply by hand.
- ``'cosine'``: from 1 at step 0 to ``final`` at ``max_steps`` along half a cosine, then ``final``.
"""

from __future__ import annotations

import math
from typing import Mapping

from mortal.config import SCHEDULE_KINDS


def schedule_factor(table: Mapping, steps: int) -> float:
    """The factor of the ``[schedule.*]`` table ``table`` (keys kind, rate, final, max_steps) at trainer step
    ``steps`` (>= 0). Raises ValueError for an unknown kind, or 'cosine' without max_steps > 0."""
    kind = table.get('kind', 'constant')
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f'schedule kind must be one of {SCHEDULE_KINDS}, got {kind!r}')
    steps = max(0, int(steps))
    if kind == 'inverse':
        return 1.0 / (1.0 + table.get('rate', 0.0) * steps)
    if kind == 'cosine':
        final, span = table.get('final', 0.0), table.get('max_steps', 0)
        if span <= 0:
            raise ValueError("a 'cosine' schedule needs max_steps > 0")
        if steps >= span:
            return final
        return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * steps / span))
    return 1.0
