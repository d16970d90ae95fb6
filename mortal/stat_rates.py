"""The derived statistics of ``mortal.stat.Stat``: ratios of its raw counters, as Mortal's ``libriichi/src/stat.rs``
computes them (IEEE semantics: x/0 gives ``inf`` and 0/0 gives ``nan``, as Mortal's f64 division), and the display
rank points they are weighed with.

``StatRates`` is the half of ``Stat`` that reads counters and writes none; the counters themselves, how a log is
counted into them and how they are shown are ``mortal.stat``, ``mortal.stat_game`` and ``mortal.stat_report``.
"""

import math
from typing import Sequence

#: Rank points of 1st-4th (Tenhou-like) that Mortal's trainer, client, one_vs_three and ``stat`` display
#: ("Avg rank pt"); for display and the best.pth rule only, never a training signal.
DISPLAY_PTS = (90, 45, 0, -135)


def _ratio(numerator: str, denominator: str, doc: str | None = None) -> property:
    """A read-only ratio of two counters of a ``Stat`` (0.0 while the denominator is 0)."""
    return property(lambda s: _div(getattr(s, numerator), getattr(s, denominator)),
                    doc=doc or f'{numerator} / {denominator}')


def _div(a: float, b: float) -> float:
    """``a / b`` with IEEE semantics (Mortal divides f64s): x/0 = ±inf, 0/0 = nan."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * (math.copysign(1.0, b))
    return a / b


def rank_summary(rankings: Sequence[int], pts: Sequence[float] = DISPLAY_PTS) -> tuple[float, float]:
    """``(avg_rank, avg_pt)`` from rank counts ``[n1, n2, n3, n4]`` (1st..4th places, any int sequence),
    as Mortal's client and one_vs_three print them; NaN for no games."""
    counts = list(rankings)
    total = sum(counts)
    if total == 0:
        return math.nan, math.nan
    return (float(sum((i + 1) * n for i, n in enumerate(counts)) / total),
            float(sum(p * n for p, n in zip(pts, counts)) / total))


class StatRates:
    """The derived statistics of the raw counters of a ``mortal.stat.Stat`` (a mixin: it reads the counters by name):
    read-only properties (``avg_rank``, ``agari_rate``, ...) plus the methods :meth:`total_pt` / :meth:`avg_pt`."""

    def total_pt(self, pts: Sequence[float] = DISPLAY_PTS) -> float:
        """Σ rank_k · pts[k] over the 4 ranks (``pts`` = 4 rank points, 1st first)."""
        if len(pts) != 4:
            raise ValueError(f'pts must have 4 entries, got {list(pts)!r}')
        return (self.rank_1 * pts[0] + self.rank_2 * pts[1] + self.rank_3 * pts[2]
                + self.rank_4 * pts[3])

    def avg_pt(self, pts: Sequence[float] = DISPLAY_PTS) -> float:
        """``total_pt(pts) / game``; Mortal's trainer uses pts = ``DISPLAY_PTS``."""
        return _div(self.total_pt(pts), self.game)

    @property
    def avg_rank(self) -> float:
        """Average placement, 1.0 (always 1st) .. 4.0."""
        return self.avg_pt((1, 2, 3, 4))

    rank_1_rate = _ratio('rank_1', 'game')
    rank_2_rate = _ratio('rank_2', 'game')
    rank_3_rate = _ratio('rank_3', 'game')
    rank_4_rate = _ratio('rank_4', 'game')
    tobi_rate = _ratio('tobi', 'game')

    avg_point_per_game = _ratio('point', 'game', 'final score − 25000, per game (points)')
    avg_point_per_round = _ratio('point', 'round', 'final score − 25000, per kyoku (points)')

    avg_point_per_agari = property(
        lambda s: _div(s.agari_point_ko + s.agari_point_oya, s.agari),
        doc='points per win (own riichi stick excluded)')
    avg_point_per_oya_agari = _ratio('agari_point_oya', 'agari_as_oya', 'points per win as dealer')
    avg_point_per_ko_agari = property(
        lambda s: _div(s.agari_point_ko, s.agari - s.agari_as_oya),
        doc='points per win as non-dealer')
    avg_point_per_riichi_agari = _ratio('riichi_agari_point', 'riichi_agari', 'points per riichi win')
    avg_point_per_fuuro_agari = _ratio('fuuro_agari_point', 'fuuro_agari', 'points per open-hand win')
    avg_point_per_dama_agari = _ratio('dama_agari_point', 'dama_agari', 'points per closed non-riichi win')
    avg_point_per_ryukyoku = _ratio('ryukyoku_point', 'ryukyoku', 'points per draw')

    avg_agari_jun = _ratio('agari_jun', 'agari', 'own discards before a win')
    avg_riichi_agari_jun = _ratio('riichi_agari_jun', 'riichi_agari')
    avg_fuuro_agari_jun = _ratio('fuuro_agari_jun', 'fuuro_agari')
    avg_dama_agari_jun = _ratio('dama_agari_jun', 'dama_agari')

    avg_point_per_houjuu = property(
        lambda s: _div(s.houjuu_point_to_ko + s.houjuu_point_to_oya, s.houjuu),
        doc='points per deal-in (negative)')
    avg_point_per_houjuu_to_oya = _ratio('houjuu_point_to_oya', 'houjuu_to_oya')
    avg_point_per_houjuu_to_ko = property(
        lambda s: _div(s.houjuu_point_to_ko, s.houjuu - s.houjuu_to_oya))
    avg_houjuu_jun = _ratio('houjuu_jun', 'houjuu', 'own discards before a deal-in (the dealt tile included)')

    agari_rate = _ratio('agari', 'round', 'wins per kyoku')
    houjuu_rate = _ratio('houjuu', 'round', 'deal-ins per kyoku')
    riichi_rate = _ratio('riichi', 'round', 'riichi per kyoku')
    fuuro_rate = _ratio('fuuro', 'round', 'kyoku with a call, per kyoku')
    ryukyoku_rate = _ratio('ryukyoku', 'round', 'draws per kyoku')

    agari_rate_after_riichi = _ratio('riichi_agari', 'riichi')
    houjuu_rate_after_riichi = _ratio('riichi_houjuu', 'riichi')
    chasing_riichi_rate = _ratio('chasing_riichi', 'riichi')
    riichi_chased_rate = _ratio('riichi_got_chased', 'riichi')
    avg_riichi_jun = _ratio('riichi_jun', 'riichi', 'own discards before the riichi declaration')
    avg_riichi_point = _ratio('riichi_point', 'riichi', 'points per riichi (own stick excluded)')

    agari_rate_as_oya = _ratio('agari_as_oya', 'oya', 'dealer wins / dealer kyoku')
    agari_as_oya_rate = _ratio('agari_as_oya', 'agari', 'dealer wins / all wins')
    houjuu_to_oya_rate = _ratio('houjuu_to_oya', 'houjuu', 'deal-ins to the dealer / all deal-ins')

    avg_fuuro_num = _ratio('fuuro_num', 'fuuro', 'calls per kyoku with a call')
    agari_rate_after_fuuro = _ratio('fuuro_agari', 'fuuro')
    houjuu_rate_after_fuuro = _ratio('fuuro_houjuu', 'fuuro')
    avg_fuuro_point = _ratio('fuuro_point', 'fuuro')

    yakuman_rate = _ratio('yakuman', 'round')
    nagashi_mangan_rate = _ratio('nagashi_mangan', 'round')
