#!/usr/bin/env python
"""Learning benchmark: does online training make the model stronger? Real processes, duplicate evaluation.

    python bench/learning.py [--out work/learning] start [--version 3] [--games 96] [--grp-games 0]
    python bench/learning.py start-curve --games 96 384 1536 [--val-games 64] [--gain 0.02] [--rulebase-sets 40]
    python bench/learning.py run ARM [--set SECTION.KEY=VALUE ...] [--steps N | --minutes M] [--eval-sets 400]
    python bench/learning.py offline ARM [--epochs 2] [--lr 1e-5] [--freeze-bn]   # control: offline data only
    python bench/learning.py eval ARM            # (re)evaluate an arm's checkpoints
    python bench/learning.py flaw NAME [--minutes 30] [--set ...]   # planted flaw: online vs offline-only control
    python bench/learning.py report              # table of every arm + learning-curve PNG

``start`` makes the start point with the quickstart's bootstrap (rule-based games -> GRP -> offline CQL model) in
``OUT/start`` (``--games`` training hanchan; ``--grp-games`` extra hanchan for the GRP only, 0 = none), both early-
stopped on the validation logs. ``start-curve`` measures how many hanchan that takes (the validation loss against
the hanchan count, ``bench/learning_start.py``) and links ``OUT/start`` to the start at the count it picks. With
``--rulebase-sets`` both play the start against 3 RulebaseBots (kept in ``OUT/start_units.json``, as the arms').

``run ARM`` copies the start model into ``OUT/arms/ARM`` (trainee = baseline = start), writes the quickstart's
embedded config with the ``--set`` overrides (TOML values, e.g. ``--set optim.scheduler.peak=0``), runs the real
server, trainer and client until the trainer's checkpoint is ``--steps`` steps past the start (or ``--minutes``
have passed), keeping a snapshot of ``state_file`` every ``--snapshot-every`` steps, then evaluates:

* the start model, ``best.pth`` and the final ``state_file``, each as the challenger against 3x the start model, on
  the same ``--eval-sets`` duplicate deals (4 seat rotations each), greedy, with the agari guard: avg rank and avg
  pt with 95% CIs over deals, and the paired difference to the start model per deal;
* each snapshot on the first ``--curve-sets`` of those deals (the curve);
* the start and the final model against 3 mjai RulebaseBots on ``--rulebase-sets`` deals, with the paired
  difference final - start.

The start model against 3 copies of itself plays each deal's four rotations identically and scores exactly 2.5;
the control arm (learning rate 0: ``--set optim.scheduler.peak=0 --set optim.scheduler.final=0 --set
optim.scheduler.init=0``) must come out even too, which shows that neither seats, exploration nor the test-play
machinery bias the numbers. ``offline ARM`` is the control for the offline mix (``[online] offline_batch_size``):
the start's offline run continued for ``--epochs`` more epochs of the bootstrap logs, no self-play, each epoch
evaluated like best/final. Results go to ``OUT/arms/ARM/result.json``; ``report`` prints the table and writes
``OUT/learning_curve.png``. Deals: nonces from 10000 with seed key ``--key`` (disjoint from the self-play keys).
"""

import argparse
import json
import math
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EVAL_KEY = 0x6c6561726e  # 'learn': duplicate key of the evaluation deals


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from learning_arms import (  # noqa: E402  the start, the arms and the offline-only control (shared with learning_flaw)
    check_marks, checkpoint_steps, control_steps, make_start, parse_sets, run_arm, run_offline)
from learning_start import start_curve  # noqa: E402  the converged start
from mortal.play.evaluation import (  # noqa: E402
    SUMMARY_FIELDS, format_summary as fmt, play_chunk as _play, play_duplicate, summarize)
from mortal.play.duplicate import unreliable_note  # noqa: E402


def play_units(chal, champ, *, sets, key, workers, chunk):
    """``{nonce: [4 ranks]}`` of ``chal`` against 3x ``champ`` on ``sets`` deals from SEED_START."""
    return play_duplicate(chal, champ, sets=sets, key=key, workers=workers, chunk=chunk)


def evaluate_arm(out, arm, *, eval_sets, curve_sets, rulebase_sets, workers, key, log):
    """Evaluate an arm's start/best/final/snapshots; merges into ``result.json`` and returns it."""
    start = pathlib.Path(out, 'start').resolve()
    arm_dir = pathlib.Path(out, 'arms', arm).resolve()
    start_file = str(start / 'online' / 'baseline.pth')
    res_path = arm_dir / 'result.json'
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    start_units = start_units_cache(out, start_file, key=key, workers=workers, log=log)
    ref = start_units('self', eval_sets)
    models = arm_models(arm_dir, start_file)
    res['vs_start'], res['units'] = {}, {}
    for label, state_file in models.items():
        if not os.path.exists(state_file):
            if label in ('best', 'final') and not (arm_dir / 'online').exists():
                continue  # the offline-only control has epochs instead
            log(f'[{arm}] {label}: {state_file} does not exist (no test play yet): not evaluated')
            continue
        t = time.monotonic()
        units = ref if label == 'start' else play_units(
            ('mortal', state_file), ('mortal', start_file), sets=eval_sets, key=key, workers=workers,
            chunk=max(1, eval_sets // (4 * workers)))
        res['vs_start'][label] = summarize(units, ref)
        res['units'][label] = {str(n): r for n, r in sorted(units.items())}  # per deal, for bench/sprt_cost.py
        log(f'[{arm}] {label} vs 3x start: {fmt(res["vs_start"][label])} ({time.monotonic() - t:.0f} s)')
    res['curve'] = snapshot_curve(arm_dir, arm, start_file, ref, curve_sets=curve_sets, key=key, workers=workers,
                                  log=log)
    if os.path.exists(models['best']):
        res['best_step'] = checkpoint_steps(models['best']) - checkpoint_steps(start_file)
    res['mark_steps'] = {label: checkpoint_steps(f) - checkpoint_steps(start_file)
                         for label, f in models.items() if '@' in label or label.startswith('epoch_')}
    if rulebase_sets:
        res['vs_rulebase'] = vs_rulebase(arm_dir, arm, start_units('rulebase', rulebase_sets),
                                         rulebase_sets=rulebase_sets, key=key, workers=workers, log=log)
    res['diagnostics'] = read_diag(arm_dir)
    res['eval_key'] = key  # the deals' key: report pairs two arms by deal only where it is the same
    res_path.write_text(json.dumps(res, indent=1))
    return res


def start_units_cache(out, start_file, *, key, workers, log):
    """``start_units(kind, sets)``: the start's ``{nonce: [4 ranks]}`` against 3x itself (``kind='self'``) or 3
    RulebaseBots (``'rulebase'``) on ``sets`` deals, played once and kept in ``OUT/start_units.json``."""
    cache = pathlib.Path(out, 'start_units.json')
    cached = json.loads(cache.read_text()) if cache.exists() else {}

    def start_units(kind, sets):
        tag = f'{kind}:{sets}:{key}'
        if tag not in cached:
            champ = ('mortal', start_file) if kind == 'self' else ('rulebase', None)
            t = time.monotonic()
            cached[tag] = play_units(('mortal', start_file), champ, sets=sets, key=key, workers=workers,
                                     chunk=max(1, sets // (4 * workers)) if kind == 'self' else 2)
            cache.write_text(json.dumps(cached))
            log(f'start vs {kind}: {sets} deals in {time.monotonic() - t:.0f} s')
        return {int(k): v for k, v in cached[tag].items()}

    return start_units


def arm_models(arm_dir, start_file):
    """``{label: state file}`` of the models an arm's evaluation plays: start, best, final, the offline-only
    control's epochs and the ``--mark-minutes`` marks (e.g. ``best@030m``)."""
    models = {'start': start_file, 'best': str(arm_dir / 'online' / 'best.pth'), 'final': str(arm_dir / 'final.pth')}
    for epoch_file in sorted(arm_dir.glob('epoch_*.pth')):  # the offline-only control
        models[epoch_file.stem] = str(epoch_file)
    for mark in sorted((arm_dir / 'marks').glob('*_*m.pth')):  # run --mark-minutes: e.g. best@030m
        kind, tag = mark.stem.split('_', 1)
        models[f'{kind}@{tag}'] = str(mark)
    return models


def snapshot_curve(arm_dir, arm, start_file, ref, *, curve_sets, key, workers, log):
    """One point per snapshot (``snapshots/step_*.pth``): its summary against 3x the start on the first
    ``curve_sets`` deals, paired to the start's own ``ref``."""
    curve = []
    ref_curve = {n: ref[n] for n in sorted(ref)[:curve_sets]}
    for snap in sorted((arm_dir / 'snapshots').glob('step_*.pth')):
        units = play_units(('mortal', str(snap)), ('mortal', start_file), sets=curve_sets, key=key,
                           workers=workers, chunk=max(1, curve_sets // (2 * workers)))
        point = {'step': int(snap.stem.split('_')[1]), **summarize(units, ref_curve)}
        curve.append(point)
        log(f'[{arm}] curve step {point["step"]}: {fmt(point)}')
    return curve


def vs_rulebase(arm_dir, arm, ref_rb, *, rulebase_sets, key, workers, log):
    """``{'start': ..., 'best': ..., 'final': ...}``: the start's (``ref_rb``), ``best.pth``'s and the final
    model's summaries against 3 RulebaseBots, each model paired to the start's; a model whose file does not exist
    (an offline-only control has no ``best.pth``) is left out."""
    out = {'start': summarize(ref_rb)}
    log(f'[{arm}] start vs 3x rulebase: {fmt(out["start"])}')
    for label, state_file in (('best', arm_dir / 'online' / 'best.pth'), ('final', arm_dir / 'final.pth')):
        if not state_file.exists():
            continue
        t = time.monotonic()
        units = play_units(('mortal', str(state_file)), ('rulebase', None), sets=rulebase_sets,
                           key=key, workers=workers, chunk=2)
        out[label] = summarize(units, ref_rb)
        log(f'[{arm}] {label} vs 3x rulebase: {fmt(out[label])} ({time.monotonic() - t:.0f} s)')
    return out


def read_diag(arm_dir):
    """First and last value of each ``diag/*`` and ``test_play/avg_ranking`` scalar of the arm's online run."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
    out = {}
    tb = arm_dir / 'online' / 'tensorboard'
    if not tb.exists():
        return out
    acc = EventAccumulator(str(tb), size_guidance={SCALARS: 0})
    acc.Reload()
    for tag in acc.Tags().get('scalars', []):
        if tag.startswith('diag/') or tag in ('test_play/avg_ranking', 'loss/next_rank_loss'):
            ev = acc.Scalars(tag)
            out[tag] = {'first': ev[0].value, 'last': ev[-1].value, 'n': len(ev)}
    return out


# ---------------------------------------------------------------------------- report

def paired_line(online_arm, online, control_arm, control, log):
    """``ONLINE final - CONTROL final`` avg rank vs 3x the start, paired by deal on the deals both were played on
    (the same evaluation key only); None (with the reason logged) when they cannot be paired."""
    if online.get('eval_key') != control.get('eval_key'):
        log(f'report: {control_arm} and {online_arm} were evaluated on deals of other keys: not paired')
        return None
    if 'final' not in control.get('units', {}) or 'final' not in online.get('units', {}):
        return None
    shared = set(online['units']['final']) & set(control['units']['final'])  # deals both were played on
    if not shared:
        log(f'report: {control_arm} and {online_arm} share no evaluation deal: not paired')
        return None
    d = summarize({int(k): online['units']['final'][k] for k in shared},
                  {int(k): control['units']['final'][k] for k in shared})
    note = unreliable_note(d['deals'])
    return (f"\n{online_arm} final - {control_arm} final, avg rank vs 3x start paired by deal (below 0: the "
            f"online arm is better): {d['paired_diff']:+.3f} ± {d['paired_diff_ci']:.3f} ({d['games']} games"
            f"{'; ' + note if note else ''})")


def result_problem(res: dict) -> str:
    """What in an arm's ``result.json`` the report cannot read ('' when nothing): the fields it formats and plots,
    each of the type the bench writes (a hand-edited file may not be)."""
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    evals = lambda v: isinstance(v, dict) and all(  # noqa: E731
        isinstance(e, dict) and all(num(e.get(k)) for k in SUMMARY_FIELDS) for e in v.values())
    checks = {'vs_start': evals, 'vs_rulebase': evals,
              'curve': lambda v: isinstance(v, list) and all(
                  isinstance(p, dict) and all(num(p.get(k)) for k in ('step', 'avg_rank', 'avg_rank_ci')) for p in v),
              'sets': lambda v: isinstance(v, list) and all(isinstance(kv, list) and len(kv) == 2 for kv in v),
              'units': lambda v: isinstance(v, dict) and all(
                  isinstance(u, dict) and all(isinstance(r, list) and all(map(num, r)) for r in u.values())
                  for u in v.values()),
              'steps': num, 'best_step': num, 'hanchan': num, 'eval_key': num, 'matched': lambda v: isinstance(v, str)}
    bad = [k for k, ok in checks.items() if k in res and not ok(res[k])]
    return f"field(s) {', '.join(bad)} not of the type the bench writes" if bad else ''


def report(out, log, against=None):
    """Print one Markdown row per arm (stdout, no timestamps), each matched control's paired difference to its
    arm and, with ``against`` (an arm's name), every other arm's paired difference to that one; write
    ``OUT/learning_curve.png``."""
    table = lambda line: print(line, flush=True)  # noqa: E731
    rows = []
    for res_path in sorted(pathlib.Path(out, 'arms').glob('*/result.json')):
        try:
            res = json.loads(res_path.read_text())
        except (OSError, ValueError) as e:
            log(f'report: {res_path} skipped, not readable JSON: {e}')
            continue
        problem = 'not a JSON object' if not isinstance(res, dict) else result_problem(res)
        if problem:
            log(f'report: {res_path} skipped, {problem}')
            continue
        rows.append((res_path.parent.name, res))
    table('| arm | changes | steps | hanchan | best vs 3x start | final vs 3x start | final vs 3 RulebaseBots (paired '
          'to start) |')
    table('|---|---|---|---|---|---|---|')
    for arm, res in rows:
        vs = res.get('vs_start', {})
        rb = res.get('vs_rulebase', {})
        cell = lambda s: fmt(s) if s else '-'  # noqa: E731
        changes = ', '.join(f'{k}={v}' for k, v in res.get('sets', [])) or 'none'
        epochs = sorted((k for k in vs if k.startswith('epoch_')), key=lambda k: int(k.split('_')[1]))
        final = vs.get('final') or (vs[epochs[-1]] if epochs else None)  # offline control: its last epoch
        table(f"| {arm} | {changes} | {res.get('steps', '-')} | {res.get('hanchan', '-')} | {cell(vs.get('best'))} | "
              f"{cell(final)} | "
              f"{cell(rb.get('final'))} |")
    pairs = [(res['matched'], arm) for arm, res in rows if res.get('matched') in dict(rows)]  # (online, control)
    if against is not None:  # every other arm against one control
        if against not in dict(rows):
            log(f'report: --against {against}: no such arm with a result')
        else:
            pairs += [(arm, against) for arm, _ in rows if arm != against and (arm, against) not in pairs]
    for online_arm, control_arm in pairs:
        line = paired_line(online_arm, dict(rows)[online_arm], control_arm, dict(rows)[control_arm], log)
        if line:
            table(line)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ci = lambda p: 0 if math.isnan(p['avg_rank_ci']) else p['avg_rank_ci']  # noqa: E731
    for arm, res in rows:
        pts = [{'step': 0, 'avg_rank': 2.5, 'avg_rank_ci': 0.0}] + res.get('curve', [])
        line = ax.errorbar([p['step'] for p in pts], [p['avg_rank'] for p in pts], yerr=[ci(p) for p in pts],
                           marker='o', ms=4, capsize=3, label=f'{arm} (snapshots)')
        color = line[0].get_color()
        vs = res.get('vs_start', {})
        if 'final' in vs:  # the full evaluation, drawn apart from the snapshot of the same step
            ax.errorbar([res.get('steps', 0)], [vs['final']['avg_rank']], yerr=[ci(vs['final'])], color=color,
                        marker='*', ms=11, capsize=4, ls='none')
        if 'best' in vs and 'best_step' in res:
            ax.errorbar([res['best_step']], [vs['best']['avg_rank']], yerr=[ci(vs['best'])], color=color,
                        marker='D', ms=6, capsize=4, ls='none', mfc='none')
    ax.axhline(2.5, color='grey', lw=0.8, ls='--')
    ax.set_xlabel('online steps')
    ax.set_ylabel('avg rank vs 3x start (lower is better)')
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.set_title('vs 3x the start model, 95% CI over deals; * final, ◇ best.pth (full evaluation)', fontsize=10)
    png = pathlib.Path(out, 'learning_curve.png')
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    log(f'curve: {png}')


def build_parser():
    """The command line: ``--out`` and the subcommands start, run, eval, offline, flaw and report."""
    from mortal import entry

    fmt_cls = argparse.ArgumentDefaultsHelpFormatter
    parser = entry.parser(__doc__.split('\n\n')[0], config=False, formatter_class=fmt_cls,
                          epilog='--out goes before the subcommand. What was measured: docs/learning.md')
    parser.add_argument('--out', default='work/learning', help='benchmark dir')
    sub = parser.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('start', help='bootstrap the start point into OUT/start', formatter_class=fmt_cls)
    p.add_argument('--version', type=int, choices=(3, 4), default=3, help='feature version')
    p.add_argument('--games', type=int, default=96, help='rule-based training hanchan (multiple of 4)')
    p.add_argument('--grp-games', type=int, default=0, help='extra rule-based hanchan for the GRP only')
    p.add_argument('--val-games', type=int, default=16, help='held-out validation hanchan (early stopping)')
    p.add_argument('--max-epochs', type=int, default=3, help='most offline epochs (early-stopped, patience 1)')
    _add_start_eval(p)
    p = sub.add_parser('start-curve', help='validation loss against teacher hanchan; OUT/start at the count it picks',
                       formatter_class=fmt_cls)
    p.add_argument('--version', type=int, choices=(3, 4), default=3, help='feature version')
    p.add_argument('--games', type=int, nargs='+', required=True, help='teacher hanchan counts (multiples of 4)')
    p.add_argument('--val-games', type=int, default=64, help='held-out validation hanchan, the same for each point')
    p.add_argument('--max-epochs', type=int, default=3, help='most offline epochs (early-stopped, patience 1)')
    p.add_argument('--gain', type=float, default=0.02,
                   help='pick the smallest count whose next point lowers the validation loss by less than this '
                        'fraction')
    p.add_argument('--reward-games', type=int, default=0,
                   help="the count whose GRP is every point's reward model (0 = the largest); keep it when adding "
                        'larger counts to a curve')
    _add_start_eval(p)
    _add_run_eval(sub, fmt_cls)
    _add_offline(sub, fmt_cls)
    _add_flaw(sub, fmt_cls)
    rep = sub.add_parser('report', help='Markdown table of every arm and OUT/learning_curve.png',
                         formatter_class=fmt_cls)
    rep.add_argument('--against', metavar='ARM', help='also pair every other arm, by deal, with this one (e.g. an '
                                                     'offline-only control)')
    return parser


def _add_start_eval(p):
    """``--rulebase-sets``, ``--workers`` and ``--key`` of ``start`` and ``start-curve``."""
    p.add_argument('--rulebase-sets', type=int, default=0, help='deals of the start vs 3 RulebaseBots (0 = skip)')
    p.add_argument('--workers', type=int, default=os.cpu_count() or 1, help='evaluation processes')
    p.add_argument('--key', type=int, default=EVAL_KEY, help='duplicate seed key of the evaluation deals')


def _add_run_eval(sub, fmt_cls):
    """The subcommands ``run`` (train one arm, then evaluate it) and ``eval``."""
    helps = {'run': 'train one arm with the real processes, then evaluate it',
             'eval': "(re)evaluate an arm's start/best/final/snapshots"}
    for name in ('run', 'eval'):
        p = sub.add_parser(name, help=helps[name], formatter_class=fmt_cls)
        p.add_argument('arm', help='arm name: its files go to OUT/arms/ARM')
        p.add_argument('--eval-sets', type=int, default=400, help='deals vs 3x start (4 games each)')
        p.add_argument('--curve-sets', type=int, default=100, help='deals per curve point')
        p.add_argument('--rulebase-sets', type=int, default=60, help='deals vs 3 RulebaseBots (0 = skip)')
        p.add_argument('--workers', type=int, default=os.cpu_count() or 1, help='evaluation processes')
        p.add_argument('--key', type=int, default=EVAL_KEY, help='duplicate seed key of the evaluation deals')
        if name == 'run':
            p.add_argument('--set', action='append', default=[], metavar='SECTION.KEY=VALUE',
                           help='repeatable TOML override of the quickstart embedded config (which sets '
                                'online.anchor_weight=1 and online.offline_batch_size=64)')
            p.add_argument('--steps', type=int, default=0,
                           help='stop after this many online steps (one of --steps/--minutes is required)')
            p.add_argument('--minutes', type=float, default=0, help='stop after this many minutes online')
            p.add_argument('--mark-minutes', type=float, action='append', default=[], metavar='M',
                           help='keep best.pth and the state at M minutes online; evaluated like best/final')
            p.add_argument('--clients', type=int, default=1,
                           help='self-play clients (the 2nd and later on [train_play.client2] ...)')
            p.add_argument('--snapshot-every', type=int, default=500,
                           help='copy state_file every N steps for the curve (best effort: the checkpoint is '
                                'looked at every 5 s; 0 = none)')


def _add_offline(sub, fmt_cls):
    """The subcommand ``offline``: the offline-only control."""
    p = sub.add_parser('offline', help='the offline-only control: more offline epochs from the start, evaluated',
                       formatter_class=fmt_cls)
    p.add_argument('arm', help='arm name: its files go to OUT/arms/ARM')
    p.add_argument('--epochs', type=int, default=2, help='more epochs of the bootstrap logs')
    p.add_argument('--lr', type=float, default=1e-5, help='constant learning rate')
    p.add_argument('--freeze-bn', action='store_true', help='keep BatchNorm frozen, as the online learner does')
    p.add_argument('--matched', metavar='ARM', default='',
                   help="instead of --epochs, --lr and --freeze-bn: as many offline samples as online arm ARM's offline mix drew (its "
                        'steps x offline_batch_size rows), at its learning rate, BatchNorm frozen; final.pth is '
                        'evaluated as ARM is (curve, RulebaseBots) and paired with it by deal')
    p.add_argument('--eval-sets', type=int, default=400, help='deals vs 3x start (4 games each)')
    p.add_argument('--curve-sets', type=int, default=100, help='deals per curve point (with --matched)')
    p.add_argument('--rulebase-sets', type=int, default=60, help='deals vs 3 RulebaseBots (with --matched)')
    p.add_argument('--snapshot-every', type=int, default=500, help='snapshot every N steps (with --matched)')
    p.add_argument('--workers', type=int, default=os.cpu_count() or 1, help='evaluation processes')
    p.add_argument('--key', type=int, default=EVAL_KEY, help='duplicate seed key of the evaluation deals')


def _add_flaw(sub, fmt_cls):
    """The subcommand ``flaw``: the planted-flaw benchmark (``bench/learning_flaw.py``)."""
    p = sub.add_parser('flaw', help='the planted-flaw benchmark: a flawed start, online vs offline-only control '
                       '(bench/learning_flaw.py)', formatter_class=fmt_cls)
    from mortal.play.flaws import FLAWS
    p.add_argument('name', choices=sorted(FLAWS), help='the flaw (mortal.play.flaws)')
    p.add_argument('--games', type=int, default=96, help='flawed rule-based training hanchan (multiple of 4)')
    p.add_argument('--set', action='append', default=[], metavar='SECTION.KEY=VALUE',
                   help="repeatable TOML override of the online arm's config (the quickstart's embedded config)")
    p.add_argument('--steps', type=int, default=0, help='online steps (one of --steps/--minutes is required)')
    p.add_argument('--minutes', type=float, default=0, help='minutes online')
    p.add_argument('--snapshot-every', type=int, default=1000, help='snapshot both arms every N steps (the curve)')
    p.add_argument('--eval-sets', type=int, default=200, help='deals vs 3x the flawed start (4 games each)')
    p.add_argument('--curve-sets', type=int, default=50, help='deals per curve point')
    p.add_argument('--teacher-sets', type=int, default=50, help='deals of the teacher (RulebaseBot) vs 3x start')
    p.add_argument('--workers', type=int, default=os.cpu_count() or 1, help='evaluation processes')
    p.add_argument('--key', type=int, default=EVAL_KEY, help='duplicate seed key of the evaluation deals')
    p.add_argument('--arm', default='online', help='name of the online arm (another name adds an arm, e.g. a '
                   'lever, from the same start and control)')
    p.add_argument('--eval-only', action='store_true', help='only (re)evaluate the finished arms')


def main(argv=None):
    import logging
    import signal

    from mortal import entry
    from mortal.tools.quickstart import _exit_on_sigterm
    # a SIGTERM unwinds through run_arm's finally, which stops the arm's server, learner and client (a killed
    # benchmark left them running, and a later run of the same arm shared their buffer folder)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = build_parser()
    os.environ.setdefault('OMP_NUM_THREADS', '1')  # before anything loads numpy or torch
    args = entry.start(parser, argv, log_level=logging.WARNING)
    log = lambda msg: print(time.strftime('%H:%M:%S'), msg, flush=True)  # noqa: E731
    out = pathlib.Path(args.out)
    if args.cmd in ('start', 'start-curve'):
        if args.cmd == 'start':
            if args.games <= 0 or args.games % 4:
                parser.error(f'--games {args.games}: a positive multiple of 4 (4 seat rotations a deal)')
            boot = {'val_games': args.val_games, 'offline_max_epochs': args.max_epochs}
            log(f'start point: {make_start(out, version=args.version, games=args.games, grp_games=args.grp_games, progress=False, boot=boot)}')
        else:
            table, _ = start_curve(out, args.games, version=args.version, val_games=args.val_games,
                                   max_epochs=args.max_epochs, gain=args.gain, progress=False, log=log,
                                   reward_games=args.reward_games)
            print('\n'.join(table), flush=True)
        if args.rulebase_sets:
            start_file = str(pathlib.Path(out, 'start', 'online', 'baseline.pth').resolve())
            units = start_units_cache(out, start_file, key=args.key, workers=args.workers, log=log)(
                'rulebase', args.rulebase_sets)
            log(f'start vs 3 RulebaseBots: {fmt(summarize(units))} (the teacher itself: 2.500, four copies of one '
                'deterministic bot)')
        return 0
    if args.cmd == 'report':
        if not (out / 'arms').is_dir():
            parser.error(f'--out {out}: no arms there (OUT/arms/ARM, written by run, offline and flaw)')
        report(out, log, against=args.against)
        return 0
    if args.cmd == 'flaw':
        if not (args.steps or args.minutes or args.eval_only):
            parser.error('flaw needs --steps or --minutes (or --eval-only)')
        import learning_flaw  # imports learning_arms, not this script
        learning_flaw.run(out, args.name, games=args.games, sets=parse_sets(args.set), steps=args.steps,
                          minutes=args.minutes, snapshot_every=args.snapshot_every, eval_sets=args.eval_sets,
                          curve_sets=args.curve_sets, teacher_sets=args.teacher_sets, workers=args.workers,
                          key=args.key, eval_only=args.eval_only, log=log, arm=args.arm)
        return 0
    if args.cmd == 'run':
        if not (args.steps or args.minutes):
            parser.error('run needs --steps or --minutes')
        if args.clients < 1:
            parser.error(f'--clients {args.clients}: at least 1')
        problem = check_marks(args.mark_minutes, args.minutes)
        if problem:
            parser.error(problem)
        info = run_arm(out, args.arm, sets=parse_sets(args.set), steps=args.steps, minutes=args.minutes,
                       snapshot_every=args.snapshot_every, log=log, mark_minutes=args.mark_minutes,
                       clients=args.clients)
        res_path = out / 'arms' / args.arm / 'result.json'
        res_path.write_text(json.dumps(info, indent=1))
    if args.cmd == 'offline':
        info = run_matched(out, args.arm, args.matched, args.snapshot_every, log) if args.matched else run_offline(
            out, args.arm, epochs=args.epochs, lr=args.lr, freeze_bn=args.freeze_bn, log=log)
        (out / 'arms' / args.arm / 'result.json').write_text(json.dumps(info, indent=1))
        if not args.matched:
            args.curve_sets, args.rulebase_sets = 0, 0
    evaluate_arm(out, args.arm, eval_sets=args.eval_sets, curve_sets=args.curve_sets,
                 rulebase_sets=args.rulebase_sets, workers=args.workers, key=args.key, log=log)
    return 0


def run_matched(out, arm, online_arm, snapshot_every, log):
    """The offline-only control matched to ``online_arm`` (as ``flaw``'s control): as many offline samples as
    its offline mix drew (``OUT/arms/ONLINE_ARM/result.json`` ``steps`` x ``[online] offline_batch_size`` rows, at
    ``[control] batch_size`` rows a step; as many steps where it mixes none), at its peak learning rate, BatchNorm
    frozen. Raises SystemExit when the online arm has not finished."""
    import toml
    arm_dir = pathlib.Path(out, 'arms', online_arm)
    if pathlib.Path(out, 'arms', arm).resolve() == arm_dir.resolve():
        raise SystemExit(f'offline --matched {online_arm}: the control needs a name of its own (it empties its arm dir)')
    if not (arm_dir / 'result.json').exists():
        raise SystemExit(f'offline --matched {online_arm}: {arm_dir / "result.json"} does not exist: run the arm first')
    try:
        steps = json.loads((arm_dir / 'result.json').read_text())['steps']
        cfg = toml.load(arm_dir / 'config.toml')
        mix = cfg['online'].get('offline_batch_size', 0)
        n = control_steps(steps, mix, cfg['control']['batch_size']) if mix else steps
        lr = cfg['optim']['scheduler']['peak']
    except (OSError, ValueError, KeyError, TypeError, toml.TomlDecodeError) as e:
        raise SystemExit(f'offline --matched {online_arm}: {arm_dir} is not a finished run arm '
                         f'(result.json steps, config.toml [online]/[control]/[optim]): {e!r}') from e
    log(f'[{arm}] matched to {online_arm}: {steps} online steps x {mix} offline rows -> {n} offline steps')
    info = run_offline(out, arm, epochs=0, lr=lr, freeze_bn=True, log=log, steps=n,
                       snapshot_every=snapshot_every)
    info['matched'] = online_arm
    return info


if __name__ == '__main__':
    sys.exit(main())
