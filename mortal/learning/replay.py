"""The recent-replay window of the online learner (``[online] replay_ratio``, ``replay_window``).

Mortal trains each online sample once, as it is drained. The learner waits for self-play most of the time, so at
a replay ratio ``k > 1`` each fresh online batch is followed by ``k - 1`` more gradient steps on batches drawn
from the last ``replay_window`` online batches: the update-to-data ratio of RLPD (Ball et al. 2023, arXiv
2302.02948, which samples its online buffer uniformly at ratios up to 20). Each step still gets its own rows of
the offline mix (``[online] offline_batch_size``), appended in ``train_batch``.

A replayed batch is ``batch_size`` rows drawn uniformly without replacement from all rows in the window (not
whole batches, so that two replays of the same batch are not the same gradient), except while the window holds
a single batch (the first fresh batch after each learner start, every ``test_every`` steps): its ``k - 1`` replays
are that batch's rows again, the same gradient ``k`` times. The window holds the loader's
CPU tensors (pinned on CUDA), never the device copies: a packed observation is ``row_bytes`` (12.6 / 13.9 / 15.3 KB
at versions 2 / 3 / 4), twice that with ``[online] n_step`` (its ``next_obs``), so the default window of 64 batches of
512 rows holds about 0.45 GB at version 3 (0.9 GB with n-step columns).
"""

from __future__ import annotations

from collections import deque

import torch


class ReplayWindow:
    """The last ``window`` online batches and uniform row draws from them.

    Args:
        window: batches kept (>= 1); the oldest is dropped when a new one is added.
        generator: a ``torch.Generator`` for the draws (tests); the global one when None.
    Raises ValueError for ``window < 1``.
    """

    def __init__(self, window: int, generator: torch.Generator | None = None):
        if window < 1:
            raise ValueError(f'replay_window must be >= 1, got {window}')
        self.batches = deque(maxlen=window)
        self.generator = generator

    def __len__(self) -> int:
        """Rows in the window."""
        return sum(b[0].shape[0] for b in self.batches)

    def add(self, batch: tuple) -> None:
        """Keep ``batch``, a tuple of CPU tensors sharing the first dimension (the loader's columns, without the
        claim ids); the tuple must have the same columns as the batches already kept. Raises ValueError
        otherwise."""
        if self.batches and len(batch) != len(self.batches[0]):
            raise ValueError(f'a batch of {len(batch)} columns after batches of {len(self.batches[0])}')
        self.batches.append(tuple(batch))

    def sample(self, size: int) -> tuple:
        """``size`` rows drawn uniformly without replacement from the window's rows, as a batch (a tuple of
        tensors like the ones added). Raises ValueError when the window holds fewer than ``size`` rows."""
        total = len(self)
        if total < size:
            raise ValueError(f'the replay window holds {total} rows, fewer than a batch of {size}')
        picks = torch.randperm(total, generator=self.generator)[:size].sort().values
        # rows of the window in order, batch by batch: each batch gives the picks that fall in its range
        parts, start = [], 0
        for batch in self.batches:
            end = start + batch[0].shape[0]
            lo, hi = torch.searchsorted(picks, torch.tensor([start, end]))
            if hi > lo:
                rows = picks[lo:hi] - start
                parts.append(tuple(c[rows] for c in batch))
            start = end
        return tuple(torch.cat(cols, dim=0) for cols in zip(*parts))
