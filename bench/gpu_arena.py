"""The ``arena_speculation`` part of ``bench/gpu.py`` (``--parts arena``): ``bench/arena.py`` with the self-play
network, ``speculate_passes`` off and on."""

import subprocess
import sys

from bench.gpu_common import ROOT, read_json


def part_arena(ctx):
    """``bench/arena.py`` with the self-play network (version 3, ``arena_seeds`` * 4 games in flight) on the bench's
    device, ``speculate_passes`` off then on, each in its own process within ``arena_cap_s``: games/s against the
    zero-cost floor of the same run, rows per forward while most games run, and with speculation the useful rows per
    turn (the arena's 0.8 N target of issue 16, measured so far on a CPU only, where speculation is slower)."""
    sizes = ctx['sizes']
    out = {'games': 4 * sizes['arena_seeds'], 'network': f"{sizes['channels']}x{sizes['blocks']}"}
    for arm in ('off', 'on'):
        cap = ctx['cap'](sizes['arena_cap_s'])
        if cap < 10:
            out[arm] = {'status': f'skipped: only {cap:.0f} s of the budget left'}
            continue
        figures = ctx['work'] / f'arena_{arm}.json'
        args = [sys.executable, str(ROOT / 'bench' / 'arena.py'), '--device', ctx['device'], '--version', '3',
                '--channels', str(sizes['channels']), '--blocks', str(sizes['blocks']),
                '--seeds', str(sizes['arena_seeds']), '--speculate', arm, '--bound-width', '0', '--json', str(figures)]
        p = ctx['popen'](args, f'arena_{arm}')
        try:
            rc = p.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            ctx['kill'](p)
            rc = None
        rec = read_json(figures)
        if rc == 0 and rec:
            out[arm] = {'status': 'ok', **rec}
        else:
            out[arm] = {'status': f"failed: {'out of time' if rc is None else f'exit {rc}'} (see logs/arena_{arm}.log)"}
    on, off = out.get('on') or {}, out.get('off') or {}
    if on.get('status') == off.get('status') == 'ok':
        out['games_per_s_on_over_off'] = round(on['model_games_per_s'] / off['model_games_per_s'], 3)
    return out

