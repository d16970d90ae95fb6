"""Duplicate evaluation over a pool of processes: one challenger against three copies of a champion."""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Mapping

from mortal.entry import drop_rust_backtrace
from mortal.play.duplicate import SEED_START, unreliable_note

logger = logging.getLogger('mortal.evaluation')


def _side(spec, name):
    from mortal.config_schema import MortalSide, RulebaseSide
    from mortal.play.duplicate import build_side
    kind, state_file, *device = spec
    if kind == 'rulebase':
        return build_side(RulebaseSide(type='rulebase', name=name), 'evaluation')
    return build_side(MortalSide(name=name, state_file=state_file, device=(device or ['cpu'])[0],
                                 stochastic_latent=False, enable_compile=False, enable_amp=False,
                                 enable_rule_based_agari_guard=True), 'evaluation')


def _init_worker(sp_threads):
    """Pool worker start: the parent's search thread count (``MORTAL_SP_THREADS``, resolved at its start-up)."""
    from mortal.features import obs_v4
    obs_v4.SP_THREADS = sp_threads


def play_chunk(task):
    """Worker: ``(challenger, champion, first_nonce, count, key[, log_dir])`` -> ``{nonce: [ranks 1-4]}``."""
    drop_rust_backtrace()  # also when play_duplicate was called by a library caller, not by a main()
    import torch
    torch.set_num_threads(1)  # the workers already fill the cores
    from mortal.play.arena import OneVsThree
    from mortal.play.duplicate import complete_challenger_units
    chal, champ, nonce, count, key, *log_dir = task
    env = OneVsThree(disable_progress_bar=True, log_dir=log_dir[0] if log_dir else None)
    try:
        env.py_vs_py(_side(chal, 'challenger'), _side(champ, 'champion'), seed_start=(nonce, key), seed_count=count)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - pyo3's PanicException is a BaseException
        # a pool worker that dies on a BaseException loses its chunk and the pool waits for it forever; an
        # Exception reaches the caller instead, naming the deals
        raise RuntimeError(f'games of nonces {nonce}..{nonce + count - 1} (key {key}) failed: '
                           f'{type(e).__name__}: {e}') from None
    return complete_challenger_units(env.last_games)


def play_duplicate(challenger, champion, *, sets: int, key: int, workers: int = 1, chunk: int | None = None,
                   progress=None, log_dir: str | None = None) -> dict[int, list[int]]:
    """``{nonce: [4 ranks 1-4]}`` of ``sets`` deals against 3x ``champion``, failed deals left out."""
    import multiprocessing as mp
    import threading
    if sets < 1:
        raise ValueError(f'sets must be >= 1, got {sets}')
    if chunk is None:
        bot = 'rulebase' in (challenger[0], champion[0])
        chunk = 2 if bot else max(1, math.ceil(sets / (4 * workers)))
    tasks = [(challenger, champion, SEED_START + i, min(chunk, sets - i), key, log_dir) for i in range(0, sets, chunk)]
    units = {}
    with contextlib.ExitStack() as stack:
        if workers <= 1:
            parts = map(play_chunk, tasks)
        else:
            from tqdm import tqdm
            tqdm.set_lock(threading.RLock())  # no multiprocessing semaphore in the parent (forkserver warns)
            from mortal.features import obs_v4
            pool = stack.enter_context(mp.get_context('forkserver').Pool(
                workers, initializer=_init_worker, initargs=(obs_v4.SP_THREADS,)))
            parts = pool.imap_unordered(play_chunk, tasks)
        for part in parts:
            units.update(part)
            if progress:
                progress(sum(len(r) for r in part.values()))
        if workers > 1:  # workers that exit, unlike terminated ones, release their tqdm semaphore
            pool.close()
            pool.join()
    dropped = [n for n in range(SEED_START, SEED_START + sets) if n not in units]  # a game failed
    if dropped:
        logger.warning('%d of %d deals (key %d) left out, a game failed: nonces %s', len(dropped), sets, key,
                       dropped)
    return units


#: The fields every :func:`summarize` result has (the paired ones aside); :func:`format_summary` reads them.
SUMMARY_FIELDS = ('deals', 'games', 'avg_rank', 'avg_rank_ci', 'avg_pt', 'avg_pt_ci')


def summarize(units: Mapping[int, list], reference: Mapping[int, list] | None = None) -> dict:
    """Avg rank and avg pt with 95% CI half-widths over deals; with ``reference``, also ``paired_diff`` (mean
    per-deal rank difference, negative = better, over shared deals) and ``unpaired``. KeyError if no deal is shared."""
    from mortal.play.duplicate import duplicate_ci, mean_ci
    nonces = sorted(units)
    s = duplicate_ci([units[n] for n in nonces])
    out = {'deals': s.n_units, 'games': s.n_games, 'avg_rank': s.avg_rank, 'avg_rank_ci': s.avg_rank_ci,
           'avg_pt': s.avg_pt, 'avg_pt_ci': s.avg_pt_ci}
    if reference is not None:
        paired = [n for n in nonces if n in reference]
        if not paired:
            raise KeyError(f'the reference has none of the {len(nonces)} deals')
        diffs = [sum(units[n]) / len(units[n]) - sum(reference[n]) / len(reference[n]) for n in paired]
        out['paired_diff'], out['paired_diff_ci'] = mean_ci(diffs)
        out['unpaired'] = len(nonces) - len(paired)
    return out


def format_summary(s: Mapping) -> str:
    """One line: ``2.431 ± 0.040 rank, +5.12 ± 3.10 pt, paired diff -0.069 ± 0.040 (1600 games)``."""
    text = f"{s['avg_rank']:.3f} ± {s['avg_rank_ci']:.3f} rank, {s['avg_pt']:+.2f} ± {s['avg_pt_ci']:.2f} pt"
    if 'paired_diff' in s and not math.isnan(s['paired_diff_ci']):
        text += f", paired diff {s['paired_diff']:+.3f} ± {s['paired_diff_ci']:.3f}"
    if s.get('unpaired'):
        text += f" ({s['unpaired']} deals unpaired)"
    note = unreliable_note(s['deals'])
    return text + f" ({s['games']} games{'; ' + note if note else ''})"
