"""The planted-flaw benchmark of ``bench/learning.py flaw NAME``: can self-play fix what the offline data taught
wrong?

``flaw NAME`` bootstraps a start from rule-based players that all carry one planted flaw (``mortal.play.flaws``;
``[bootstrap] flaw``), so the offline model inherits it, then trains two arms from that start:

* **online**: the real server, trainer and client on the quickstart's embedded config (``--set`` overrides), for
  ``--minutes`` (or ``--steps``), as ``run``;
* **control** (offline only): the start's offline run continued on the same flawed logs, with the same learning
  rate, frozen BatchNorm and as many offline samples as the online arm's offline mix drew (its steps times
  ``[online] offline_batch_size`` over the offline batch size), no self-play.

Then it plays, on the same ``--eval-sets`` duplicate deals against 3x the flawed start: the start itself, the
online arm's ``best.pth`` and final model, the control's final model, and (on ``--teacher-sets`` deals) the unflawed
teacher, mjai's ``RulebaseBot``. For each: avg rank with its 95% CI, the paired per-deal difference to the start,
and the flaw's statistic (``mortal.play.flaws.STATISTICS``, e.g. ``fuuro_rate`` for ``overcall``) with a 95% CI
that treats each deal as one cluster. The online arm's final model is also paired with the control's, deal by
deal. Snapshots of both arms (every ``--snapshot-every`` steps) are played on the first ``--curve-sets`` deals:
``OUT/flaws/NAME/flaw_NAME.png`` draws the statistic and the rank against steps. Everything goes to
``OUT/flaws/NAME/result.json``; ``flaw NAME --eval-only`` replays the evaluation of finished arms.

Next to each model it reports the instrument that says why a flaw stays: at the decisions of the start's
validation logs where the flaw acts, the mean margin by which the model's Q prefers the flaw's action to the
teacher's, and the probability that Boltzmann exploration picks the teacher's action (``q_margin``).

The issue's target, per flaw: the online arm removes at least half of the statistic's excess over the teacher
(``removed`` = (start - online) / (start - teacher)) and beats the control (paired CI below 0).
"""

import json
import math
import os
import pathlib
import shutil
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import learning_arms as learning  # noqa: E402  the start, the arms and the offline-only control
from learning_arms import control_steps  # noqa: E402,F401  (the flaw control's steps; tests reach it here)


def statistic_by_deal(log_dir, name):
    """``{nonce: (numerator, denominator)}`` of flaw ``name``'s statistic for the seat named ``challenger`` in
    every ``{nonce}_{key}_{split}.json.gz`` log of ``log_dir`` (``mortal.play.flaws.statistic_counts``)."""
    from mortal.data.mjai_log import read_log_text
    from mortal.play.flaws import statistic_counts
    out = {}
    for path in sorted(pathlib.Path(log_dir).glob('*.json.gz')):
        events = [json.loads(line) for line in read_log_text(path).splitlines() if line.strip()]
        seat = events[0]['names'].index('challenger')
        num, den = statistic_counts(name, events, seat)
        nonce = int(path.name.split('_')[0])
        n0, d0 = out.get(nonce, (0, 0))
        out[nonce] = (n0 + num, d0 + den)
    return out


def ratio_ci(by_deal, z=1.959964):
    """Ratio estimate ``sum(num) / sum(den)`` over deals and the half-width of its 95% CI, each deal one cluster
    (the linearised variance of a ratio estimator: ``sum((num_i - R den_i)^2) / (k (k - 1) mean(den)^2)``).
    Returns ``(ratio, half_width)``; ``nan`` half-width for fewer than 2 deals, ``nan`` ratio for no denominator."""
    pairs = list(by_deal.values())
    k = len(pairs)
    num = sum(p[0] for p in pairs)
    den = sum(p[1] for p in pairs)
    if not den:
        return math.nan, math.nan
    r = num / den
    if k < 2:
        return r, math.nan
    mean_den = den / k
    var = sum((n - r * d) ** 2 for n, d in pairs) / (k * (k - 1) * mean_den ** 2)
    return r, z * math.sqrt(var)


def removed_fraction(start, model, teacher):
    """The share of the start's excess over the teacher that ``model`` removed: ``(start - model) / (start -
    teacher)`` (1 = the teacher's value, 0 = the start's, negative = worse). ``nan`` when the start has no excess
    (``start == teacher``)."""
    excess = start - teacher
    return (start - model) / excess if excess else math.nan


DECISION_RULES = ('overcall', 'no-riichi')  # the flaws flaw_decisions can find in a legal mask


def flaw_decisions(name, masks):
    """``(rows, flawed, correct)`` of the decisions where flaw ``name`` acts, from legal masks ``(N, 46)`` bool:
    for ``overcall`` the rows where a chi or pon and the pass are legal (flawed: the calls, correct: the pass);
    for ``no-riichi`` the rows where riichi is legal (flawed: the discards, correct: riichi). ``rows`` is an index
    array, ``flawed`` a boolean ``(46,)`` mask of the flaw's actions and ``correct`` the teacher's action index."""
    import numpy as np
    from mortal.features.action import CHI_HIGH, CHI_LOW, PASS, PON, RIICHI
    flawed = np.zeros(masks.shape[1], dtype=bool)
    if name == 'overcall':
        flawed[CHI_LOW:PON + 1] = True
        rows = np.flatnonzero(masks[:, PASS] & masks[:, CHI_LOW:PON + 1].any(axis=1))
        return rows, flawed, PASS
    if name == 'no-riichi':
        flawed[:RIICHI] = True
        return np.flatnonzero(masks[:, RIICHI]), flawed, RIICHI
    raise ValueError(f'no decision rule for flaw {name!r}')


def q_margin(state_file, log_files, name, temps=(0.05, 1.0)):
    """How far ``state_file``'s Q values keep the teacher's action from being explored, at the decisions of
    ``log_files`` (every seat) where flaw ``name`` acts (``flaw_decisions``): ``margin`` (mean of the best flawed
    action's Q minus the correct action's, in ``[env] pts`` units), ``greedy_correct`` (share of those decisions
    where the correct action is greedy) and, per Boltzmann temperature T, ``p_correct@T``: the mean probability
    of the correct action under softmax(Q / T) over the legal actions (what an exploring step picks; Mortal's
    ``boltzmann_epsilon`` scales it, top-p aside). Returns a dict with ``decisions`` too."""
    import numpy as np
    import torch
    from mortal.data.gameplay import GameplayLoader
    from mortal.model.checkpoint import load_model_pair
    brain, dqn, version = load_model_pair(state_file)
    loader = GameplayLoader(version)
    obs, masks = [], []
    for path in log_files:
        for game in loader.load_log_file(path):
            obs.append(game.take_obs())
            masks.append(game.take("masks"))
    obs, masks = np.concatenate(obs), np.concatenate(masks).astype(bool)
    rows, flawed, correct = flaw_decisions(name, masks)
    out = {'decisions': int(len(rows))}
    if not len(rows):
        return out
    with torch.no_grad():
        q = torch.cat([dqn(brain(torch.as_tensor(obs[rows[i:i + 512]], dtype=torch.float32)),
                           torch.as_tensor(masks[rows[i:i + 512]])) for i in range(0, len(rows), 512)])
    best_flawed = q.masked_fill(~torch.as_tensor(flawed), -torch.inf).amax(dim=1)
    out['margin'] = float((best_flawed - q[:, correct]).mean())
    out['greedy_correct'] = float((q.argmax(dim=1) == correct).float().mean())
    for t in temps:
        out[f'p_correct@{t:g}'] = float(torch.softmax(q / t, dim=1)[:, correct].mean())
    return out


def evaluate(fout, name, *, eval_sets, curve_sets, teacher_sets, workers, key, log):
    """Play every model of the flaw's arms against 3x its start; returns (and writes) ``result.json``.

    The models: the start, the teacher (RulebaseBot), ``control`` (its final model) and, for every other arm
    under ``arms/`` (the online arms), its ``best.pth`` and final model. A model whose file, deal count and key
    are unchanged since the last evaluation is not played again (``result.json``'s ``played``)."""
    from mortal.play.evaluation import format_summary, summarize

    start_file = fout / 'start' / 'online' / 'baseline.pth'
    res_path = fout / 'result.json'
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    play = cached_play(fout, name, res, res_path, start_file, key=key, workers=workers, log=log)
    ref, ref_stat = play('start', ('mortal', str(start_file)), eval_sets)
    models = {'start': {**summarize(ref, ref), **ref_stat}}
    if teacher_sets:
        teacher_units, stat = play('teacher', ('rulebase', None), teacher_sets)
        models['teacher'] = {**summarize(teacher_units, {n: ref[n] for n in teacher_units if n in ref}), **stat}
        log(f'[{name}] teacher (RulebaseBot) vs 3x start: {format_summary(models["teacher"])}')
    arms = sorted(p.name for p in (fout / 'arms').iterdir() if p.is_dir()) if (fout / 'arms').exists() else []
    files = arm_files(fout, arms)
    units = {}
    for label, path in files.items():
        if not path.exists():
            log(f'[{name}] {label}: {path} does not exist: not evaluated')
            continue
        units[label], stat = play(label, ('mortal', str(path)), eval_sets)
        models[label] = {**summarize(units[label], ref), **stat}
        if 'teacher' in models:
            models[label]['removed'] = removed_fraction(models['start']['statistic'], stat['statistic'],
                                                        models['teacher']['statistic'])
        log(f'[{name}] {label} vs 3x start: {format_summary(models[label])}')
    if name in DECISION_RULES:
        val_logs = sorted((fout / 'start' / 'bootstrap' / 'logs' / 'val').glob('*.json.gz'))
        for label, path in [('start', start_file)] + [(k, v) for k, v in files.items() if k in models]:
            models[label]['q_margin'] = q_margin(path, val_logs, name)
    res['models'] = models
    res['minus_control'] = minus_control(units, name, log)
    res['curve'] = {}
    snapshot_curves(res['curve'], play, fout, arms, ref, curve_sets)
    res_path.write_text(json.dumps(res, indent=1))
    return res


def cached_play(fout, name, res, res_path, start_file, *, key, workers, log):
    """``play(label, challenger, sets)``: ``(units, statistic)`` of ``challenger`` vs 3x the start on ``sets``
    deals (its logs in ``eval_logs/LABEL``), from ``res['played']`` if its file is unchanged; a new play is
    recorded there and ``res`` written to ``res_path``."""
    from mortal.play.evaluation import play_duplicate
    from mortal.util.fsutil import empty_dir

    played = res.setdefault('played', {})

    def play(label, challenger, sets):
        """``(units, statistic)`` of ``challenger`` vs 3x the start on ``sets`` deals, from the cache if its file
        is unchanged."""
        path = challenger[1]
        tag = [sets, key, os.path.getmtime(path) if path else 0]
        if played.get(label, {}).get('tag') == tag:
            p = played[label]
            return {int(n): r for n, r in p['units'].items()}, p['statistic']
        log_dir = fout / 'eval_logs' / label
        empty_dir(log_dir)
        t = time.monotonic()
        units = play_duplicate(challenger, ('mortal', str(start_file)), sets=sets, key=key, workers=workers,
                               chunk=2 if challenger[0] == 'rulebase' else max(1, sets // (4 * workers)),
                               log_dir=str(log_dir))
        # only the deals play_duplicate kept (a deal with a failed game has logs of its other games)
        stat, stat_ci = ratio_ci({n: v for n, v in statistic_by_deal(log_dir, name).items() if n in units})
        log(f'[{name}] {label}: {sets} deals in {time.monotonic() - t:.0f} s, statistic {stat:.4f} ± {stat_ci:.4f}')
        played[label] = {'tag': tag, 'units': units, 'statistic': {'statistic': stat, 'statistic_ci': stat_ci}}
        res_path.write_text(json.dumps(res, indent=1))
        return units, played[label]['statistic']

    return play


def arm_files(fout, arms):
    """``{label: path}`` of the arms' models: ``ARM_best`` (not for the control) and ``ARM_final``."""
    files = {}
    for arm in arms:
        if arm != 'control':
            files[f'{arm}_best'] = fout / 'arms' / arm / 'online' / 'best.pth'
        files[f'{arm}_final'] = fout / 'arms' / arm / 'final.pth'
    return files


def minus_control(units, name, log):
    """``{label: {'diff', 'ci'}}``: each online arm's final model minus the control's, paired by deal."""
    from mortal.play.evaluation import summarize

    out = {}
    for label in units:
        if label.endswith('_final') and label != 'control_final' and 'control_final' in units:
            paired = summarize(units[label], units['control_final'])
            out[label] = {'diff': paired['paired_diff'], 'ci': paired['paired_diff_ci']}
            log(f"[{name}] {label} - control_final, paired by deal: {paired['paired_diff']:+.3f} ± "
                f"{paired['paired_diff_ci']:.3f}")
    return out


def snapshot_curves(curve, play, fout, arms, ref, curve_sets):
    """Fill ``curve`` (``{arm: points}``, filled in place as each arm is played) with a point per snapshot of
    each arm: its summary and statistic against 3x the start on the first ``curve_sets`` deals."""
    from mortal.play.evaluation import summarize

    curve_ref = {n: ref[n] for n in sorted(ref)[:curve_sets]}
    for arm in arms:
        points = []
        for snap in sorted((fout / 'arms' / arm / 'snapshots').glob('step_*.pth')) if curve_sets else ():
            u, stat = play(f'{arm}_{snap.stem}', ('mortal', str(snap)), curve_sets)
            points.append({'step': int(snap.stem.split('_')[1]), **summarize(u, curve_ref), **stat})
        curve[arm] = points


def table(res, name):
    """The Markdown rows of one flaw's result (printed by ``flaw``)."""
    from mortal.play.flaws import STATISTICS
    stat_name = STATISTICS[name][0]
    lines = [f'| model | steps | vs 3x flawed start | paired to start | {stat_name} (95% CI) | excess removed | '
             'Q margin of the flaw | p(correct) at T 0.05 / 1 |',
             '|---|---|---|---|---|---|---|---|']
    info = res.get('arms', {})
    for label, m in res.get('models', {}).items():
        arm, _, kind = label.rpartition('_')
        steps = info.get(arm, {}).get('best_step' if kind == 'best' else 'steps', '-') if arm else '-'
        paired = f"{m['paired_diff']:+.3f} ± {m['paired_diff_ci']:.3f}" if 'paired_diff' in m else '-'
        removed = f"{m['removed']:.2f}" if isinstance(m.get('removed'), float) and math.isfinite(m['removed']) else '-'
        qm = m.get('q_margin', {})
        margin = f"{qm['margin']:.2f}" if 'margin' in qm else '-'
        p_correct = f"{qm['p_correct@0.05']:.1e} / {qm['p_correct@1']:.4f}" if 'margin' in qm else '-'
        lines.append(f"| {label} | {steps} | {m['avg_rank']:.3f} ± {m['avg_rank_ci']:.3f} | {paired} | "
                     f"{m['statistic']:.4f} ± {m['statistic_ci']:.4f} | {removed} | {margin} | {p_correct} |")
    for label, d in res.get('minus_control', {}).items():
        lines.append(f"\n{label} - control_final, paired by deal: {d['diff']:+.3f} ± {d['ci']:.3f}")
    return '\n'.join(lines)


def plot(res, name, png):
    """Two panels against steps, one line per arm: the flaw's statistic (the teacher's and the start's as
    horizontal lines) and the avg rank against 3x the start."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from mortal.play.flaws import STATISTICS
    fig, (ax_s, ax_r) = plt.subplots(1, 2, figsize=(11, 4.2))
    models = res.get('models', {})
    for arm, points in res.get('curve', {}).items():
        start = models.get('start', {})
        pts = [{'step': 0, 'statistic': start.get('statistic', math.nan), 'statistic_ci': 0.0,
                'avg_rank': 2.5, 'avg_rank_ci': 0.0}] + points
        xs = [p['step'] for p in pts]
        ax_s.errorbar(xs, [p['statistic'] for p in pts], yerr=[p['statistic_ci'] for p in pts], marker='o', ms=4,
                      capsize=3, label=arm)
        line = ax_r.errorbar(xs, [p['avg_rank'] for p in pts], yerr=[p['avg_rank_ci'] for p in pts], marker='o',
                             ms=4, capsize=3, label=arm)
        final, steps = models.get(f'{arm}_final'), res.get('arms', {}).get(arm, {}).get('steps')
        if final and steps:  # the full evaluation of the final model, a star
            color = line[0].get_color()
            ax_s.errorbar([steps], [final['statistic']], yerr=[final['statistic_ci']], color=color, marker='*',
                          ms=11, capsize=4, ls='none')
            ax_r.errorbar([steps], [final['avg_rank']], yerr=[final['avg_rank_ci']], color=color, marker='*', ms=11,
                          capsize=4, ls='none')
    if 'teacher' in models:
        ax_s.axhline(models['teacher']['statistic'], color='green', ls='--', lw=1, label='teacher (RulebaseBot)')
        ax_r.axhline(models['teacher']['avg_rank'], color='green', ls='--', lw=1, label='teacher (RulebaseBot)')
    ax_r.axhline(2.5, color='grey', lw=0.8, ls=':')
    ax_s.set_title(f'{name}: {STATISTICS[name][0]} ({STATISTICS[name][3]})', fontsize=9)
    ax_r.set_title('avg rank vs 3x the flawed start (lower is better); * final model', fontsize=9)
    ax_r.invert_yaxis()
    for ax in (ax_s, ax_r):
        ax.set_xlabel('steps')
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def run(out, name, *, games, sets, steps, minutes, snapshot_every, eval_sets, curve_sets, teacher_sets, workers,
        key, eval_only, log, arm='online'):
    """The whole flaw benchmark (see the module docstring); returns the result dict. ``arm``: the online arm's
    name (another name trains one more online arm, e.g. a lever, from the same start; the control is trained
    once, matched to the first online arm). Raises SystemExit for a flaw that plants nothing in RulebaseBot
    (``mortal.play.flaws.VACUOUS``)."""
    import toml
    from mortal.play.flaws import VACUOUS
    if name in VACUOUS:
        raise SystemExit(f'flaw {name}: {VACUOUS[name]}')
    if arm == 'control':
        raise SystemExit("flaw: --arm control is the offline-only control's name; pick another")
    fout = pathlib.Path(out, 'flaws', name).resolve()
    res_path = fout / 'result.json'
    if not eval_only:
        t = time.monotonic()
        learning.make_start(fout, version=3, games=games, grp_games=0, progress=False, flaw=name)
        log(f'[{name}] start: {time.monotonic() - t:.0f} s')
        info = learning.run_arm(fout, arm, sets=sets, steps=steps, minutes=minutes, snapshot_every=snapshot_every,
                                log=log)
        best = fout / 'arms' / arm / 'online' / 'best.pth'
        if best.exists():
            info['best_step'] = learning.checkpoint_steps(best) - learning.checkpoint_steps(
                fout / 'start' / 'online' / 'baseline.pth')
        res = json.loads(res_path.read_text()) if res_path.exists() else {'flaw': name}
        res.setdefault('arms', {})[arm] = info
        res_path.write_text(json.dumps(res, indent=1))
        if not (fout / 'arms' / 'control' / 'final.pth').exists():
            arm_cfg = toml.load(fout / 'arms' / arm / 'config.toml')
            mix = arm_cfg['online']['offline_batch_size']
            n = control_steps(info['steps'], mix, arm_cfg['control']['batch_size']) if mix else info['steps']
            if not mix:
                log(f'[{name}] the online arm mixes no offline rows: the control trains as many steps instead')
            res['arms']['control'] = learning.run_offline(
                fout, 'control', epochs=0, lr=arm_cfg['optim']['scheduler']['peak'], freeze_bn=True, log=log,
                steps=n, snapshot_every=snapshot_every)
            res_path.write_text(json.dumps(res, indent=1))
    if not (fout / 'start' / 'online' / 'baseline.pth').exists():
        raise SystemExit(f'flaw {name}: no start in {fout / "start"} to evaluate: run it with --minutes or --steps first')
    res = evaluate(fout, name, eval_sets=eval_sets, curve_sets=curve_sets, teacher_sets=teacher_sets,
                   workers=workers, key=key, log=log)
    plot(res, name, fout / f'flaw_{name}.png')
    print(table(res, name), flush=True)
    log(f'[{name}] result: {res_path}; plot: {fout / f"flaw_{name}.png"}')
    return res
