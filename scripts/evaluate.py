#!/usr/bin/env python
"""Duplicate evaluation of a checkpoint against the rule-based bot, both ways, with 95% CIs.

    python scripts/evaluate.py CHECKPOINT [--sets 50] [--workers 2] [--key 7] [--device cpu]

* ``1 model vs 3 RulebaseBots``: the model is the challenger (one seat, four rotations per deal);
* ``1 RulebaseBot vs 3 models``: the reverse.

Each deal (nonce) is a duplicate set: its four seat rotations are one unit, and the CI is over units
(``mortal.one_vs_three.duplicate_ci``). Deals are spread over worker processes (the bot's move search holds
the interpreter lock). The model's architecture comes from the checkpoint's own config, as Mortal's player.
Prints one line per direction and, with ``--json``, writes the numbers to a file.
"""

import dataclasses
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

def evaluate(state_file, *, sets, workers, key, device='cpu', progress=True):
    """Both directions; returns ``{'model_vs_3_rulebase': DuplicateSummary, 'rulebase_vs_3_model': ...}``."""
    from tqdm import tqdm
    from mortal.play.evaluation import play_duplicate
    from mortal.one_vs_three import duplicate_ci

    out = {}
    model, bot = ('mortal', state_file, device), ('rulebase', None)
    for name, chal, champ in (('model_vs_3_rulebase', model, bot), ('rulebase_vs_3_model', bot, model)):
        with tqdm(total=sets * 4, unit='game', desc=name, disable=not progress) as bar:
            units = play_duplicate(chal, champ, sets=sets, key=key, workers=workers, chunk=1, progress=bar.update)
        out[name] = duplicate_ci(units.values())
    return out


def main(argv=None):
    from mortal import entry

    parser = entry.parser(__doc__.split('\n\n')[0], config=False)
    parser.add_argument('state_file', help='Mortal-layout checkpoint (e.g. best.pth)')
    parser.add_argument('--sets', type=int, default=50, help='duplicate sets (deals) per direction; 4 games each')
    parser.add_argument('--workers', type=int, default=os.cpu_count() or 1)
    parser.add_argument('--key', type=int, default=7, help='duplicate seed key (same key = same deals)')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--json', default=None, help='also write the results to this JSON file')
    parser.add_argument('--no-progress', action='store_true')
    args = entry.start(parser, argv, log_level=None)
    if args.sets < 2:
        parser.error('--sets must be >= 2 for a confidence interval')
    start = time.monotonic()
    res = evaluate(args.state_file, sets=args.sets, workers=args.workers, key=args.key, device=args.device,
                   progress=not args.no_progress)
    elapsed = time.monotonic() - start
    print(f'{args.state_file} (seed key {args.key}, {elapsed:.0f} s):')
    for name, summary in res.items():
        print(f'  {name}: {summary}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'state_file': args.state_file, 'key': args.key, 'seconds': elapsed,
                       **{k: dataclasses.asdict(v) for k, v in res.items()}}, f, indent=2)
    return 0


if __name__ == '__main__':
    sys.exit(main())
