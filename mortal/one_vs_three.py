"""Duplicate 1-vs-3 evaluation of two players (Mortal's ``mortal/one_vs_three.py``), from the ``[1v3]`` tables.

``python -m mortal.one_vs_three [-c PATH]``. Iteration ``i`` plays nonces ``10000 + i·n ..`` (``n =
games_per_iter / 4``) in the 4 seat rotations, as Mortal, and prints the challenger's figures as Mortal, plus running
totals with a 95% confidence interval over duplicate sets (``duplicate_ci``); at the end the full ``Stat`` table.
``[1v3.*] type = 'rulebase'`` (extra) plays ``mjai.bot.rulebase.RulebaseBot``."""

if __package__ in (None, ''):  # run as a script: python mortal/one_vs_three.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import contextlib
import logging
import os
import secrets
import sys
from typing import Iterable

from mortal.play.duplicate import (SEED_START, SPLITS, DuplicateSummary, build_side, complete_challenger_units,
                                   duplicate_ci)
from mortal.stat import rank_summary

logger = logging.getLogger('mortal.one_vs_three')  # not __name__: '__main__' under python -m

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
    """Play ``iters`` iterations as configured and print the results; returns the final DuplicateSummary."""
    from mortal.config import typed
    from mortal.play.arena import OneVsThree

    out = out or sys.stdout
    cfg = typed(config).one_vs_three
    seeds_per_iter = cfg.games_per_iter // 4
    log_dir = cfg.log_dir or None
    key = secrets.randbits(64) if cfg.seed_key == -1 else cfg.seed_key
    logger.info('1v3: %d iterations of %d games, seed key %d', cfg.iters, cfg.games_per_iter, key)

    challenger = build_side(cfg.challenger, '1v3.challenger')
    champion = build_side(cfg.champion, '1v3.champion')

    units: dict[int, list[int]] = {}
    all_games: list[tuple] = []
    summary = None
    for i in range(cfg.iters):
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
        units.update(complete_challenger_units(games))  # a deal with a failed game: dropped
        if env.failed_games:
            print(f'failed games (left out with their deals): {[f"{n}_{k}_{s}" for n, k, s, _ in env.failed_games]}',
                  file=out)
        summary = duplicate_ci(units.values())
        print(f'total: {summary}', file=out)
        subs = [getattr(side, 'substitutions', 0) for side in (challenger, champion)]
        if any(subs):
            print(f'illegal bot reactions replaced (challenger, champion): {subs}', file=out)
        out.flush()

    if log_dir and all_games:
        print('-' * 50, file=out)
        print(f'challenger ({cfg.challenger.name}) over {len(all_games)} games:', file=out)
        print(_challenger_stat(log_dir, all_games), file=out)
        out.flush()
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m mortal.one_vs_three [-c/--config PATH] [--no-progress]``."""
    from mortal import entry
    from mortal.config import ONE_VS_THREE_SECTIONS, ConfigError, typed

    parser = entry.parser('Duplicate 1v3 evaluation ([1v3] tables of the config).',
                          prog='python -m mortal.one_vs_three')
    parser.add_argument('--no-progress', action='store_true', help='hide the progress bar')
    args = entry.start(parser, argv)
    try:  # a side's type is checked there ('mortal' or 'rulebase', mortal.config_schema.MortalSide)
        config = entry.load_config(args, ONE_VS_THREE_SECTIONS)
    except ConfigError as exc:
        return entry.error(exc)
    entry.check_devices(config, entry.ONE_VS_THREE_DEVICES)
    log_dir = typed(config).one_vs_three.log_dir
    if log_dir:
        try:  # the arena would fail here too, with a traceback
            os.makedirs(log_dir, exist_ok=True)
        except OSError as exc:
            return entry.error(f'[1v3] log_dir {log_dir} cannot be created: {exc}')
    from mortal.model.checkpoint import CheckpointError
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends a run quietly
            run(config, disable_progress_bar=args.no_progress)
    except CheckpointError as exc:
        return entry.error(exc)
    return 0


if __name__ == '__main__':
    sys.exit(main())
