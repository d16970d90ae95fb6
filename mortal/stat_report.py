"""How ``mortal.stat.Stat`` is shown: the TensorBoard scalars Mortal's ``train.py`` writes after a test play, and the
table of Mortal's ``stat`` binary (labels, order and number format of its ``Stat`` Display).

``StatReport`` is the half of ``Stat`` that shows it; it reads the counters and the derived statistics
(``mortal.stat_rates.StatRates``) of a ``Stat`` and writes nothing into them.
"""

import math
from typing import Any, Sequence

from mortal.stat_rates import DISPLAY_PTS


def _fmt(x: float, prec: int = 6) -> str:
    """Format like Rust's ``{:.N}`` for f64 (fixed decimals; ``NaN``/``inf``/``-inf``)."""
    if math.isnan(x):
        return 'NaN'
    if math.isinf(x):
        return 'inf' if x > 0 else '-inf'
    return f'{x:.{prec}f}'

class StatReport:
    """TensorBoard scalars and the printed table of a ``mortal.stat.Stat`` (a mixin: it reads the counters and the
    derived statistics of ``mortal.stat_rates.StatRates`` by name)."""

    def tensorboard_scalars(self, pts: Sequence[float] = DISPLAY_PTS
                            ) -> dict[str, float | dict[str, float]]:
        """The values Mortal's ``train.py`` writes after a test play, keyed by tag.

        A ``float`` value is written with ``writer.add_scalar(tag, value, step)``, a
        ``dict`` value with ``writer.add_scalars(tag, value, step)`` (Mortal uses both;
        :meth:`write_tensorboard` does the dispatch).
        """
        return {
            'test_play/avg_ranking': self.avg_rank,
            'test_play/avg_pt': self.avg_pt(pts),
            'test_play/ranking': {
                '1st': self.rank_1_rate, '2nd': self.rank_2_rate,
                '3rd': self.rank_3_rate, '4th': self.rank_4_rate,
            },
            'test_play/behavior': {
                'agari': self.agari_rate, 'houjuu': self.houjuu_rate,
                'fuuro': self.fuuro_rate, 'riichi': self.riichi_rate,
            },
            'test_play/agari_point': {
                'overall': self.avg_point_per_agari,
                'riichi': self.avg_point_per_riichi_agari,
                'fuuro': self.avg_point_per_fuuro_agari,
                'dama': self.avg_point_per_dama_agari,
            },
            'test_play/houjuu_point': self.avg_point_per_houjuu,
            'test_play/point_per_round': self.avg_point_per_round,
            'test_play/key_step': {
                'agari_jun': self.avg_agari_jun,
                'houjuu_jun': self.avg_houjuu_jun,
                'riichi_jun': self.avg_riichi_jun,
            },
            'test_play/riichi': {
                'agari_after_riichi': self.agari_rate_after_riichi,
                'houjuu_after_riichi': self.houjuu_rate_after_riichi,
                'chasing_riichi': self.chasing_riichi_rate,
                'riichi_chased': self.riichi_chased_rate,
            },
            'test_play/riichi_point': self.avg_riichi_point,
            'test_play/fuuro': {
                'agari_after_fuuro': self.agari_rate_after_fuuro,
                'houjuu_after_fuuro': self.houjuu_rate_after_fuuro,
            },
            'test_play/fuuro_num': self.avg_fuuro_num,
            'test_play/fuuro_point': self.avg_fuuro_point,
        }

    def write_tensorboard(self, writer: Any, global_step: int,
                          pts: Sequence[float] = DISPLAY_PTS) -> None:
        """Write :meth:`tensorboard_scalars` to a ``torch.utils.tensorboard.SummaryWriter``."""
        for tag, value in self.tensorboard_scalars(pts).items():
            if isinstance(value, dict):
                writer.add_scalars(tag, value, global_step)
            else:
                writer.add_scalar(tag, value, global_step)

    def __str__(self) -> str:
        """The table of Mortal's ``Stat`` Display (labels and order), rates to 6 decimals."""
        return '\n'.join(self._result_lines() + [''] + self._play_lines())

    def _result_lines(self) -> list[str]:
        """The results: games and rounds, placements, rank points and Δscore."""
        f = _fmt
        return [
            f'Games            {self.game}',
            f'Rounds           {self.round}',
            f'Rounds as dealer {self.oya}',
            '',
            f'1st (rate)       {self.rank_1} ({f(self.rank_1_rate)})',
            f'2nd (rate)       {self.rank_2} ({f(self.rank_2_rate)})',
            f'3rd (rate)       {self.rank_3} ({f(self.rank_3_rate)})',
            f'4th (rate)       {self.rank_4} ({f(self.rank_4_rate)})',
            f'Tobi(rate)       {self.tobi} ({f(self.tobi_rate)})',
            f'Avg rank         {f(self.avg_rank)}',
            f'Total rank pt    {self.total_pt(DISPLAY_PTS)}',
            f'Avg rank pt      {f(self.avg_pt(DISPLAY_PTS))}',
            f'Total Δscore     {self.point}',
            f'Avg game Δscore  {f(self.avg_point_per_game)}',
            f'Avg round Δscore {f(self.avg_point_per_round)}',
        ]

    def _play_lines(self) -> list[str]:
        """The rest: how the seat played. Wins, deal-ins, riichi and calls (how often, for how much, on which turn),
        the dealer, yakuman and nagashi mangan."""
        f = _fmt
        return [
            f'Win rate      {f(self.agari_rate)}',
            f'Deal-in rate  {f(self.houjuu_rate)}',
            f'Call rate     {f(self.fuuro_rate)}',
            f'Riichi rate   {f(self.riichi_rate)}',
            f'Ryukyoku rate {f(self.ryukyoku_rate)}',
            '',
            f'Avg winning Δscore               {f(self.avg_point_per_agari)}',
            f'Avg winning Δscore as dealer     {f(self.avg_point_per_oya_agari)}',
            f'Avg winning Δscore as non-dealer {f(self.avg_point_per_ko_agari)}',
            f'Avg riichi winning Δscore        {f(self.avg_point_per_riichi_agari)}',
            f'Avg open winning Δscore          {f(self.avg_point_per_fuuro_agari)}',
            f'Avg dama winning Δscore          {f(self.avg_point_per_dama_agari)}',
            f'Avg ryukyoku Δscore              {f(self.avg_point_per_ryukyoku)}',
            '',
            f'Avg winning turn        {f(self.avg_agari_jun)}',
            f'Avg riichi winning turn {f(self.avg_riichi_agari_jun)}',
            f'Avg open winning turn   {f(self.avg_fuuro_agari_jun)}',
            f'Avg dama winning turn   {f(self.avg_dama_agari_jun)}',
            '',
            f'Avg deal-in turn                 {f(self.avg_houjuu_jun)}',
            f'Avg deal-in Δscore               {f(self.avg_point_per_houjuu)}',
            f'Avg deal-in Δscore to dealer     {f(self.avg_point_per_houjuu_to_oya)}',
            f'Avg deal-in Δscore to non-dealer {f(self.avg_point_per_houjuu_to_ko)}',
            '',
            f'Chasing riichi rate       {f(self.chasing_riichi_rate)}',
            f'Riichi chased rate        {f(self.riichi_chased_rate)}',
            f'Winning rate after riichi {f(self.agari_rate_after_riichi)}',
            f'Deal-in rate after riichi {f(self.houjuu_rate_after_riichi)}',
            f'Avg riichi turn           {f(self.avg_riichi_jun)}',
            f'Avg riichi Δscore         {f(self.avg_riichi_point)}',
            '',
            f'Avg number of calls     {f(self.avg_fuuro_num)}',
            f'Winning rate after call {f(self.agari_rate_after_fuuro)}',
            f'Deal-in rate after call {f(self.houjuu_rate_after_fuuro)}',
            f'Avg call Δscore         {f(self.avg_fuuro_point)}',
            '',
            f'Dealer wins/all dealer rounds  {f(self.agari_rate_as_oya)}',
            f'Dealer wins/all wins           {f(self.agari_as_oya_rate)}',
            f'Deal-in to dealer/all deal-ins {f(self.houjuu_to_oya_rate)}',
            '',
            f'Yakuman (rate)        {self.yakuman} ({f(self.yakuman_rate, 9)})',
            f'Nagashi mangan (rate) {self.nagashi_mangan} ({f(self.nagashi_mangan_rate, 9)})',
        ]
