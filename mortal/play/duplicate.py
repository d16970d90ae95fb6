"""Duplicate 1-vs-3 scoring and the players of a 1v3 table (``mortal.one_vs_three``, ``mortal.play.evaluation``)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Iterable, Sequence

from mortal.stat import DISPLAY_PTS

logger = logging.getLogger('mortal.one_vs_three')  # build_side's lines keep the name of the 1v3 tool (log format)

SEED_START = 10000  # first nonce, as Mortal's one_vs_three.py
Z_95 = 1.959963984540054  # two-sided 95% normal quantile
SPLITS = 'abcd'  # log-name suffix = challenger seat 0-3


MIN_RELIABLE_SETS = 10  # duplicate sets (deals) below which a printed CI says it is unreliable


def unreliable_note(sets: int) -> str:
    """``'unreliable: N sets'`` when ``sets`` < ``MIN_RELIABLE_SETS`` (a normal CI over few sets is noise), else ''."""
    return f'unreliable: {sets} sets' if sets < MIN_RELIABLE_SETS else ''


@dataclasses.dataclass(frozen=True)
class DuplicateSummary:
    """Challenger's result over duplicate units; ``*_ci`` are 95% half-widths (``nan`` under 2 units)."""

    n_units: int
    n_games: int
    avg_rank: float
    avg_rank_ci: float
    avg_pt: float
    avg_pt_ci: float

    def __str__(self) -> str:
        note = unreliable_note(self.n_units)
        return (f'avg rank {self.avg_rank:.4f} ± {self.avg_rank_ci:.4f}, '
                f'avg pt {self.avg_pt:.3f} ± {self.avg_pt_ci:.3f} '
                f'(95% CI over {self.n_units} duplicate sets, {self.n_games} games{"; " + note if note else ""})')


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, Z_95 * sd / sqrt(n))`` with the sample sd; half-width ``nan`` when n < 2; ValueError if empty."""
    n = len(values)
    if n == 0:
        raise ValueError('no values')
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, Z_95 * math.sqrt(var / n)


def duplicate_ci(unit_ranks: Iterable[Sequence[int]]) -> DuplicateSummary:
    """Avg rank and avg pt (``DISPLAY_PTS``) with a normal 95% CI over duplicate units (``unit_ranks``: ranks 1-4
    per unit). ValueError: no units, an empty unit, or a rank outside 1-4."""
    rank_means, pt_means = [], []
    n_games = 0
    for unit in unit_ranks:
        unit = list(unit)
        if not unit:
            raise ValueError('a duplicate unit has no games')
        for r in unit:
            if r not in (1, 2, 3, 4):
                raise ValueError(f'rank must be 1-4, got {r!r}')
        n_games += len(unit)
        rank_means.append(sum(unit) / len(unit))
        pt_means.append(sum(DISPLAY_PTS[r - 1] for r in unit) / len(unit))
    if not rank_means:
        raise ValueError('no duplicate units')
    avg_rank, rank_ci = mean_ci(rank_means)
    avg_pt, pt_ci = mean_ci(pt_means)
    return DuplicateSummary(len(rank_means), n_games, avg_rank, rank_ci, avg_pt, pt_ci)


def complete_challenger_units(games: Iterable[tuple]) -> dict[int, list[int]]:
    """``{nonce: [4 ranks 1-4]}``: the challenger's 1-based ranks by nonce from ``OneVsThree.last_games`` tuples, of
    the complete deals only (a deal with a failed game drops whole); ValueError for a bad split."""
    out: dict[int, list[int]] = {}
    for nonce, _key, split, _scores, ranks in games:
        out.setdefault(int(nonce), []).append(int(ranks[SPLITS.index(split)]) + 1)
    return {n: r for n, r in out.items() if len(r) == 4}


def build_side(side, section: str):
    """An arena player from a typed ``[1v3.challenger]``/``[1v3.champion]``; ``CheckpointError``."""
    if side.type == 'rulebase':
        from mortal.play.agent import MjaiBotAgent
        return MjaiBotAgent(name=side.name)

    import torch
    from mortal.model.checkpoint import load_errors, load_model_pair
    from mortal.play.engine import MortalEngine
    with load_errors(f'[{section}] state_file', side.state_file):
        brain, dqn, version = load_model_pair(side.state_file)
    if side.enable_compile:
        brain.compile()
        dqn.compile()
    logger.info('[%s] %s: %s (version %d) on %s', section, side.name, side.state_file, version, side.device)
    return MortalEngine(
        brain,
        dqn,
        version=version,
        device=torch.device(side.device),
        stochastic_latent=side.stochastic_latent,
        enable_amp=side.enable_amp,
        enable_rule_based_agari_guard=side.enable_rule_based_agari_guard,
        name=side.name,
    )
