#!/usr/bin/env python
"""What an SPRT test play costs, against a fixed 3,000-game one, for planted differences (docs/operations.md).

1. The per-deal spread comes from real games: ``--challenger`` against 3x ``--champion`` on ``--deals`` duplicate
   deals (4 games each; ``mortal.play.evaluation``), or from a ``--units`` JSON written by an earlier run
   (``--save-units``). Per deal, the paired difference to the champion is the challenger's mean rank minus 2.5
   (the champion against 3 copies of itself finishes each rank once per deal).
2. These differences are centred on 0 and shifted by each planted difference (``--plant``, avg rank; negative =
   the challenger is better), then resampled with replacement into ``--runs`` test plays.
3. Each test play runs ``mortal.learning.gate.Sprt`` (``--delta``, ``--alpha``, ``--beta``, a look every
   ``--chunk`` games, at most ``--max-games``) and, on the same resample, the fixed paired-CI rule over all
   ``--max-games`` games.

Printed per planted difference: the share of test plays judged better by each (95% Wilson CI), the games the
SPRT needed to decide (mean ± 95% CI, median, 90th percentile), and the games the trainer plays as a share of the
fixed test play (a test play the SPRT calls better still plays all its deals, for the new best's record). The
resampled differences are against a constant (the champion's 2.5); in the trainer they are against best.pth's own
record, whose spread adds to the challenger's. With ``--against`` they are the deal-by-deal differences of two
models of one result.json (the spread of a ``[test_play] fresh_deals`` test play, best.pth replayed on the same
deals), and a test play ends at either verdict (no record to complete); each of its deals is played by both.

    python bench/sprt_cost.py --challenger A.pth --champion B.pth --deals 400 --save-units units.json
    python bench/sprt_cost.py --units units.json --plant -0.05 -0.02 0
    python bench/sprt_cost.py --units OUT/arms/ARM/result.json --label final
    python bench/sprt_cost.py --units OUT/arms/ARM/result.json --label final --against best --delta 0.1
"""

import argparse
import json
import math
import os
import pathlib
import random
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


def wilson(k: int, n: int, z: float = 1.959964) -> tuple:
    """95% Wilson interval of a proportion k/n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def simulate(diffs, plant, *, runs, max_deals, chunk_deals, sprt, confidence, seed, record=True):
    """Resampled test plays of per-deal differences ``diffs`` (centred, then shifted by ``plant``).
    Returns ``{'sprt_better', 'fixed_better', 'sprt_deals': [deals to the decision], 'trainer_deals': [deals the
    trainer plays: the whole test play when the SPRT said better and ``record``, for the new best's record on
    fixed deals]}``."""
    from mortal.learning.gate import mean_and_ci
    mean = statistics.fmean(diffs)
    pool = [d - mean + plant for d in diffs]
    rng = random.Random(seed)
    sprt_better = fixed_better = 0
    used, trainer = [], []
    for _ in range(runs):
        sample = rng.choices(pool, k=max_deals)
        verdict, n = None, 0
        while n < max_deals and verdict is None:
            n = min(max_deals, n + chunk_deals)
            verdict = sprt.verdict(sample[:n])
        sprt_better += verdict == 'better'
        used.append(n)
        trainer.append(max_deals if verdict == 'better' and record else n)
        m, ci = mean_and_ci(sample, confidence)
        fixed_better += m + ci < 0
    return {'sprt_better': sprt_better, 'fixed_better': fixed_better, 'sprt_deals': used, 'trainer_deals': trainer}


def _parser():
    from mortal import entry

    parser = entry.parser(__doc__.splitlines()[0], config=False,
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = parser.add_argument_group('where the per-deal spread comes from (one of)')
    src.add_argument('--units', help='a JSON {nonce: [4 ranks]} of the challenger (from --save-units), or an arm\'s '
                                     'result.json of bench/learning.py (its units of --label)')
    src.add_argument('--label', default='final', help='which model of a result.json: start, best, final, ...')
    src.add_argument('--against', help="with a result.json: pair --label deal by deal with this model's units "
                                       '(the spread of a [test_play] fresh_deals test play, best.pth replayed)')
    src.add_argument('--challenger', help='checkpoint to play against 3x --champion')
    src.add_argument('--champion', help='checkpoint of the three opponents')
    parser.add_argument('--deals', type=int, default=400, help='duplicate deals to play (4 games each)')
    parser.add_argument('--key', type=int, default=0x5eed, help='duplicate seed key of the played deals')
    parser.add_argument('--workers', type=int, default=os.cpu_count() or 1, help='game processes')
    parser.add_argument('--save-units', help='write the played units to this JSON')
    parser.add_argument('--plant', type=float, nargs='+', default=[-0.05, -0.02, 0.0],
                        help='planted differences of avg rank (negative = better)')
    parser.add_argument('--runs', type=int, default=2000, help='resampled test plays per planted difference')
    parser.add_argument('--max-games', type=int, default=3000, help='games of the fixed test play (the SPRT cap)')
    parser.add_argument('--chunk', type=int, default=64, help='games between two looks of the SPRT')
    parser.add_argument('--delta', type=float, default=0.05, help='SPRT H1: better by this avg rank')
    parser.add_argument('--alpha', type=float, default=0.05, help='SPRT false "better" rate')
    parser.add_argument('--beta', type=float, default=0.05, help='SPRT missed "better" rate at delta')
    parser.add_argument('--confidence', type=float, default=0.95, help='two-sided confidence of the fixed rule')
    parser.add_argument('--seed', type=int, default=0, help='seed of the resampling')
    return parser


def _units(args, parser) -> tuple:
    """``(units, reference)``: the challenger's ``{nonce: [4 ranks]}`` from ``--units`` or played, and the units it
    is paired with (``--against`` of a result.json; None: each deal against the even 2.5)."""
    reference = None
    if args.units:
        data = json.loads(pathlib.Path(args.units).read_text())
        if 'units' in data and isinstance(data['units'], dict):  # a bench/learning.py result.json
            if args.label not in data['units']:
                parser.error(f"{args.units} has no units of {args.label!r} (it has {sorted(data['units'])})")
            if args.against and args.against not in data['units']:
                parser.error(f"{args.units} has no units of {args.against!r} (it has {sorted(data['units'])})")
            reference = {int(k): v for k, v in data['units'][args.against].items()} if args.against else None
            data = data['units'][args.label]
        elif args.against:
            parser.error('--against needs a result.json of bench/learning.py as --units')
        return {int(k): v for k, v in data.items()}, reference
    if args.challenger and args.champion:
        from mortal.play.evaluation import play_duplicate
        units = play_duplicate(('mortal', args.challenger), ('mortal', args.champion), sets=args.deals,
                               key=args.key, workers=args.workers)
        if args.save_units:
            pathlib.Path(args.save_units).write_text(json.dumps({str(k): v for k, v in sorted(units.items())}))
        return units, reference
    parser.error('give --units, or --challenger and --champion')


def main(argv=None):
    from mortal import entry

    parser = _parser()
    args = entry.start(parser, argv, log_level=None)
    from mortal.learning.gate import Sprt, mean_and_ci

    units, reference = _units(args, parser)
    if reference:
        from mortal.learning.gate import paired_differences
        diffs = paired_differences(units, reference)
    else:
        diffs = [sum(r) / len(r) - 2.5 for _, r in sorted(units.items())]
    mean, ci = mean_and_ci(diffs)
    sd = statistics.stdev(diffs)
    print(f'per-deal paired differences: {len(diffs)} deals, mean {mean:+.3f} ± {ci:.3f}, sd {sd:.3f} '
          f'(centred before planting)')
    _table(args, diffs, Sprt(args.delta, args.alpha, args.beta), record=reference is None)
    return 0


def _table(args, diffs, sprt, *, record: bool) -> None:
    """The SPRT against the fixed rule, one row per planted difference of ``--plant`` (``simulate``)."""
    from mortal.learning.gate import mean_and_ci

    max_deals, chunk = args.max_games // 4, max(1, args.chunk // 4)
    print(f'SPRT delta {args.delta}, alpha {args.alpha}, beta {args.beta}, a look every {chunk * 4} games, '
          f'at most {max_deals * 4}; fixed rule: {args.confidence:.0%} paired CI over {max_deals * 4} games; '
          f'{args.runs} resampled test plays each\n')
    print('| planted diff | SPRT says better | fixed 3,000-game CI says better | SPRT games to decide: mean ± CI | '
          'median | 90th pct | games the trainer plays: mean / fixed |')
    print('|---|---|---|---|---|---|---|')
    for i, plant in enumerate(args.plant):
        r = simulate(diffs, plant, runs=args.runs, max_deals=max_deals, chunk_deals=chunk, sprt=sprt,
                     confidence=args.confidence, seed=args.seed + i, record=record)
        games = [4 * n for n in r['sprt_deals']]
        g_mean, g_ci = mean_and_ci(games)
        lo, hi = wilson(r['sprt_better'], args.runs)
        flo, fhi = wilson(r['fixed_better'], args.runs)
        q = statistics.quantiles(games, n=10)
        print(f"| {plant:+.3f} | {r['sprt_better'] / args.runs:.3f} [{lo:.3f}, {hi:.3f}] | "
              f"{r['fixed_better'] / args.runs:.3f} [{flo:.3f}, {fhi:.3f}] | {g_mean:.0f} ± {g_ci:.0f} | "
              f"{statistics.median(games):.0f} | {q[-1]:.0f} | "
              f"{statistics.fmean(r['trainer_deals']) / max_deals:.2f} |")


if __name__ == '__main__':
    sys.exit(main())
