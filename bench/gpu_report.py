"""The ``results.md`` of ``bench/gpu.py``: one Markdown row per figure of ``results.json``, written after every part
(dashes until a part ends; a part that failed or was skipped shows why)."""

from bench.gpu_common import GIB


def table(results):
    """The short Markdown table of ``results``."""
    meta = results.get('meta', {})
    lines = [f"# bench/gpu.py ({meta.get('mode')}, {meta.get('device_name')}, torch {meta.get('torch')})", '',
             '| part | figure | value |', '|---|---|---|']
    setup = results.get('setup') or {}
    lines.append(f"| setup | {setup.get('status')} | {_fmt(setup.get('seconds'))} s |")
    if meta.get('parts', 'all') == 'all':  # the rows of the default run (dashes until a part ends)
        lines += _default_rows(results)
    ar = results.get('arena_speculation')
    if ar:
        lines += _arena_rows(ar)
    for name, err in (results.get('errors') or {}).items():
        lines.append(f'| {name} | FAILED | {err.splitlines()[-1][:100] if err else ""} |')
    lines.append(f"\ntotal {_fmt(meta.get('total_s'))} s of a {meta.get('budget_s')} s budget")
    return '\n'.join(lines) + '\n'


def _fmt(x, digits=1):
    """A figure for a cell: ``digits`` decimals for a float, thousands separated; a dash for None."""
    return '-' if x is None else (f'{x:,.{digits}f}' if isinstance(x, float) else f'{x:,}')


def _gib(x):
    """Bytes as GiB for a cell; a dash for None."""
    return '-' if x is None else f'{x / GIB:.2f}'


def _failed(*records):
    """The status of the first of ``records`` (the part's record, then the figure's own entry) that ended other
    than 'ok', as one cell: a part that failed or was skipped shows why (as results.json has it), not dashes that
    look like a part still running. None when none did."""
    for rec in records:
        status = (rec or {}).get('status')
        if status is not None and status != 'ok':
            # one line, '|' escaped: an exception's text must not end the row
            return (str(status).splitlines() or ['-'])[0].replace('|', '\\|')
    return None


def _default_rows(results):
    """The rows of the default run: profile, self-play sweep, trainer, memory, online."""
    lines = _profile_rows(results.get('profile'))
    sp = results.get('selfplay_sweep') or {}
    if _failed(sp):
        lines.append(f"| self-play sweep | hanchan/h | {_failed(sp)} |")
    for v in (3, 4):
        for n, e in sorted((sp.get(f'v{v}') or {}).items(), key=lambda item: int(item[0])):
            lines.append(f"| self-play v{v}, {n} client(s) | hanchan/h [games finished, basis] (rows/s) | "
                         f"{_failed(e) or _sweep_cell(e)} |")
    tr = results.get('trainer') or {}
    for key in ('amp_off', 'amp_on'):
        value = _failed(tr, tr.get(key)) or _fmt((tr.get(key) or {}).get('steps_per_s'), 2)
        lines.append(f"| trainer {key} | steps/s at batch {tr.get('batch_size')} | {value} |")
    memory = results.get('memory') or {}
    if _failed(memory):  # a failed part has no rows to hold dashes: one row says why
        lines.append(f"| memory | GiB allocated / reserved / doctor | {_failed(memory)} |")
    for name, r in (memory.get('rows') or {}).items():
        lines.append(f"| memory {name} | GiB allocated / reserved / doctor | {_gib(r.get('allocated'))} / "
                     f"{_gib(r.get('reserved'))} / {_gib(r.get('doctor_estimate'))} |")
    on = results.get('online') or {}
    idle = f"{_fmt(on.get('idle_fraction'), 3)} ({_fmt(on.get('idle_fraction_after_first_drain'), 3)})"
    lines.append(f"| online {_fmt(on.get('window_s'))} s | learner idle fraction (after 1st drain) | "
                 f"{_failed(on) or idle} |")
    played = (f"{_fmt(on.get('selfplay_hanchan_per_hour'))}, {_fmt(on.get('steps'))} "
              f"({_fmt(on.get('steps_per_s'), 2)}/s)")
    lines.append(f"| online, {_fmt(on.get('clients'))} clients | self-play hanchan/h beside the learner, steps trained "
                 f"(per s) | {_failed(on) or played} |")
    return lines


def _sweep_cell(e):
    """One count of the sweep: hanchan/h from finished games with their count and basis, or the estimate from rows
    named as such when no game finished."""
    rows = _fmt(e.get('rows_per_s'))
    if e.get('hanchan_per_hour') is not None:
        return f"{_fmt(e['hanchan_per_hour'])} [{e.get('games_finished')} games, {e.get('basis')}] ({rows})"
    est = e.get('hanchan_per_hour_from_rows')
    return (f"no game finished in {_fmt(e.get('seconds'))} s; estimate from rows {_fmt(est)} ({rows})"
            if e.get('seconds') is not None else f"- ({rows})")


def _profile_rows(pr):
    """The rows of the profile part (none before it ends)."""
    if not pr:
        return []
    if _failed(pr):
        return [f"| profile | one client's cycle | {_failed(pr)} |"]
    sp, prof = pr.get('split') or {}, pr.get('profiler') or {}
    lines = [f"| profile v{pr.get('version')}, {pr.get('games')} games | ms per cycle: arena / engine (its CPU) | "
             + (_failed(sp) or f"{_fmt(sp.get('cycle_ms'))}: {_fmt(sp.get('arena_ms'))} / {_fmt(sp.get('engine_ms'))} "
                                f"({_fmt(sp.get('engine_cpu_ms'))}), {_fmt(sp.get('rows_per_forward'))} rows |")]
    rt = prof.get('runtime_cpu_ms') or {}
    lines.append("| profile | GPU busy ms, kernels per forward; runtime CPU ms launch / copy / sync | "
                 + (_failed(prof) or f"{_fmt(prof.get('gpu_busy_ms'))}, {_fmt(prof.get('kernels_per_forward'))}; "
                                     f"{_fmt(rt.get('launch'))} / {_fmt(rt.get('memcpy'))} / "
                                     f"{_fmt(rt.get('synchronize'))} |"))
    return lines


def _arena_rows(ar):
    """The rows of the arena's speculation arms."""
    lines = []
    for arm in ('off', 'on'):
        e = ar.get(arm) or {}
        value = _failed(e) or (f"{_fmt(e.get('rows_per_forward_80'), 2)} "
                               f"({_fmt(e.get('useful_per_turn_80', e.get('rows_per_forward_80')), 2)}); "
                               f"{_fmt(e.get('model_floor_ratio'), 3)}")
        lines.append(f"| arena v3 {ar.get('network')}, {ar.get('games')} games, speculate {arm} | rows per forward "
                     f"(useful) while >= 80% run; games/s vs floor | {value} |")
    lines.append(f"| arena | games/s speculate on / off | {_fmt(ar.get('games_per_s_on_over_off'), 3)} |")
    return lines
