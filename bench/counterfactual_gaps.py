"""What the counterfactual branches of self-play logs measured: the paired value of the alternative action.

Self-play with ``[train_play.<profile>] counterfactual_rate`` > 0 writes, into the trainee's reaction meta, the
outcome of a branch in which the trainee took its highest-Q other legal action on the same wall
(``mortal.play.arena._Branch``). The learner turns each into ``cf_delta`` = V(branch) - V(real) in ``[env] pts``
units (``mortal.data.reward.RewardCalculator.counterfactual_deltas``). This script reads logs and prints, per kind
of decision (taken action's kind -> alternative's kind: a call -> the pass, a discard -> another discard, ...), the
number of branches and the mean ``cf_delta`` with its 95% CI (Student t, branches as independent): positive means
the branch's action was worth more than the one played. It is the instrument of the counterfactual arm: it says
whether the paired targets carry the sign that would fix a flaw, before any training.

    python bench/counterfactual_gaps.py --config ARM/config.toml LOG.json.gz ... [--json OUT]

``--config``: the arm's config (``[env] reward``, ``[env] pts``, ``[grp]``, ``[control] version``).
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
    import numpy as np
    from mortal.config import typed
    from mortal.data.gameplay import GameplayLoader
    from mortal.data.reward import RewardCalculator, load_grp
    from mortal.features.action import action_kind

    cfg = typed(config)
    grp = load_grp(cfg.grp.state_file, cfg.grp.network) if cfg.env.reward == 'grp' else None
    calc = RewardCalculator(grp, cfg.env.pts, reward=cfg.env.reward)
    loader = GameplayLoader(cfg.control.version)
    out: dict[str, list[float]] = {}
    for path in log_files:
        for game in loader.load_log_file(path):
            cf = game.take_cf_actions()
            has = np.flatnonzero(cf >= 0)
            if not len(has):
                continue
            records = game.take_cf_records()
            actions = game.take("actions")
            at_kyoku = game.take("at_kyoku").astype(np.int64)
            g = game.grp
            deltas = calc.counterfactual_deltas(game.player_id, g.take_feature(), g.take_rank_by_player(),
                                                g.take_final_scores(), at_kyoku[has], [records[i] for i in has])
            for i, d in zip(has, deltas):
                out.setdefault(f'{action_kind(int(actions[i]))} -> {action_kind(int(cf[i]))}', []).append(float(d))
    return out


def summary(by_kind: dict) -> dict:
    """Per kind: ``n``, ``mean`` and ``ci`` (95% half-width, Student t; 0 for n < 2), ``positive`` (share of
    branches whose alternative was worth more), in pts units."""
    import numpy as np
    from scipy import stats
    res = {}
    for kind, values in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
        v = np.asarray(values)
        ci = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
        res[kind] = {'n': int(len(v)), 'mean': float(v.mean()), 'ci': ci, 'positive': float((v > 0).mean())}
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--config', required=True, help="the arm's config.toml")
    p.add_argument('--json', help='also write the summary here')
    p.add_argument('logs', nargs='+', help='self-play mjai logs (.json.gz)')
    args = p.parse_args(argv)
    from mortal.config import load_config
    res = summary(gaps(load_config(args.config), args.logs))
    print(f'{"taken -> alternative":24} {"branches":>8} {"cf_delta (pts)":>18} {"alt better":>10}')
    for kind, r in res.items():
        print(f'{kind:24} {r["n"]:8d} {r["mean"]:+9.3f} ± {r["ci"]:.3f} {r["positive"]:10.2f}')
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
