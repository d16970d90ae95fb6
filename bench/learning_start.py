"""The converged start of ``bench/learning.py`` (``start-curve``): how many rule-based hanchan the offline model and
the GRP need before their validation loss stops falling, measured, and the start built at that count.

Every point of the curve uses the same games: the largest count is played once into ``OUT/curve/logs`` (train,
plus ``--val-games`` held-out validation hanchan on the next seed key), and each point takes the first N of them
(``link_logs``). Per point:

* ``OUT/curve/grp_N``: a GRP trained on the N hanchan, early-stopped on the validation logs' cross entropy; its
  validation cross entropy is the curve's GRP column (uniform: ln 24 = 3.178).
* ``OUT/curve/gN/start``: a whole start (``make_start``): the offline model trained on the N hanchan with the
  bootstrap's early stopping on the validation loss. Its reward model is the GRP of the *largest* count for every
  point (``--reward-games``: another count's): the offline loss includes the Monte-Carlo targets, whose scale
  depends on the reward model, so only with one reward model are the points' validation losses comparable.

The count picked (``pick_count``): the smallest N whose next point lowers the validation loss by less than
``gain`` (a fraction of N's loss); the largest when every step still gains more (the curve has not flattened).
``OUT/start`` is then a link to that point's start, which the arms reuse.
"""

import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from learning_arms import link_logs, make_start, start_config  # noqa: E402

# [bootstrap] of every curve point: room for the GRP to converge on thousands of hanchan (at most 2,000 steps of 64,
# stopped after 30 validations, 300 steps, without a new lowest cross entropy: it moves by about 0.1 from one
# validation to the next) and the offline run's early stopping (the embedded config's 3 epochs, patience 1)
CURVE_BOOT = {'grp_steps': 2000, 'grp_patience': 30, 'offline_max_epochs': 3, 'offline_patience': 1}


def pick_count(points, gain):
    """``(N, flattened)``: the smallest hanchan count of ``points`` (``[(N, validation loss)]``, any order) whose next
    larger count lowers the loss by less than ``gain`` x its loss, and True; the largest count and False when
    every step gains more (or there is one point)."""
    pts = sorted(points)
    for (n, loss), (_, nxt) in zip(pts, pts[1:]):
        if loss - nxt < gain * loss:
            return n, True
    return pts[-1][0], False


def curve_table(rows, gain):
    """The curve as Markdown lines. ``rows``: one dict per point (``games``, ``val_loss``, ``best_epoch``,
    ``epochs``, ``grp_ce``, ``play_s``, ``grp_s``, ``offline_s``), any order; the gain column is the relative drop
    of the validation loss to the next point, and the last line names the count ``pick_count`` picks."""
    rows = sorted(rows, key=lambda r: r['games'])
    lines = ['| hanchan | offline val loss | epoch kept / run | gain to next | GRP val CE | play min | GRP min | '
             'offline min |', '|---|---|---|---|---|---|---|---|']
    for i, r in enumerate(rows):
        nxt = rows[i + 1]['val_loss'] if i + 1 < len(rows) else None
        drop = '-' if nxt is None else f"{(r['val_loss'] - nxt) / r['val_loss']:+.1%}"
        lines.append(f"| {r['games']} | {r['val_loss']:.4f} | {r['best_epoch']} / {r['epochs']} | {drop} | "
                     f"{r['grp_ce']:.3f} | {r['play_s'] / 60:.1f} | {r['grp_s'] / 60:.1f} | "
                     f"{r['offline_s'] / 60:.1f} |")
    n, flat = pick_count([(r['games'], r['val_loss']) for r in rows], gain)
    lines.append(f"\npicked: {n} hanchan ({'the next point gains less than' if flat else 'not flattened: every step gains at least'} "
                 f"{gain:.0%} of the validation loss)")
    return lines


def play_seconds(log_dir, games):
    """Wall seconds the first ``games`` training hanchan of ``log_dir/train`` took to play, from the write times of
    their logs (first to last, plus one deal's share); 0 when there are fewer than two deals."""
    times = {}
    for p in pathlib.Path(log_dir, 'train').glob('*.json.gz'):
        nonce = int(p.name.split('_')[0])
        if nonce < -(-games // 4):
            times[nonce] = max(times.get(nonce, 0.0), p.stat().st_mtime)
    if len(times) < 2:
        return 0.0
    span = max(times.values()) - min(times.values())
    return span * len(times) / (len(times) - 1)


def shared_logs(out, *, games, val_games, version, progress):
    """Play (resumable) the curve's games: ``games`` training and ``val_games`` validation hanchan with the
    quickstart's ``[bootstrap]`` keys, in ``OUT/curve/logs`` (its processes: ``[bootstrap] workers``, 0 = one per
    CPU). Returns the log dir."""
    import toml
    from mortal.tools import bootstrap
    from mortal.tools.quickstart_config import render_config

    log_dir = pathlib.Path(out, 'curve', 'logs').resolve()
    cfg = toml.loads(render_config(pathlib.Path(out, 'curve', 'gen').resolve(), preset='full', version=version))
    cfg['bootstrap'].update(games=games, val_games=val_games, log_dir=str(log_dir))
    bootstrap.gen_logs(cfg, progress=progress)
    return log_dir


def grp_point(out, games, *, version, logs, boot, progress):
    """A GRP trained (early-stopped) on the first ``games`` hanchan of ``logs``, in ``OUT/curve/grp_N``:
    ``{'grp_file', 'grp_ce' (validation cross entropy, nats), 'grp_s' (seconds)}``."""
    from mortal.config import load_config, typed
    from mortal.tools import bootstrap

    cfg_path = start_config(pathlib.Path(out, 'curve', f'grp_{games}').resolve(), version=version, games=games,
                            boot=boot)
    config = load_config(cfg_path)
    b = bootstrap.bootstrap_config(config)
    link_logs(logs, b.log_dir, games, b.seed_key)
    t = time.monotonic()
    bootstrap.train_grp(config, progress=progress)
    ce = bootstrap.check_grp(config)['ce']
    return {'grp_file': typed(config).grp.state_file, 'grp_ce': ce, 'grp_s': time.monotonic() - t}


def offline_point(out, games, *, version, logs, grp_file, boot, progress):
    """The start on the first ``games`` hanchan of ``logs`` with the reward model ``grp_file``, in
    ``OUT/curve/gN/start``: ``{'start', 'val_loss' (the kept epoch's), 'best_epoch', 'epochs', 'offline_s'}``."""
    from mortal.tools.offline_epochs import read_history
    t = time.monotonic()
    start = make_start(pathlib.Path(out, 'curve', f'g{games}'), version=version, games=games, grp_games=0,
                       progress=progress, boot=boot, logs=logs, grp=grp_file)
    hist = [h for h in read_history(start / 'bootstrap' / 'offline' / 'epochs.json') if h['val_loss'] is not None]
    best = min(range(len(hist)), key=lambda i: hist[i]['val_loss'])
    return {'start': str(start), 'val_loss': hist[best]['val_loss'], 'best_epoch': hist[best]['epoch'],
            'epochs': len(hist), 'offline_s': time.monotonic() - t}


def start_curve(out, games, *, version, val_games, max_epochs, gain, progress, log, reward_games=0):
    """The curve (module docstring): plays the games, trains each point (results kept in ``OUT/curve/curve.json``,
    so a rerun skips the points done), prints the table and links ``OUT/start`` to the picked point's start
    unless ``OUT/start`` exists. ``reward_games``: the count whose GRP is every point's reward model (0 = the
    largest; one of ``games``), so that larger counts can join a curve later. Returns ``(table lines, picked
    count)``. Raises SystemExit on a count that is not a positive multiple of 4, or when the recorded points used
    another reward model."""
    games = sorted(set(games))
    if any(n <= 0 or n % 4 for n in games):
        raise SystemExit(f'--games {games}: each count must be a positive multiple of 4 (4 seat rotations a deal)')
    reward_games = reward_games or games[-1]
    if reward_games not in games:
        raise SystemExit(f'--reward-games {reward_games}: not one of --games {games}')
    path = pathlib.Path(out, 'curve', 'curve.json')
    rec = json.loads(path.read_text()) if path.exists() else {'reward_games': reward_games, 'points': {}}
    if rec['reward_games'] != reward_games and any('val_loss' in p for p in rec['points'].values()):
        raise SystemExit(f'{path}: its offline points use the GRP of {rec["reward_games"]} hanchan as the reward, '
                         f'not of {reward_games}: pass --reward-games {rec["reward_games"]}, or use another --out')
    rec['reward_games'] = reward_games
    points = rec['points']
    boot = {**CURVE_BOOT, 'val_games': val_games, 'offline_max_epochs': max_epochs}
    t = time.monotonic()
    logs = shared_logs(out, games=games[-1], val_games=val_games, version=version, progress=progress)
    log(f'curve: {games[-1]} + {val_games} validation hanchan in {logs} ({time.monotonic() - t:.0f} s this run)')

    def save():
        tmp = path.with_suffix('.tmp')
        tmp.write_text(json.dumps(rec, indent=1))
        os.replace(tmp, path)

    for n in games:  # the GRPs first: one of them (reward_games) is every offline point's reward model
        p = points.setdefault(str(n), {'games': n})
        if 'grp_ce' not in p:
            p.update(grp_point(out, n, version=version, logs=logs, boot=boot, progress=progress))
            p['play_s'] = play_seconds(logs, n)
            save()
        log(f'curve {n}: GRP val CE {p["grp_ce"]:.4f} ({p["grp_s"]:.0f} s)')
    for n in games:
        p = points[str(n)]
        if 'val_loss' not in p:
            p.update(offline_point(out, n, version=version, logs=logs, grp_file=points[str(reward_games)]['grp_file'],
                                   boot=boot, progress=progress))
            save()
        log(f'curve {n}: offline val loss {p["val_loss"]:.4f} (epoch {p["best_epoch"]} of {p["epochs"]}; '
            f'{p["offline_s"]:.0f} s)')
    rows = [points[str(n)] for n in games]
    table = curve_table(rows, gain)
    picked, _ = pick_count([(r['games'], r['val_loss']) for r in rows], gain)
    link = pathlib.Path(out, 'start')
    if not link.exists() and not link.is_symlink():
        link.symlink_to(os.path.relpath(points[str(picked)]['start'], link.parent.resolve()))  # movable with OUT
        log(f'{link} -> {points[str(picked)]["start"]}')
    else:
        log(f'{link} exists ({link.resolve()}): left as it is')
    return table, picked
