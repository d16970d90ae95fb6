#!/usr/bin/env python
"""How good is a GRP (the reward model), and how good can one be on N hanchan?

    python bench/grp_quality.py curve TRAIN_DIR VAL_DIR [--steps 25,50,100,200,400,800]
    python bench/grp_quality.py make TRAIN_DIR OUT.pth --steps 100
    python bench/grp_quality.py reward VAL_DIR GRP.pth [GRP.pth ...]
    python bench/grp_quality.py rank VAL_DIR [GRP.pth ...]

``curve`` trains Mortal's GRP (hidden 64, 2 layers, AdamW defaults, batch 64, as ``mortal.train_grp``) on every
``*.json.gz`` log of TRAIN_DIR and prints the validation cross entropy over all prefixes of VAL_DIR's logs at each
step count (uniform over the 24 rank orders is ln 24 = 3.178). ``make`` writes such a GRP after ``--steps`` steps in
the ``train_grp`` checkpoint layout. ``reward`` prints, per GRP, the correlation between each kyoku's reward (in
``[env] pts`` 6/4/2/0 units) and the kyoku's point change of that seat, over all seats and kyoku of VAL_DIR except
the last kyoku of each game. ``rank`` prints, for the ``'points'`` reward (``[env] reward``, the kyoku's score change
x 6 / 30,000 pt per point, ``mortal.data.reward``) and for each GRP (with its validation cross entropy), the
correlation between each kyoku's reward and the seat's final rank (1-4) over the same kyoku (the last kyoku of each
game left out: there the GRP reward is the final rank itself); negative is right (a higher reward goes with a
better, lower, rank) and a larger magnitude is better. Seeds are fixed (torch and random 0).
"""

import glob
import math
import os
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


def _samples(log_dir):
    from mortal.train_grp import GrpFileDatasetsIter
    files = sorted(glob.glob(os.path.join(log_dir, '*.json.gz')))
    if not files:
        raise SystemExit(f'no *.json.gz logs in {log_dir}')
    return list(GrpFileDatasetsIter(files, file_batch_size=len(files)))


def _train(samples, steps_list, on_step):
    import torch
    from mortal.model.networks import GRP
    from mortal.train_grp import collate, train_step
    torch.manual_seed(0)
    random.seed(0)
    grp = GRP(hidden_size=64, num_layers=2)
    opt = torch.optim.AdamW(grp.parameters())
    step = 0
    for target in steps_list:
        while step < target:
            train_step(grp, opt, *collate(random.sample(samples, 64)))
            step += 1
        on_step(step, grp)
    return grp


def val_ce(grp, samples):
    """Mean cross entropy (nats) of ``grp`` over ``samples`` (``mortal.train_grp.mean_ce``)."""
    from mortal.train_grp import mean_ce
    return mean_ce(grp, samples)


def reward_correlation(grp_file, log_dir):
    """(kyoku count, corr(reward, point change), reward sd) of a GRP checkpoint on the logs of ``log_dir``."""
    import numpy as np
    from mortal.data.grp import Grp
    from mortal.config_schema import GrpNetwork
    from mortal.data.reward import RewardCalculator, load_grp
    calc = RewardCalculator(load_grp(grp_file, GrpNetwork(hidden_size=64, num_layers=2)), [6, 4, 2, 0])
    rewards, deltas = [], []
    for game in Grp.load_gz_log_files(sorted(glob.glob(os.path.join(log_dir, '*.json.gz')))):
        feature, ranks = game.take_feature(), game.take_rank_by_player()
        for seat in range(4):
            rewards += list(calc.calc_delta_pt(seat, feature, ranks)[:-1])
            deltas += list(np.diff(feature[:, 3 + seat]) * 1e4)
    r, d = np.array(rewards), np.array(deltas)
    return len(r), float(np.corrcoef(r, d)[0, 1]), float(r.std())


def rank_correlation(log_dir, grp_file=None, pts=(6, 4, 2, 0)):
    """``(kyoku count, corr(reward, final rank))`` of one kyoku reward on the logs of ``log_dir``: the GRP reward of
    the checkpoint ``grp_file`` (hidden 64, 2 layers), or the ``'points'`` reward when it is None. Final rank is
    1-4 (1 = top); every seat's every kyoku but each game's last. Raises SystemExit when ``log_dir`` has no log."""
    import numpy as np
    from mortal.data.grp import Grp
    from mortal.config_schema import GrpNetwork
    from mortal.data.reward import RewardCalculator, load_grp
    files = sorted(glob.glob(os.path.join(log_dir, '*.json.gz')))
    if not files:
        raise SystemExit(f'no *.json.gz logs in {log_dir}')
    if grp_file is None:
        calc = RewardCalculator(None, list(pts), reward='points')
    else:
        calc = RewardCalculator(load_grp(grp_file, GrpNetwork(hidden_size=64, num_layers=2)), list(pts))
    rewards, ranks = [], []
    for game in Grp.load_gz_log_files(files):
        feature, final_rank = game.take_feature(), game.take_rank_by_player()
        for seat in range(4):
            r = calc.kyoku_rewards(seat, feature, final_rank, game.take_final_scores())[:-1]
            rewards += list(r)
            ranks += [int(final_rank[seat]) + 1] * len(r)
    r, k = np.array(rewards), np.array(ranks, dtype=np.float64)
    return len(r), float(np.corrcoef(r, k)[0, 1])


def main(argv=None):
    from mortal import entry

    parser = entry.parser(__doc__.split('\n\n')[0], config=False)
    sub = parser.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('curve')
    p.add_argument('train_dir')
    p.add_argument('val_dir')
    p.add_argument('--steps', default='25,50,100,200,400,800')
    p = sub.add_parser('make')
    p.add_argument('train_dir')
    p.add_argument('out')
    p.add_argument('--steps', type=int, default=100)
    p = sub.add_parser('reward')
    p.add_argument('val_dir')
    p.add_argument('grp', nargs='+')
    p = sub.add_parser('rank')
    p.add_argument('val_dir')
    p.add_argument('grp', nargs='*')
    args = entry.start(parser, argv, log_level=None)
    import torch
    torch.set_num_threads(1)
    if args.cmd == 'curve':
        train, val = _samples(args.train_dir), _samples(args.val_dir)
        print(f'train samples {len(train)}, val samples {len(val)}; uniform {math.log(24):.4f}')
        _train(train, [int(s) for s in args.steps.split(',')],
               lambda step, grp: print(f'step {step:5d}: val CE {val_ce(grp, val):.4f}', flush=True))
    elif args.cmd == 'make':
        grp = _train(_samples(args.train_dir), [args.steps], lambda *a: None)
        from mortal.model.checkpoint import atomic_torch_save
        atomic_torch_save({'model': grp.state_dict(), 'steps': args.steps, 'timestamp': 0}, args.out)
        print(f'wrote {args.out}')
    elif args.cmd == 'rank':
        val = _samples(args.val_dir)
        n, corr = rank_correlation(args.val_dir)
        print(f'uniform CE {math.log(24):.4f}; corr(kyoku reward, final rank 1-4), negative = right, larger '
              f'magnitude = better')
        print(f'points: {n} kyoku, corr {corr:+.3f}')
        from mortal.config_schema import GrpNetwork
        from mortal.data.reward import load_grp
        for grp_file in args.grp:
            n, corr = rank_correlation(args.val_dir, grp_file)
            ce = val_ce(load_grp(grp_file, GrpNetwork(hidden_size=64, num_layers=2)), val)
            print(f'{grp_file}: {n} kyoku, corr {corr:+.3f}, val CE {ce:.4f}')
    else:
        for grp_file in args.grp:
            n, corr, sd = reward_correlation(grp_file, args.val_dir)
            print(f'{grp_file}: {n} kyoku, corr(reward, point change) {corr:.3f}, reward sd {sd:.3f}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
