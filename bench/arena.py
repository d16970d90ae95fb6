"""Arena throughput: OneVsThree with a small model vs floors measured in the same run.

Prints
* floor: games/s of the same tables + PlayerState + encode_obs with a zero-cost
  policy (first legal action);
* model: games/s with a small Brain+DQN (MortalEngine) on both sides;
* the model's pure batched forward time for the same decisions (sum of the
  engine's ``react_batch`` time) and its share of the model run;
* rows per forward: mean, and mean while at least 80% of the games are running,
  against N = number of games in flight.

Usage: python bench/arena.py [--seeds 8] [--channels 64] [--blocks 4] [--version 3]
"""

if __package__ in (None, ''):  # run as a script: python bench/arena.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import time

import numpy as np


class FirstLegal:
    """Zero-cost policy with the engine contract: the lowest legal action."""

    engine_type = "mortal"
    is_oracle = False
    enable_quick_eval = True
    enable_rule_based_agari_guard = False

    def __init__(self, name, version):
        self.name = name
        self.version = version

    def react_batch(self, obs, masks, invisible_obs=None):
        m = np.stack(masks)
        q = np.where(m, 0.0, -np.inf)
        return m.argmax(1).tolist(), q.tolist(), m.tolist(), [True] * len(masks)


class Timed:
    """Wraps an engine: records (time, rows, seconds) of every react_batch."""

    def __init__(self, engine, calls):
        self._engine = engine
        self._calls = calls

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def react_batch(self, obs, masks, invisible_obs=None):
        t0 = time.perf_counter()
        out = self._engine.react_batch(obs, masks, invisible_obs)
        self._calls.append((t0, len(obs), time.perf_counter() - t0))
        return out


def run(challenger, champion, seeds, progress):
    from mortal.play.arena import OneVsThree

    arena = OneVsThree(disable_progress_bar=not progress)
    finish = []
    orig = arena._finish

    def _finish(g, rankings):  # record when each game ends
        finish.append(time.perf_counter())
        orig(g, rankings)

    arena._finish = _finish
    t0 = time.perf_counter()
    arena.py_vs_py(challenger, champion, seed_start=(1, 2024), seed_count=seeds)
    return time.perf_counter() - t0, finish


def main(argv=None):
    from mortal import entry

    p = entry.parser(__doc__.splitlines()[0], config=False)
    p.add_argument("--seeds", type=int, default=8, help="nonces; games = 4 * seeds")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--version", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the arena shares the CPU)")
    p.add_argument("--progress", action="store_true")
    args = entry.start(p, argv, log_level=None)
    try:
        import torch
        from mortal.play.engine import MortalEngine
        from mortal.model.networks import DQN, Brain
    except ImportError as e:
        raise SystemExit(f"bench/arena.py needs mortal.model.networks and mortal.play.engine (and torch): {e}")
    torch.set_num_threads(args.threads)
    n_games = 4 * args.seeds

    floor_calls = []
    wall_floor, _ = run(Timed(FirstLegal("floor", args.version), floor_calls),
                        Timed(FirstLegal("floor", args.version), floor_calls), args.seeds, args.progress)
    floor_rows = sum(c[1] for c in floor_calls)

    torch.manual_seed(0)
    calls = []
    engines = []
    for name in ("challenger", "champion"):
        brain = Brain(conv_channels=args.channels, num_blocks=args.blocks, version=args.version).eval()
        dqn = DQN(version=args.version).eval()
        eng = MortalEngine(brain, dqn, version=args.version, device=torch.device(args.device), name=name)
        engines.append(Timed(eng, calls))
    wall_model, finish = run(engines[0], engines[1], args.seeds, args.progress)

    t_fwd = sum(c[2] for c in calls)
    rows = np.array([c[1] for c in calls])
    # "while most games run": calls made before 20% of the games had finished
    cutoff = sorted(finish)[max(0, int(0.2 * n_games) - 1)] if finish else float("inf")
    early = np.array([c[1] for c in calls if c[0] < cutoff])
    decisions = int(rows.sum())
    print(f"games: {n_games} (all in flight), model: Brain(conv_channels={args.channels}, "
          f"num_blocks={args.blocks}, version={args.version}) + DQN on {args.device}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"floor  (tables + PlayerState + encode_obs, first-legal policy): {n_games / wall_floor:7.2f} games/s "
          f"({wall_floor:.1f} s, {floor_rows / wall_floor:.0f} engine rows/s)")
    print(f"model  (OneVsThree with MortalEngine on both sides):          {n_games / wall_model:7.2f} games/s "
          f"({wall_model:.1f} s, {decisions / wall_model:.0f} engine rows/s)")
    print("(games differ in length between policies; rows/s compares per decision)")
    print(f"model / floor games/s ratio:                                  {wall_floor / wall_model:7.3f}")
    print(f"pure batched forward (react_batch) for the same {decisions} rows in {len(calls)} calls: "
          f"{t_fwd:.1f} s = {t_fwd / wall_model:.1%} of the model run; "
          f"forward-only bound {n_games / t_fwd:.2f} games/s; model run / forward-only {wall_model / t_fwd:.2f}x")
    print(f"rows per forward: mean {rows.mean():.1f}; while >= 80% of games run {early.mean() if len(early) else float('nan'):.1f} "
          f"(N = {n_games} games; champion sees up to 3 seats per game)")


if __name__ == "__main__":
    main()
