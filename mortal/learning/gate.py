"""Test play's statistical gates (docs/learning.md): per duplicate deal, ``d_i`` = the challenger's mean rank minus
best.pth's record (or its avg rank; 2.5 for the baseline). ``[test_play] best_rule``: ``paired`` (CI below 0),
``sprt`` (Wald's SPRT), ``mortal``. A CI above 0 is *significantly worse* (``[guard] rollback_after``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Callable, Mapping, Optional

from mortal.play.duplicate import unreliable_note

BASELINE_RANK = 2.5  # the baseline against 3 copies of itself: each rank once per deal
VARIANCE_FLOOR = 1e-9  # identical players give identical deals: a zero variance must not divide


def z_value(confidence: float) -> float:
    """The two-sided normal quantile of ``confidence`` (0.95 -> 1.960). Raises ValueError outside (0, 1)."""
    if not 0 < confidence < 1:
        raise ValueError(f'confidence must be within (0, 1), got {confidence}')
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def unit_means(units: Mapping[int, list]) -> dict:
    """``{nonce: mean rank}`` of ``{nonce: [ranks 1-4 of the challenger's games of that deal]}``."""
    return {int(n): sum(r) / len(r) for n, r in units.items() if r}


def paired_differences(units: Mapping[int, list], reference) -> list:
    """Per-deal ``mean rank of units - mean rank of reference`` in nonce order; ``reference``: ``{nonce: [ranks]}``
    (paired on common deals; none in common: its mean for every deal) or a mean rank for every deal."""
    mine = unit_means(units)
    if not isinstance(reference, (int, float)):
        ref = unit_means(reference)
        common = [n for n in sorted(mine) if n in ref]
        if common:
            return [mine[n] - ref[n] for n in common]
        reference = math.fsum(ref.values()) / len(ref) if ref else BASELINE_RANK
    return [mine[n] - float(reference) for n in sorted(mine)]


def mean_and_ci(values, confidence: float = 0.95) -> tuple:
    """``(mean, half-width)`` of the ``confidence`` normal CI (sample sd); nan when too few values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, z_value(confidence) * math.sqrt(var / n)


class Sprt:
    """Wald's SPRT on per-deal paired rank differences, Gaussian with the variance estimated from the data.

    H0: not better; H1: better by ``delta`` avg rank. ``LLR = delta / s2 * (S - n * delta / 2)`` with S the sum of
    ``-d_i``; bounds ``log((1 - beta) / alpha)`` and ``log(beta / (1 - alpha))``. Raises ValueError for delta <= 0 or
    alpha/beta outside (0, 0.5)."""

    def __init__(self, delta: float = 0.05, alpha: float = 0.05, beta: float = 0.05, min_deals: int = 8):
        if delta <= 0:
            raise ValueError(f'sprt_delta must be > 0, got {delta}')
        for name, v in (('sprt_alpha', alpha), ('sprt_beta', beta)):
            if not 0 < v < 0.5:
                raise ValueError(f'{name} must be within (0, 0.5), got {v}')
        self.delta, self.alpha, self.beta, self.min_deals = delta, alpha, beta, min_deals
        self.lower = math.log(beta / (1 - alpha))
        self.upper = math.log((1 - beta) / alpha)

    def llr(self, diffs) -> float:
        """The log-likelihood ratio of H1 against H0 for ``diffs``; 0 for fewer than 2."""
        n = len(diffs)
        if n < 2:
            return 0.0
        gains = [-d for d in diffs]
        mean = math.fsum(gains) / n
        var = max(math.fsum((g - mean) ** 2 for g in gains) / (n - 1), VARIANCE_FLOOR)
        return self.delta / var * (math.fsum(gains) - n * self.delta / 2)

    def verdict(self, diffs) -> Optional[str]:
        """``'better'`` (H1), ``'not better'`` (H0) or None (go on); None before ``min_deals`` differences."""
        if len(diffs) < self.min_deals:
            return None
        value = self.llr(diffs)
        if value >= self.upper:
            return 'better'
        if value <= self.lower:
            return 'not better'
        return None


@dataclass
class Verdict:
    """A test play against the reference: ``diff``/``ci`` (mean paired difference, CI half-width), ``better``
    (replace best.pth), ``worse`` (CI above 0, or after an early SPRT stop the mirrored SPRT says so)."""

    rule: str
    games: int
    diff: float
    ci: float
    better: bool
    worse: bool
    sprt: Optional[str] = None
    llr: Optional[float] = None
    decided_games: Optional[int] = None
    units: dict = field(default_factory=dict, repr=False)
    against: str = 'best.pth'

    def describe(self) -> str:
        """One log line, e.g. ``paired diff to best.pth -0.062 ± 0.041 (1600 games): better``."""
        ci = 'n/a' if math.isnan(self.ci) else f'{self.ci:.3f}'
        note = unreliable_note(len(self.units))
        note = f'; {note}' if note else ''
        text = f'paired diff to {self.against} {self.diff:+.3f} ± {ci} ({self.games} games{note})'
        if self.sprt is not None:
            text += f', SPRT {self.sprt} (LLR {self.llr:+.2f}'
            text += f', decided after {self.decided_games} games)' if self.decided_games else ')'
        verdict = 'better' if self.better else 'significantly worse' if self.worse else 'not better'
        return f'{text}: {verdict}'


def reference_of(best_perf: Mapping):
    """The per-deal record ``best_perf['deals']`` when there is one, else the recorded avg rank."""
    deals = best_perf.get('deals')
    if deals:
        return {int(n): list(r) for n, r in deals.items()}
    rank = best_perf.get('avg_rank', 4.0)
    return BASELINE_RANK if rank >= 4.0 else float(rank)


def run_test_play(play: Callable[[int, int], dict], *, nonce_start: int, deals: int, reference, rule: str = 'paired',
                  confidence: float = 0.95, sprt: Optional[Sprt] = None, chunk_deals: int = 0,
                  mortal_better: Optional[Callable[[dict], bool]] = None) -> Verdict:
    """Play a test play through ``play(first_nonce, count) -> {nonce: [ranks]}`` and judge it.

    ``reference``: as ``reference_of``, or a callable replaying the reference on the same deals. With ``rule='sprt'``
    the SPRT (``sprt``) is looked at after each chunk: "not better" ends early; "better" against a fixed record still
    plays the remaining chunks for the new record. ``rule='mortal'`` asks ``mortal_better(units)``."""
    step = chunk_deals if rule == 'sprt' and chunk_deals > 0 else deals
    units: dict = {}
    replay = reference if callable(reference) else None
    if replay is not None:
        reference = {}
    sprt_verdict, decided_games, llr = None, None, None
    played = 0
    while played < deals:
        count = min(step, deals - played)
        units.update(play(nonce_start + played, count))
        if replay is not None:
            reference.update(replay(nonce_start + played, count))
        played += count
        if rule == 'sprt' and sprt_verdict is None:
            diffs = paired_differences(units, reference)
            llr = sprt.llr(diffs)
            sprt_verdict = sprt.verdict(diffs)
            if sprt_verdict is not None:
                decided_games = sum(len(r) for r in units.values())
                # with fixed deals a new best must cover every deal the next challenger meets; with a replayed
                # reference (fresh deals) nothing reuses the record, so either verdict ends the test play
                if sprt_verdict == 'not better' or replay is not None:
                    break
    diffs = paired_differences(units, reference)
    diff, ci = mean_and_ci(diffs, confidence)
    if played >= deals:
        worse = not math.isnan(ci) and diff - ci > 0
    else:  # stopped early by the SPRT: its sample was picked for a low mean, so ask the mirrored SPRT instead
        worse = sprt.llr([-d for d in diffs]) >= sprt.upper
    if rule == 'paired':
        better = not math.isnan(ci) and diff + ci < 0
    elif rule == 'sprt':
        better = sprt_verdict == 'better'
        sprt_verdict = sprt_verdict or 'undecided'
    else:
        better = bool(mortal_better(units))
    against = ('best.pth replayed' if replay is not None else 'best.pth' if isinstance(reference, dict)
               else f'avg rank {float(reference):.3f}')
    return Verdict(rule=rule, games=sum(len(r) for r in units.values()), diff=diff, ci=ci, better=better,
                   worse=worse, sprt=sprt_verdict if rule == 'sprt' else None, llr=llr,
                   decided_games=decided_games, units=units, against=against)
