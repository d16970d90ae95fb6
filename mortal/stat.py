"""Per-player game statistics from mjai logs, as Mortal's ``libriichi/src/stat.rs``.

``Stat`` holds raw counters (all ``int``) summed over games; the derived statistics are
plain ratios of them (IEEE semantics: x/0 gives ``inf`` and 0/0 gives ``nan``, as Mortal's
f64 division). Conventions kept from Mortal:

- "point"/"Δscore" values are score changes in points (1 riichi stick = 1000).
- Riichi Δscores exclude the player's own 1000-point riichi stick but include the others'
  sticks; every other Δscore includes sticks.
- A deal-in after riichi counts from the moment the declaration tile is discarded.
- Ankan is not a call (fuuro); kakan adds no call either.
- Being hit by another player's tsumo is not recorded anywhere.
- ``round`` counts every ``start_kyoku`` (renchan and abortive draws included).

CLI: ``python -m mortal.stat <DIR> <PLAYER_NAME>`` prints the table of every seat named
``PLAYER_NAME`` in ``DIR/**/*.json`` and ``DIR/**/*.json.gz`` (Mortal's ``stat`` binary).

The counting of one game for one seat is ``mortal.stat_game.count_game``; the derived statistics (rates, averages,
rank points) are ``mortal.stat_rates.StatRates``; the TensorBoard scalars and the printed table are
``mortal.stat_report.StatReport``. ``DISPLAY_PTS`` and ``rank_summary`` are read from here.
"""

if __package__ in (None, ''):  # run as a script: python mortal/stat.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import dataclasses
import glob
import logging
import os
import sys
from typing import Any, Iterable, Sequence

from tqdm import tqdm

from mortal.data.mjai_log import BadLogError, is_seat, parse_events, read_log_text
from mortal.stat_game import LogFormatError, count_game
# DISPLAY_PTS and rank_summary are read from here (the trainer, the client, one_vs_three, the 1v3 scoring)
from mortal.stat_rates import DISPLAY_PTS, StatRates, rank_summary  # noqa: F401
from mortal.stat_report import StatReport

logger = logging.getLogger('mortal.stat')  # not __name__: '__main__' under python -m


@dataclasses.dataclass
class Stat(StatRates, StatReport):
    """Raw counters of one or more analysed seats (field names and order as Mortal's).

    Build with :meth:`from_log` (one game, one seat) or :meth:`from_dir`; add with ``+``
    (field-wise, also ``sum(stats)``). Derived statistics are read-only properties
    (``avg_rank``, ``agari_rate``, ...) plus the methods :meth:`total_pt` / :meth:`avg_pt`
    (``mortal.stat_rates.StatRates``); ``str()`` is Mortal's table and :meth:`write_tensorboard` writes the test play
    tags (``mortal.stat_report.StatReport``).
    """

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

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, other: 'Stat') -> 'Stat':
        if not isinstance(other, Stat):
            return NotImplemented
        return Stat(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                       for f in dataclasses.fields(self)})

    def __radd__(self, other: Any) -> 'Stat':
        # lets ``sum(stats)`` start from the int 0
        if other == 0:
            return self
        return NotImplemented

    def as_dict(self) -> dict[str, int]:
        """Raw counters as a plain dict (Mortal's field order)."""
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_log(cls, log: str | bytes | Iterable[dict | str], seat: int, *,
                 source: str = '<log>') -> 'Stat':
        """Analyse one game for one seat.

        Args:
            log: the raw log text (one JSON event per line; blank lines ignored), its bytes,
                or an iterable of events (dicts, or JSON strings).
            seat: absolute seat 0-3 to analyse.
            source: a name for error messages (e.g. the file path).

        Returns a Stat with ``game == 1``.

        Raises:
            ValueError: ``seat`` is not 0-3.
            LogFormatError: the log fails ``mortal.data.mjai_log.parse_events`` (a line that is not
                a JSON event of a known type, an ``actor`` that is not a seat, more than one game:
                an event after ``end_game`` or a second ``start_game``), or a field the statistics
                need (``scores``, ``oya``, ``target``, ``deltas``) is missing or out of range; the
                message names ``source`` and the line.
        """
        if not is_seat(seat):
            raise ValueError(f'seat must be an int in 0..3, got {seat!r}')
        return cls._from_events(parse_events(log, source, error=LogFormatError), seat, source)

    @classmethod
    def from_dir(cls, log_dir: str | os.PathLike, player_name: str,
                 disable_progress_bar: bool = True, *,
                 skipped: list[str] | None = None) -> 'Stat':
        """Sum the stats of every seat named ``player_name`` in every log under ``log_dir``.

        Globs ``log_dir/**/*.json`` and ``log_dir/**/*.json.gz``, as Mortal's ``Stat.from_dir``
        (each read by :meth:`from_file`: gzip told by its content). Each log must start with ``start_game``
        carrying ``names``; every seat whose name equals ``player_name`` counts as one game
        (so a champion name in 1v3 logs yields 3 games per file).

        Unlike Mortal (which aborts), a malformed or unreadable file is skipped with one logged
        warning naming the file and the reason; the paths are appended to ``skipped`` if given.

        Raises:
            FileNotFoundError: ``log_dir`` is not a directory.
        """
        log_dir = os.fspath(log_dir)
        if not os.path.isdir(log_dir):
            raise FileNotFoundError(f'log directory not found: {log_dir}')
        paths = sorted(set(
            glob.glob(os.path.join(glob.escape(log_dir), '**', '*.json'), recursive=True)
            + glob.glob(os.path.join(glob.escape(log_dir), '**', '*.json.gz'), recursive=True)
        ))
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
        """Stats of every seat named ``player_name`` in one log file, read by
        ``mortal.data.mjai_log.read_log_text`` (gzip or plain, whatever the name).

        Raises:
            OSError: the file cannot be opened.
            BadLogError: the file cannot be read as a log (corrupt gzip data, not UTF-8, larger
                than ``mortal.data.mjai_log.DEFAULT_MAX_LOG_BYTES``).
            LogFormatError: the content is malformed or does not start with ``start_game``
                with a 4-name ``names`` list.
        """
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
        """One game for one seat; ``events``: ``mortal.data.mjai_log.parse_events`` pairs (line, event), whose
        types and actors are not checked again (``mortal.stat_game.count_game``)."""
        st = cls(game=1)
        count_game(st, events, seat, source)
        return st


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
