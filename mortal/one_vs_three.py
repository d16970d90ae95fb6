"""Duplicate 1-vs-3 evaluation of two players (Mortal's ``mortal/one_vs_three.py``).

``python -m mortal.one_vs_three [-c/--config PATH]`` reads the ``[1v3]`` tables of the config (path: ``-c/--config``,
else env ``MORTAL_CFG``, else ``config.toml``)::

    [1v3]
    seed_key = -1            # duplicate key; -1 = a random 64-bit key per run (printed)
    games_per_iter = 2000    # multiple of 4: games_per_iter / 4 nonces, each played in the 4 seat rotations
    iters = 500
    log_dir = '/path/to/1v3' # {nonce}_{key}_{a|b|c|d}.json.gz per game; created, never cleared

    [1v3.challenger]         # and [1v3.champion], same keys
    type = 'mortal'          # extra: 'mortal' (default) or 'rulebase' (mjai.bot.rulebase.RulebaseBot)
    name = 'mortal'          # engine name written into the logs
    device = 'cuda:0'        # type = 'mortal' only, like the keys below
    state_file = '/path/to/challenger.pth'
    stochastic_latent = false
    enable_compile = false
    enable_amp = true
    enable_rule_based_agari_guard = true

Iteration ``i`` plays nonces ``10000 + i·n .. 10000 + (i+1)·n − 1`` (``n = games_per_iter / 4``) with the key, as
Mortal. After each iteration it prints the challenger's rank counts, avg rank and avg pt (pts 90/45/0/−135) of
that iteration, as Mortal, and the running totals with a 95% confidence interval computed over duplicate sets: the
four rotations of one nonce are one unit (:func:`duplicate_ci`). At the end it prints the challenger's full
``Stat`` table over this run's logs (when ``log_dir`` is set).
"""

if __package__ in (None, ''):  # run as a script: python mortal/one_vs_three.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import dataclasses
import logging
import math
import os
import secrets
import sys
from typing import Iterable, Mapping, Sequence

from mortal.stat import DISPLAY_PTS, rank_summary  # rank_summary: also this module's API (Mortal prints it)

logger = logging.getLogger('mortal.one_vs_three')  # not __name__: '__main__' under python -m

SEED_START = 10000  # first nonce, as Mortal's one_vs_three.py
Z_95 = 1.959963984540054  # two-sided 95% normal quantile
SPLITS = 'abcd'  # log-name suffix = challenger seat 0-3
SIDE_TYPES = ('mortal', 'rulebase')


@dataclasses.dataclass(frozen=True)
class DuplicateSummary:
    """Challenger's result over duplicate units (one unit = all games of one nonce).

    ``*_ci`` are half-widths of the 95% interval (mean ± half-width); ``nan`` with fewer than 2 units.
    """

    n_units: int
    n_games: int
    avg_rank: float
    avg_rank_ci: float
    avg_pt: float
    avg_pt_ci: float

    def __str__(self) -> str:
        return (f'avg rank {self.avg_rank:.4f} ± {self.avg_rank_ci:.4f}, '
                f'avg pt {self.avg_pt:.3f} ± {self.avg_pt_ci:.3f} '
                f'(95% CI over {self.n_units} duplicate sets, {self.n_games} games)')


def mean_ci(values: Sequence[float], z: float = Z_95) -> tuple[float, float]:
    """``(mean, z · sd / sqrt(n))`` with the sample sd (n − 1); half-width ``nan`` when n < 2.

    Raises:
        ValueError: ``values`` is empty.
    """
    n = len(values)
    if n == 0:
        raise ValueError('no values')
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, z * math.sqrt(var / n)


def duplicate_ci(unit_ranks: Iterable[Sequence[int]], pts: Sequence[float] = DISPLAY_PTS,
                 z: float = Z_95) -> DuplicateSummary:
    """Avg rank and avg pt with a normal 95% CI over duplicate units.

    Args:
        unit_ranks: one sequence per duplicate unit (a nonce) of the challenger's 1-based ranks (1-4) in that
            unit's games (normally its 4 seat rotations). Per unit the mean rank and mean pt are taken first; the
            reported values are the means of those unit means ± ``z``·sd/sqrt(n_units). The rotations of one deal
            are strongly correlated, so games are not independent samples but units are.
        pts: rank points for 1st-4th.

    Raises:
        ValueError: no units, an empty unit, or a rank outside 1-4.
    """
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
        pt_means.append(sum(pts[r - 1] for r in unit) / len(unit))
    if not rank_means:
        raise ValueError('no duplicate units')
    avg_rank, rank_ci = mean_ci(rank_means, z)
    avg_pt, pt_ci = mean_ci(pt_means, z)
    return DuplicateSummary(len(rank_means), n_games, avg_rank, rank_ci, avg_pt, pt_ci)


def challenger_ranks_by_nonce(games: Iterable[tuple]) -> dict[int, list[int]]:
    """Group the challenger's 1-based ranks by nonce.

    Args:
        games: ``(nonce, key, split, final_scores, rank_by_player)`` per game (``OneVsThree.last_games``), where
            split 'a'-'d' is the challenger's seat 0-3 and rank_by_player holds 0-based ranks.
    """
    out: dict[int, list[int]] = {}
    for nonce, _key, split, _scores, ranks in games:
        out.setdefault(int(nonce), []).append(int(ranks[SPLITS.index(split)]) + 1)
    return out


def side_type(side: Mapping, section: str) -> str:
    """The ``type`` of a ``[1v3.<side>]`` table: 'mortal' (default) or 'rulebase'.

    Raises:
        ValueError: any other value (names the section).
    """
    kind = side.get('type', 'mortal')
    if kind not in SIDE_TYPES:
        raise ValueError(f'[{section}] type must be one of {SIDE_TYPES}, got {kind!r}')
    return kind


def build_side(side: Mapping, section: str):
    """An arena player from a ``[1v3.challenger]``/``[1v3.champion]`` table.

    'rulebase': a ``mortal.play.agent.MjaiBotAgent`` of ``RulebaseBot`` named ``name`` (default 'rulebase').
    'mortal': a greedy ``MortalEngine`` from ``state_file`` (architecture from the checkpoint's own config, as
    Mortal) on ``device`` with ``enable_amp``, ``enable_rule_based_agari_guard``, ``stochastic_latent``,
    ``enable_compile``.

    Raises:
        ValueError: bad ``type``; mortal.learning.checkpoint.CheckpointError (a ValueError): missing or unusable
            checkpoint (one line naming the section, the file and the reason).
    """
    kind = side_type(side, section)
    if kind == 'rulebase':
        from mortal.play.agent import MjaiBotAgent
        return MjaiBotAgent(name=side.get('name', 'rulebase'))

    import torch
    from mortal.learning.checkpoint import load_errors, load_model_pair
    from mortal.play.engine import MortalEngine

    with load_errors(f'[{section}] state_file', side['state_file']):
        brain, dqn, version = load_model_pair(side['state_file'])
    if side.get('enable_compile', False):
        brain.compile()
        dqn.compile()
    logger.info('[%s] %s: %s (version %d) on %s', section, side['name'], side['state_file'], version,
                side['device'])
    return MortalEngine(
        brain,
        dqn,
        is_oracle=False,
        version=version,
        device=torch.device(side['device']),
        stochastic_latent=side.get('stochastic_latent', False),
        enable_amp=side.get('enable_amp', False),
        enable_rule_based_agari_guard=side.get('enable_rule_based_agari_guard', False),
        name=side['name'],
    )


def _challenger_stat(log_dir: str, games: Iterable[tuple]):
    """Sum of the challenger seat's ``Stat`` over this run's logs (by seat, so equal names do not mix)."""
    from mortal.data.mjai_log import BadLogError, read_log_text
    from mortal.stat import Stat

    total = Stat()
    for nonce, key, split, _scores, _ranks in games:
        path = os.path.join(log_dir, f'{nonce}_{key}_{split}.json.gz')
        try:
            total = total + Stat.from_log(read_log_text(path), SPLITS.index(split), source=path)
        except (OSError, BadLogError) as exc:  # a LogFormatError is a BadLogError
            logger.warning('log %s left out of the stats: %s', path, exc)
    return total


def run(config: dict, *, disable_progress_bar: bool = False, out=None) -> DuplicateSummary:
    """Play ``iters`` iterations as configured (``config``: the loaded config dict) and print the results.

    Returns the final :class:`DuplicateSummary`.
    """
    from mortal.play.arena import OneVsThree

    out = out or sys.stdout
    cfg = config['1v3']
    games_per_iter = cfg['games_per_iter']
    seeds_per_iter = games_per_iter // 4
    iters = cfg['iters']
    log_dir = cfg.get('log_dir') or None
    key = cfg.get('seed_key', -1)
    if key == -1:
        key = secrets.randbits(64)
    logger.info('1v3: %d iterations of %d games, seed key %d', iters, games_per_iter, key)

    challenger = build_side(cfg['challenger'], '1v3.challenger')
    champion = build_side(cfg['champion'], '1v3.champion')

    units: dict[int, list[int]] = {}
    all_games: list[tuple] = []
    summary = None
    for i in range(iters):
        seed = SEED_START + i * seeds_per_iter
        print('-' * 50, file=out)
        print('#', i, file=out)
        env = OneVsThree(disable_progress_bar=disable_progress_bar, log_dir=log_dir)
        rankings = env.py_vs_py(challenger=challenger, champion=champion, seed_start=(seed, key),
                                seed_count=seeds_per_iter)
        avg_rank, avg_pt = rank_summary(rankings)
        print(f'challenger rankings: {list(rankings)} ({avg_rank:.6f}, {avg_pt:.6f}pt)', file=out)
        games = list(env.last_games)
        all_games += games
        units.update(challenger_ranks_by_nonce(games))
        summary = duplicate_ci(units.values())
        print(f'total: {summary}', file=out)
        subs = [getattr(side, 'substitutions', 0) for side in (challenger, champion)]
        if any(subs):
            print(f'illegal bot reactions replaced (challenger, champion): {subs}', file=out)
        out.flush()

    if log_dir and all_games:
        print('-' * 50, file=out)
        print(f"challenger ({cfg['challenger'].get('name', '')}) over {len(all_games)} games:", file=out)
        print(_challenger_stat(log_dir, all_games), file=out)
        out.flush()
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m mortal.one_vs_three [-c/--config PATH] [--no-progress]``."""
    from mortal import entry
    from mortal.config import ONE_VS_THREE_SECTIONS, ConfigError

    parser = entry.parser('Duplicate 1v3 evaluation ([1v3] tables of the config).',
                          prog='python -m mortal.one_vs_three')
    parser.add_argument('--no-progress', action='store_true', help='hide the progress bar')
    args = entry.start(parser, argv)
    try:
        config = entry.load_config(args, ONE_VS_THREE_SECTIONS)
        for section in ('challenger', 'champion'):
            side_type(config['1v3'][section], f'1v3.{section}')
    except (ConfigError, ValueError) as exc:
        return entry.error(exc)
    log_dir = config['1v3'].get('log_dir')
    if log_dir:
        try:  # the arena would fail here too, with a traceback
            os.makedirs(log_dir, exist_ok=True)
        except OSError as exc:
            return entry.error(f'[1v3] log_dir {log_dir} cannot be created: {exc}')
    from mortal.learning.checkpoint import CheckpointError
    try:
        run(config, disable_progress_bar=args.no_progress)
    except CheckpointError as exc:
        return entry.error(exc)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == '__main__':
    sys.exit(main())
