"""What the counterfactual branches of self-play logs measured: the paired value of the alternative action.

Self-play with ``[train_play.<profile>] counterfactual_rate`` > 0 writes, into the trainee's reaction meta, the
outcome of a branch in which the trainee took its highest-Q other legal action on the same wall
(``mortal.play.counterfactual._Branch``). The learner turns each into ``cf_delta`` = V(branch) - V(real) in
``[env] pts`` units (``mortal.data.reward.RewardCalculator.counterfactual_deltas``). This script reads logs and
prints, per kind of decision (taken action's kind -> alternative's kind: a call -> the pass, a discard -> another
discard, ...), the number of branches and the mean ``cf_delta`` with its 95% CI (Student t, branches as
independent): positive means the branch's action was worth more than the one played. It is the instrument of the
counterfactual arm: it says whether the paired targets carry the sign that would fix a flaw, before any training.

    python bench/counterfactual_gaps.py --config ARM/config.toml LOG.json.gz ... [--json OUT]
    python bench/counterfactual_gaps.py --config START/config.toml --contested --rewards grp,points \
        --play 12 --repeat 2 --rate 1.0 [--play-dir work/counterfactual_gaps]

``--config``: the arm's config (``[env] reward``, ``[env] pts``, ``[grp]``, ``[control] version``). ``--rewards``
prices the same branches by each reward (with a t-statistic: which reward keeps the sign). ``--contested`` groups
them by contested kind (``counterfactual_alternative = 'contested'``: riichi->dama, dama->riichi, call->pass,
pass->call, push->fold, fold->push). ``--play SETS`` first self-plays 4 x SETS hanchan of the config's model
against its baseline with those branches (``--alternative``, ``--rate``) and the same seeds without them, and
prints the CPU the branches took; ``--repeat`` alternates such pairs on new seeds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def gaps(config: dict, log_files) -> dict:
    """``{'taken -> alternative': [cf_delta, ...]}`` over the branched decisions of ``log_files`` (every seat;
    only the trainee's reactions carry branches), ``cf_delta`` in ``[env] pts`` units by ``config``'s reward."""
    from mortal.config import typed
    reward = typed(config).env.reward
    return gaps_by_reward(config, log_files, (reward,))[reward]


def contested_kind(taken: int, alt: int, safe) -> str | None:
    """The contested kind (``mortal.play.counterfactual.CONTESTED_KINDS``) of a branch that took ``alt`` where
    ``taken`` was played, ``safe`` the genbutsu kinds at the decision (``riichi_genbutsu``; for a discard ->
    discard branch); None for a branch 'contested' never forks."""
    from mortal.features.tile import deaka
    if taken == 37 and alt < 37:
        return "riichi->dama"
    if taken < 37 and alt == 37:
        return "dama->riichi"
    if 38 <= taken <= 42 and alt == 45:
        return "call->pass"
    if taken == 45 and 38 <= alt <= 42:
        return "pass->call"
    if taken < 37 and alt < 37 and safe is not None and (deaka(taken) in safe) != (deaka(alt) in safe):
        return "fold->push" if deaka(taken) in safe else "push->fold"
    return None


def _genbutsu_at(events: list, idx: int, seat: int):
    """``riichi_genbutsu`` of ``seat`` after event ``idx`` of a whole log's ``events`` (its kyoku so far)."""
    from mortal.play.counterfactual import riichi_genbutsu
    start = max(i for i in range(idx + 1) if events[i]["type"] == "start_kyoku")
    return riichi_genbutsu(events[start:idx + 1], seat)


def gaps_by_reward(config: dict, log_files, rewards, *, contested: bool = False) -> dict:
    """``{reward: {kind: [cf_delta, ...]}}`` over the branched decisions of ``log_files``, for each of ``rewards``
    ('grp' needs ``config``'s ``[grp] state_file``; 'points'), the same branches in the same order under each.
    ``kind``: 'taken -> alternative' by action kind, or with ``contested`` the contested kind (``contested_kind``;
    branches of no contested kind are left out)."""
    import numpy as np
    from mortal.config import typed
    from mortal.data.gameplay import GameplayLoader
    from mortal.data.mjai_log import read_log
    from mortal.data.reward import RewardCalculator, load_grp
    from mortal.features.action import action_kind

    cfg = typed(config)
    calcs = {r: RewardCalculator(load_grp(cfg.grp.state_file, cfg.grp.network) if r == 'grp' else None,
                                 cfg.env.pts, reward=r) for r in rewards}
    loader = GameplayLoader(cfg.control.version)
    out: dict = {r: {} for r in rewards}
    for path in log_files:
        log = read_log(path)
        for game in loader.load_parsed(log):
            cf = game.take("cf_actions")
            has = np.flatnonzero(cf >= 0)
            if not len(has):
                continue
            records = game.take("cf_records")
            actions = game.take("actions")
            at_kyoku = game.take("at_kyoku").astype(np.int64)
            g = game.grp
            grp_args = (g.take_feature(), g.take_rank_by_player(), g.take_final_scores())
            kinds = []
            for i in has:
                a, b = int(actions[i]), int(cf[i])
                if not contested:
                    kinds.append(f'{action_kind(a)} -> {action_kind(b)}')
                    continue
                safe = _genbutsu_at(log.events, int(game.event_idx[i]), game.player_id) if a < 37 and b < 37 \
                    else None
                kinds.append(contested_kind(a, b, safe))
            for r, calc in calcs.items():
                deltas = calc.counterfactual_deltas(game.player_id, *grp_args, at_kyoku[has],
                                                    [records[i] for i in has])
                for kind, d in zip(kinds, deltas):
                    if kind is not None:
                        out[r].setdefault(kind, []).append(float(d))
    return out


def summary(by_kind: dict, *, t: bool = False) -> dict:
    """Per kind: ``n``, ``mean`` and ``ci`` (95% half-width, Student t; 0 for n < 2), ``positive`` (share of
    branches whose alternative was worth more), in pts units; with ``t`` also ``t``, the t-statistic of the mean
    against 0 (mean / standard error; 0 for n < 2 or no spread)."""
    import numpy as np
    from scipy import stats
    res = {}
    for kind, values in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
        v = np.asarray(values)
        se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
        ci = float(stats.t.ppf(0.975, len(v) - 1) * se) if len(v) > 1 else 0.0
        res[kind] = {'n': int(len(v)), 'mean': float(v.mean()), 'ci': ci, 'positive': float((v > 0).mean())}
        if t:
            res[kind]['t'] = float(v.mean() / se) if se > 0 else 0.0
    return res


def play(config: dict, out_dir: str, seed_count: int, *, rate: float, alternative: str, nonce: int,
         key: int = 7) -> dict:
    """Self-play ``4 * seed_count`` hanchan of ``config``'s ``[control] state_file`` (the trainee, with its
    ``[train_play.default]`` exploration) against ``[baseline.train]`` on CPU, logs into ``out_dir``, with
    counterfactual branches at ``rate`` (``alternative``). Returns ``seconds``, ``rows`` (the trainee's training
    rows in the logs), the arena's ``counterfactual`` counts and ``counterfactual_kinds``."""
    import glob
    import shutil
    import time

    import torch
    from mortal.config import train_play_profile, typed
    from mortal.data.gameplay import GameplayLoader
    from mortal.model.checkpoint import load_model_pair
    from mortal.play.arena import OneVsThree
    from mortal.play.engine import MortalEngine
    from mortal.play.player import load_baseline_engine

    cfg = typed(config)
    prof = train_play_profile(config, {})
    brain, dqn, version = load_model_pair(cfg.control.state_file)
    trainee = MortalEngine(brain, dqn, is_oracle=False, version=version, device=torch.device('cpu'),
                           enable_amp=False, name='trainee', boltzmann_epsilon=prof.boltzmann_epsilon,
                           boltzmann_temp=prof.boltzmann_temp, top_p=prof.top_p)
    baseline = load_baseline_engine(cfg.baseline.train)
    shutil.rmtree(out_dir, ignore_errors=True)
    arena = OneVsThree(disable_progress_bar=True, log_dir=out_dir, counterfactual_rate=rate,
                       counterfactual_alternative=alternative, counterfactual_seed=nonce)
    t0 = time.perf_counter()
    arena.py_vs_py(trainee, baseline, (nonce, key), seed_count)
    seconds = time.perf_counter() - t0
    loader = GameplayLoader(version, player_names=['trainee'])
    rows = sum(len(g) for p in sorted(glob.glob(f'{out_dir}/*.json.gz')) for g in loader.load_log_file(p))
    return {'seconds': seconds, 'rows': rows, 'counterfactual': dict(arena.counterfactual),
            'counterfactual_kinds': dict(arena.counterfactual_kinds)}


def _print_table(res: dict, rewards) -> None:
    kinds = sorted({k for r in rewards for k in res[r]}, key=lambda k: -res[rewards[0]].get(k, {'n': 0})['n'])
    head = ''.join(f' {"cf_delta by " + r + " (pts)":>24} {"t":>6}' for r in rewards)
    print(f'{"taken -> alternative":24} {"branches":>8}{head} {"alt better":>10}')
    for kind in kinds:
        first = res[rewards[0]][kind]
        cells = ''.join(f' {res[r][kind]["mean"]:+12.3f} ± {res[r][kind]["ci"]:9.3f} {res[r][kind]["t"]:+6.2f}'
                        for r in rewards)
        print(f'{kind:24} {first["n"]:8d}{cells} {first["positive"]:10.2f}')


def _print_play(runs: list, hanchan: int, args) -> None:
    """The CPU the branches cost: per run the time without and with them on the same seeds, the trainee's rows/s,
    and per contested kind its branches and its share by the scenes its branches decided."""
    import numpy as np
    share = np.array([1 - base['seconds'] / cf['seconds'] for base, cf in runs])
    for i, (base, cf) in enumerate(runs):
        print(f"run {i}: {hanchan} hanchan without branches {base['seconds']:.1f} s "
              f"({base['rows'] / base['seconds']:.1f} rows/s), with ({args.alternative}, rate {args.rate}) "
              f"{cf['seconds']:.1f} s ({cf['rows'] / cf['seconds']:.1f} rows/s); {cf['counterfactual']}")
    print(f"the branches' share of the CPU: {100 * share.mean():.1f}% (runs {', '.join(f'{100 * x:.1f}' for x in share)})")
    kinds: dict = {}
    for _, cf in runs:
        for kind, (forked, sc) in cf['counterfactual_kinds'].items():
            k = kinds.setdefault(kind, [0, 0])
            k[0] += forked
            k[1] += sc
    scenes = sum(sc for _, sc in kinds.values())
    # the extra seconds, shared out by the scenes each kind's branches decided, in hanchan played without branches
    extra = sum(cf['seconds'] - base['seconds'] for base, cf in runs)
    per_hanchan = sum(base['seconds'] for base, _ in runs) / (hanchan * len(runs))
    for kind, (forked, sc) in sorted(kinds.items()):
        cost = extra * sc / max(scenes, 1) / per_hanchan
        print(f"  {kind:14} {forked:6d} branches ({forked / (hanchan * len(runs)):.2f} a hanchan), {sc:7d} scenes, "
              f"~{100 * share.mean() * sc / max(scenes, 1):.1f}% of the CPU, {cost:.1f} hanchan "
              f"({100 * cost / max(forked, 1):.1f} per 100 branches)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--config', required=True, help="the arm's config.toml")
    p.add_argument('--json', help='also write the summary here')
    p.add_argument('--rewards', default=None,
                   help="comma-separated rewards to price the branches by, e.g. 'grp,points' (default: [env] reward)")
    p.add_argument('--contested', action='store_true',
                   help="group by contested kind (riichi->dama, dama->riichi, call->pass, pass->call, push->fold, "
                        "fold->push) instead of 'taken -> alternative' action kinds")
    p.add_argument('--play', type=int, default=0, metavar='SETS',
                   help='first self-play 4 x SETS hanchan into --play-dir with the branches (--rate, '
                        '--alternative), and the same seeds without branches before it, for the CPU share; '
                        'then read those logs')
    p.add_argument('--play-dir', default='work/counterfactual_gaps')
    p.add_argument('--repeat', type=int, default=1, help='--play runs, each on new seeds')
    p.add_argument('--rate', type=float, default=1.0)
    p.add_argument('--alternative', default='contested')
    p.add_argument('--nonce', type=int, default=1000)
    p.add_argument('logs', nargs='*', help='self-play mjai logs (.json.gz)')
    args = p.parse_args(argv)
    from mortal.config import load_config, typed
    config = load_config(args.config)
    rewards = tuple(args.rewards.split(',')) if args.rewards else (typed(config).env.reward,)
    logs = list(args.logs)
    out: dict = {}
    if args.play:
        import glob
        import torch
        torch.set_num_threads(1)  # the arena shares the CPU (as the client)
        runs = []
        for r in range(args.repeat):  # without, with, without, with ...: the machine's noise hits both alike
            nonce = args.nonce + r * args.play
            d = f'{args.play_dir}/{r}'
            runs.append([play(config, f'{d}/plain', args.play, rate=0.0, alternative=args.alternative, nonce=nonce),
                         play(config, f'{d}/branches', args.play, rate=args.rate, alternative=args.alternative,
                              nonce=nonce)])
            logs += sorted(glob.glob(f'{d}/branches/*.json.gz'))
        out['play'] = runs
        _print_play(runs, 4 * args.play, args)
    by_reward = gaps_by_reward(config, logs, rewards, contested=args.contested)
    res = {r: summary(by_reward[r], t=True) for r in rewards}
    _print_table(res, rewards)
    out['gaps'] = res
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out if args.play else res, indent=1))


if __name__ == '__main__':
    main()
