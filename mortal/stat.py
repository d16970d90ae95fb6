"""Per-player game statistics from mjai logs, as Mortal's ``libriichi/src/stat.rs``.

``Stat`` holds raw int counters summed over games; derived statistics are plain ratios (x/0 = inf, 0/0 = nan, as
Mortal's f64). Points are score changes (1 riichi stick = 1000); riichi deltas exclude the own stick. Ankan and
kakan are no calls; ``round`` counts every ``start_kyoku``. One game for one seat: ``mortal.stat_game``.
CLI: ``python -m mortal.stat <DIR> <PLAYER_NAME>`` (Mortal's ``stat`` binary)."""

if __package__ in (None, ''):  # run as a script: python mortal/stat.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import dataclasses
import glob
import logging
import math
import os
import sys
from typing import Any, Iterable, Sequence

from tqdm import tqdm

from mortal.data.mjai_log import BadLogError, is_seat, parse_events, read_log_text
from mortal.stat_game import LogFormatError, count_game

logger = logging.getLogger('mortal.stat')  # not __name__: '__main__' under python -m

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


def rank_summary(rankings: Sequence[int]) -> tuple[float, float]:
    """``(avg_rank, avg_pt)`` (``DISPLAY_PTS``) from rank counts ``[n1, n2, n3, n4]``; NaN for no games."""
    counts = list(rankings)
    total = sum(counts)
    if total == 0:
        return math.nan, math.nan
    return (float(sum((i + 1) * n for i, n in enumerate(counts)) / total),
            float(sum(p * n for p, n in zip(DISPLAY_PTS, counts)) / total))


def _fmt(x: float, prec: int = 6) -> str:
    """Format like Rust's ``{:.N}`` for f64 (fixed decimals; ``NaN``/``inf``/``-inf``)."""
    if math.isnan(x):
        return 'NaN'
    if math.isinf(x):
        return 'inf' if x > 0 else '-inf'
    return f'{x:.{prec}f}'


@dataclasses.dataclass
class Stat:
    """Raw counters of one or more analysed seats (field names and order as Mortal's); add with ``+``."""

    game: int = 0
    round: int = 0
    oya: int = 0

    point: int = 0
    rank_1: int = 0
    rank_2: int = 0
    rank_3: int = 0
    rank_4: int = 0
    tobi: int = 0

    fuuro: int = 0
    fuuro_num: int = 0
    fuuro_point: int = 0
    fuuro_agari: int = 0
    fuuro_agari_jun: int = 0
    fuuro_agari_point: int = 0
    fuuro_houjuu: int = 0
    agari: int = 0
    agari_as_oya: int = 0
    agari_jun: int = 0
    agari_point_oya: int = 0
    agari_point_ko: int = 0

    houjuu: int = 0
    houjuu_jun: int = 0
    houjuu_to_oya: int = 0
    houjuu_point_to_oya: int = 0
    houjuu_point_to_ko: int = 0

    riichi: int = 0
    riichi_as_oya: int = 0
    riichi_jun: int = 0
    riichi_agari: int = 0
    riichi_agari_point: int = 0
    riichi_agari_jun: int = 0
    riichi_houjuu: int = 0
    riichi_ryukyoku: int = 0
    riichi_point: int = 0
    chasing_riichi: int = 0
    riichi_got_chased: int = 0

    dama_agari: int = 0
    dama_agari_jun: int = 0
    dama_agari_point: int = 0

    ryukyoku: int = 0
    ryukyoku_point: int = 0

    yakuman: int = 0
    nagashi_mangan: int = 0

    def __add__(self, other: 'Stat') -> 'Stat':
        return Stat(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                       for f in dataclasses.fields(self)})

    @classmethod
    def from_log(cls, log: str | bytes | Iterable[dict | str], seat: int, *, source: str = '<log>') -> 'Stat':
        """Analyse one game (text, bytes or events) for absolute ``seat`` 0-3; returns a Stat with ``game == 1``.

        Raises ValueError (bad seat), LogFormatError (malformed log or missing field, naming ``source`` and line)."""
        if not is_seat(seat):
            raise ValueError(f'seat must be an int in 0..3, got {seat!r}')
        return cls._from_events(parse_events(log, source, error=LogFormatError), seat, source)

    @classmethod
    def from_dir(cls, log_dir: str | os.PathLike, player_name: str,
                 disable_progress_bar: bool = True, *,
                 skipped: list[str] | None = None) -> 'Stat':
        """Sum the stats of every seat named ``player_name`` in ``log_dir/**/*.json[.gz]``.

        Unlike Mortal (which aborts), a bad file is skipped with a warning and appended to ``skipped``.
        Raises FileNotFoundError when ``log_dir`` is not a directory."""
        log_dir = os.fspath(log_dir)
        if not os.path.isdir(log_dir):
            raise FileNotFoundError(f'{log_dir} is a file, not a log directory' if os.path.exists(log_dir)
                                    else f'log directory not found: {log_dir}')
        found = {}  # real path -> first path: glob's '**' follows links, a link to a parent repeats every log
        for path in sorted(glob.glob(os.path.join(glob.escape(log_dir), '**', '*.json'), recursive=True)
                           + glob.glob(os.path.join(glob.escape(log_dir), '**', '*.json.gz'), recursive=True)):
            found.setdefault(os.path.realpath(path), path)
        paths = sorted(found.values())
        total = cls()
        n_skipped = 0
        for path in tqdm(paths, unit='file', disable=disable_progress_bar, dynamic_ncols=True,
                         ascii=True):
            try:
                total = total + cls.from_file(path, player_name)
            except (OSError, BadLogError) as exc:
                n_skipped += 1
                reason = str(exc)
                if not reason.startswith(path):  # a BadLogError already names the file (and line)
                    reason = f'{path}: {reason}'
                logger.warning('skipping log %s', reason)
                if skipped is not None:
                    skipped.append(path)
        if n_skipped:
            logger.warning('skipped %d of %d log files under %s', n_skipped, len(paths), log_dir)
        return total

    @classmethod
    def from_file(cls, path: str | os.PathLike, player_name: str) -> 'Stat':
        """Stats of every seat named ``player_name`` in one log file (gzip or plain).

        Raises OSError, BadLogError (unreadable as a log), LogFormatError (malformed content)."""
        path = os.fspath(path)
        events = parse_events(read_log_text(path), path, error=LogFormatError)
        if not events or events[0][1]['type'] != 'start_game':
            got = events[0][1]['type'] if events else 'an empty file'
            raise LogFormatError(path, f'first event is not start_game (got {got!r})')
        names = events[0][1].get('names')
        if not isinstance(names, list) or len(names) != 4:
            raise LogFormatError(path, f'start_game needs a list of 4 names, got {names!r}', events[0][0])
        total = cls()
        for seat, name in enumerate(names):
            if name == player_name:
                total = total + cls._from_events(events, seat, path)
        return total

    @classmethod
    def _from_events(cls, events: Sequence[tuple[int, dict]], seat: int, source: str) -> 'Stat':
        """One game for one seat from ``parse_events`` pairs (line, event)."""
        st = cls(game=1)
        count_game(st, events, seat, source)
        return st

    def total_pt(self, pts: Sequence[float] = DISPLAY_PTS) -> float:
        """Σ rank_k · pts[k] over the 4 ranks (``pts`` = 4 rank points, 1st first)."""
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

    def tensorboard_scalars(self, pts: Sequence[float] = DISPLAY_PTS) -> dict[str, float | dict[str, float]]:
        """The values Mortal's ``train.py`` writes after a test play, by tag (float: add_scalar, dict: add_scalars)."""
        return {
            'test_play/avg_ranking': self.avg_rank,
            'test_play/avg_pt': self.avg_pt(pts),
            'test_play/ranking': {'1st': self.rank_1_rate, '2nd': self.rank_2_rate, '3rd': self.rank_3_rate,
                                  '4th': self.rank_4_rate},
            'test_play/behavior': {'agari': self.agari_rate, 'houjuu': self.houjuu_rate, 'fuuro': self.fuuro_rate,
                                   'riichi': self.riichi_rate},
            'test_play/agari_point': {'overall': self.avg_point_per_agari, 'riichi': self.avg_point_per_riichi_agari,
                                      'fuuro': self.avg_point_per_fuuro_agari, 'dama': self.avg_point_per_dama_agari},
            'test_play/houjuu_point': self.avg_point_per_houjuu,
            'test_play/point_per_round': self.avg_point_per_round,
            'test_play/key_step': {'agari_jun': self.avg_agari_jun, 'houjuu_jun': self.avg_houjuu_jun,
                                   'riichi_jun': self.avg_riichi_jun},
            'test_play/riichi': {'agari_after_riichi': self.agari_rate_after_riichi,
                                 'houjuu_after_riichi': self.houjuu_rate_after_riichi,
                                 'chasing_riichi': self.chasing_riichi_rate, 'riichi_chased': self.riichi_chased_rate},
            'test_play/riichi_point': self.avg_riichi_point,
            'test_play/fuuro': {'agari_after_fuuro': self.agari_rate_after_fuuro,
                                'houjuu_after_fuuro': self.houjuu_rate_after_fuuro},
            'test_play/fuuro_num': self.avg_fuuro_num,
            'test_play/fuuro_point': self.avg_fuuro_point,
        }

    def write_tensorboard(self, writer: Any, global_step: int, pts: Sequence[float] = DISPLAY_PTS) -> None:
        """Write :meth:`tensorboard_scalars` to a ``torch.utils.tensorboard.SummaryWriter``."""
        for tag, value in self.tensorboard_scalars(pts).items():
            if isinstance(value, dict):
                writer.add_scalars(tag, value, global_step)
            else:
                writer.add_scalar(tag, value, global_step)

    def __str__(self) -> str:
        """The table of Mortal's ``Stat`` Display (labels and order), rates to 6 decimals."""
        f = _fmt
        return '\n'.join([
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
            '',
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
        ])

def main(argv: list[str] | None = None) -> int:
    """``python -m mortal.stat <DIR> <PLAYER_NAME>``: print the stats table."""
    from mortal import entry

    parser = entry.parser('Statistics of one player over mjai logs (DIR/**/*.json, DIR/**/*.json.gz).',
                          config=False, prog='python -m mortal.stat')
    parser.add_argument('dir', metavar='DIR', help='directory searched recursively for logs')
    parser.add_argument('player_name', metavar='PLAYER_NAME',
                        help='name in start_game.names; every seat with it is analysed')
    parser.add_argument('--no-progress', action='store_true', help='hide the progress bar')
    args = entry.start(parser, argv)
    try:
        stat = Stat.from_dir(args.dir, args.player_name, disable_progress_bar=args.no_progress)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    if stat.game == 0:
        logger.warning('no seat named %r found in logs under %s', args.player_name, args.dir)
    print(stat)
    return 0


if __name__ == '__main__':
    sys.exit(main())
