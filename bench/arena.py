"""Arena throughput: OneVsThree with a small model vs floors measured in the same run.

Prints
* floor: games/s of the same tables + PlayerState + encode_obs with a zero-cost
  policy (first legal action);
* model: games/s with a small Brain+DQN (MortalEngine) on both sides;
* the model's pure batched forward time for the same decisions (sum of the
  engine's ``react_batch`` time) and its share of the model run;
* rows per forward: mean, and mean while at least 80% of the games are running,
  against N = number of games in flight;
* where the other rows went: per agent turn (one ``react`` call) while at least 80% of
  the games run, the games served and the games waiting only on the other side's agent;
* the schedule bound: each game's sequence of steps (which side must decide) is
  recorded; the arena's rule (serve the side with the most pending decisions) is
  replayed on it, and a beam search (``--bound-width``) that knows every game's future
  looks for the schedule with the fewest turns. With greedy engines a game's steps do
  not depend on the schedule, so no arena that serves one side per forward can batch
  more decisions per turn than the best schedule there is (the beam's is a lower estimate of it).

With ``--speculate on`` (the bench's default; the arena's is off) some of the rows are speculative (the step after a call step,
decided in the same batch in case every asked seat passes); the bench prints how many were used and the useful
decisions per turn.

Usage: python bench/arena.py [--seeds 8] [--channels 64] [--blocks 4] [--version 3] [--bound-width 64]
       [--speculate on|off] [--json PATH]
"""

if __name__ == '__main__' and __package__ in (None, ''):  # run as a script (not loaded by bench/arena_floor.py)
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
        return tuple(x.tolist() for x in self.react_arrays(obs, masks, invisible_obs))

    react_batch.lists_of_arrays = True  # the arena's agent calls react_arrays (as MortalEngine's)

    def react_arrays(self, obs, masks, invisible_obs=None):
        m = np.array(masks, dtype=bool)
        return m.argmax(1), np.where(m, np.float32(0), np.float32(-np.inf)), m, np.ones(len(m), bool)


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


class TurnLog:
    """Wraps an arena agent: records (time, side, games served, scenes, speculative scenes) of every ``react``
    call (a turn)."""

    def __init__(self, agent, side, turns):
        self._agent = agent
        self._side = side
        self._turns = turns

    def __getattr__(self, name):
        return getattr(self._agent, name)

    def react(self, scenes):
        spec = [sc for sc in scenes if sc.speculative]
        self._turns.append((time.perf_counter(), self._side, len({sc.game for sc in scenes}), len(scenes), spec))
        return self._agent.react(scenes)


def run(challenger, champion, seeds, progress, steps=None, speculate=True, spec_out=None):
    """Play the bench's games; returns (seconds, game end times). ``steps``: a dict filled with, per game id,
    its list of steps, each a tuple (decisions of side 0 = challenger, decisions of side 1 = champion)."""
    from mortal.play.arena import OneVsThree
    from mortal.play.game import _Game

    arena = OneVsThree(disable_progress_bar=not progress, speculate_passes=speculate)
    finish = []
    orig = arena._finish

    def _finish(g, rankings):  # record when each game ends
        finish.append(time.perf_counter())
        orig(g, rankings)

    arena._finish = _finish
    orig_scenes = _Game.scenes
    if steps is not None:
        def scenes(g, guard, absorbed=None):  # one call per step of a game (not a speculated one): which sides decide
            out = orig_scenes(g, guard, absorbed)
            n = [0, 0]
            for sc in out:
                n[0 if g.agents[sc.seat] is g.agents[SPLIT_SEAT[g.split]] else 1] += 1
            steps.setdefault(g.gid, []).append(tuple(n))
            return out

        _Game.scenes = scenes
    try:
        t0 = time.perf_counter()
        arena.py_vs_py(challenger, champion, seed_start=(1, 2024), seed_count=seeds)
        if spec_out is not None:
            spec_out.extend(arena.speculated)
        return time.perf_counter() - t0, finish
    finally:
        _Game.scenes = orig_scenes


SPLIT_SEAT = {"a": 0, "b": 1, "c": 2, "d": 3}  # split -> the challenger's seat


def _early_cut(n):
    """Turns counted as "while >= 80% of the games run": those before int(0.2 * n) games have ended (the turn
    that ends the last of them included), as the bench's cutoff on the model run."""
    return max(1, int(0.2 * n))


def replay_max_pending(steps):
    """Replay the arena's rule on recorded steps: each turn serves the side with the most pending decisions
    (ties: the challenger, side 0, as the arena's ``max`` over its agents in that order); a game moves to its
    next step once every side of its step has decided.

    Args:
        steps: per game, a list of steps ``(n0, n1)``: decisions of side 0 and side 1 (not both 0).

    Returns:
        ``(per_turn, early)``: decisions served in each turn, and those of the turns while >= 80% of the games
        run (``_early_cut``).
    """
    n = len(steps)
    ptr = [0] * n
    left = [list(q[0]) for q in steps]  # decisions still pending at each game's current step
    running = set(range(n))
    cut = _early_cut(n)
    per_turn, early = [], []
    while running:
        pend = [sum(left[g][s] for g in running) for s in (0, 1)]
        side = 0 if pend[0] >= pend[1] else 1
        ended_before = n - len(running)
        for g in list(running):
            if left[g][side]:
                left[g][side] = 0
                if not any(left[g]):
                    ptr[g] += 1
                    if ptr[g] == len(steps[g]):
                        running.discard(g)
                    else:
                        left[g] = list(steps[g][ptr[g]])
        per_turn.append(pend[side])
        if ended_before < cut:
            early.append(pend[side])
    return per_turn, early


def best_schedule(steps, width):
    """Beam search for a short schedule of turns (which side each turn serves) knowing every game's future.

    A step that needs both sides is taken as side 0 then side 1 (rare: under 0.5% of the steps). Beams are the
    ``width`` schedules (after removing equal states) with the most steps done; ties: the smaller spread
    between the games. The result is the best schedule found, not a proven optimum.

    Args:
        steps: as ``replay_max_pending``.
        width: beams kept per turn (>= 1; 1 is a greedy search on steps done).

    Returns:
        ``(per_turn, early)`` as ``replay_max_pending``, for the best schedule found.
    """
    seqs = []
    for q in steps:
        seqs.append([(s, k) for n0, n1 in q for s, k in ((0, n0), (1, n1)) if k])
    n = len(seqs)
    lens = np.array([len(q) for q in seqs])
    side = np.full((n, lens.max() + 1), -1, np.int8)  # -1: the game has ended
    dec = np.zeros((n, lens.max() + 1), np.int64)
    for g, q in enumerate(seqs):
        side[g, :len(q)] = [s for s, _ in q]
        dec[g, :len(q)] = [k for _, k in q]
    rows = np.arange(n)[None, :]
    beams = np.zeros((1, n), np.int64)
    history = [()]  # per beam, the sides served so far
    while not (beams[0] >= lens).all():
        cur = side[rows, beams]
        nxt = np.concatenate([beams + (cur == s) for s in (0, 1)])
        parents = [(i, s) for s in (0, 1) for i in range(len(beams))]
        score = nxt.sum(1) - (nxt.max(1) - nxt.min(1)) / (2 * n * (lens.max() + 1))
        _, first = np.unique(nxt, axis=0, return_index=True)
        keep = first[np.argsort(-score[first], kind="stable")][:width]
        history = [history[parents[i][0]] + (parents[i][1],) for i in keep]
        beams = nxt[keep]
    # replay the winner to count decisions per turn and the early turns
    ptr = np.zeros(n, np.int64)
    cut = _early_cut(n)
    per_turn, early = [], []
    for s in history[0]:
        ended_before = int((ptr >= lens).sum())
        adv = side[rows[0], ptr] == s
        k = int(dec[rows[0], ptr][adv].sum())
        ptr += adv
        per_turn.append(k)
        if ended_before < cut:
            early.append(k)
    return per_turn, early


def _parse(argv):
    """The bench's arguments; ``--json`` is checked writable before the games, not after minutes of them."""
    from mortal import entry

    p = entry.parser(__doc__.splitlines()[0], config=False)
    p.add_argument("--seeds", type=int, default=8, help="nonces; games = 4 * seeds")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--version", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the arena shares the CPU)")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--speculate", choices=("on", "off"), default="on",
                   help="the arena decides the step after a call step in the same batch (OneVsThree(speculate_passes))")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file (bench/gpu.py --parts arena)")
    p.add_argument("--bound-width", type=int, default=64,
                   help="beams of the schedule bound (0: skip it; the search takes seconds per 32 games at 64)")
    args = entry.start(p, argv, log_level=None)
    if args.json:  # before the games, not after minutes of them
        try:
            open(args.json, "a").close()
        except OSError as e:
            p.error(f"--json {args.json}: cannot write it ({e.strerror})")
    return args


def _model_agents(args, calls, turns):
    """The two sides of the model run: a small Brain+DQN MortalEngine each (seeded), timed into ``calls``, their
    turns logged into ``turns``."""
    import torch
    from mortal.play.agent import MortalBatchAgent
    from mortal.play.engine import MortalEngine
    from mortal.model.networks import DQN, Brain

    torch.manual_seed(0)
    agents = []
    for side, name in enumerate(("challenger", "champion")):
        brain = Brain(conv_channels=args.channels, num_blocks=args.blocks, version=args.version).eval()
        dqn = DQN(version=args.version).eval()
        eng = MortalEngine(brain, dqn, version=args.version, device=torch.device(args.device), name=name)
        agents.append(TurnLog(MortalBatchAgent(Timed(eng, calls)), side, turns))
    return agents


def main(argv=None):
    args = _parse(argv)
    try:
        import torch
        from mortal.play.agent import MortalBatchAgent  # noqa: F401 (checked here, used by _model_agents)
        from mortal.play.engine import MortalEngine  # noqa: F401
        from mortal.model.networks import DQN, Brain  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"bench/arena.py needs mortal.model.networks and mortal.play.engine (and torch): {e}")
    torch.set_num_threads(args.threads)
    n_games = 4 * args.seeds

    floor_calls = []
    speculate = args.speculate == "on"
    wall_floor, _ = run(Timed(FirstLegal("floor", args.version), floor_calls),
                        Timed(FirstLegal("floor", args.version), floor_calls), args.seeds, args.progress,
                        speculate=speculate)
    floor_rows = sum(c[1] for c in floor_calls)

    calls, turns, steps, spec = [], [], {}, []
    agents = _model_agents(args, calls, turns)
    wall_model, finish = run(agents[0], agents[1], args.seeds, args.progress, steps, speculate, spec)
    # "while most games run": calls made before 20% of the games had finished
    cutoff = sorted(finish)[max(0, int(0.2 * n_games) - 1)] if finish else float("inf")
    figures = _report_runs(args, n_games, (wall_floor, floor_rows), wall_model, calls, cutoff)
    early_turns = _report_turns(turns, finish, cutoff, n_games)
    if speculate:
        figures.update(_report_speculation(turns, len(early_turns), spec, figures["rows"], n_games))
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    _report_schedule([steps[g] for g in sorted(steps)], len(turns), n_games, args.bound_width)


def _report_runs(args, n_games, floor, wall_model, calls, cutoff) -> dict:
    """Print the floor and model runs and the forward figures; returns the JSON figures. ``floor``: (wall
    seconds, engine rows) of the floor run; ``calls``: the model run's (time, rows, seconds) per forward."""
    import torch

    wall_floor, floor_rows = floor
    speculate = args.speculate == "on"
    t_fwd = sum(c[2] for c in calls)
    rows = np.array([c[1] for c in calls])
    early = np.array([c[1] for c in calls if c[0] < cutoff])
    decisions = int(rows.sum())
    figures = {"speculate_passes": speculate, "games": n_games, "device": args.device,
               "network": f"{args.channels}x{args.blocks}", "version": args.version,
               "floor_games_per_s": round(n_games / wall_floor, 4), "model_games_per_s": round(n_games / wall_model, 4),
               "model_floor_ratio": round(wall_floor / wall_model, 4), "rows": decisions, "forwards": len(calls),
               "forward_share": round(t_fwd / wall_model, 4), "rows_per_forward": round(float(rows.mean()), 2),
               "rows_per_forward_80": round(float(early.mean()), 2) if len(early) else None}
    print(f"arena: speculate_passes={speculate}")
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
    return figures


def _report_turns(turns, finish, cutoff, n_games) -> list:
    """Where the rows went: per turn while most games run, the running games not served wait on the other side.
    Returns those early turns."""
    ends = sorted(finish)
    early_turns = [t for t in turns if t[0] < cutoff]
    running = [n_games - sum(1 for e in ends if e < t[0]) for t in early_turns]
    served = [t[2] for t in early_turns]
    print(f"agent turns (react calls) while >= 80% of games run: {len(early_turns)}; per turn: "
          f"{np.mean(running):.1f} games running, {np.mean(served):.1f} served, "
          f"{np.mean(running) - np.mean(served):.1f} waiting only on the other side's agent; "
          f"scenes per turn {np.mean([t[3] for t in early_turns]):.1f}")
    return early_turns


def _report_speculation(turns, n_early, spec, decisions, n_games) -> dict:
    """The speculative scenes handed out and used, the useful ones per turn; returns their JSON figures."""
    useful = [t[3] - sum(not sc.adopted for sc in t[4]) for t in turns]
    useful_early = useful[:n_early]
    print(f"speculative scenes (the step after a call step, decided in the same batch): {spec[0]} handed to "
          f"the agents, {spec[1]} used ({spec[0] - spec[1]} = {(spec[0] - spec[1]) / max(1, decisions):.1%} of "
          f"the rows computed for nothing); useful scenes (decisions the games took) per turn: mean "
          f"{np.mean(useful):.1f}, while >= 80% of games run {np.mean(useful_early):.1f} = "
          f"{np.mean(useful_early) / n_games:.2f} N")
    print("(the replay and the bound below take the steps as recorded: a step whose decisions were decided "
          "speculatively is merged into the call step before it)")
    return dict(speculated=spec[0], speculated_used=spec[1], useful_per_turn_80=round(float(np.mean(useful_early)), 2))


def _report_schedule(seqs, run_turns, n_games, bound_width) -> None:
    """The arena's rule replayed on the recorded steps (``seqs``), and the best schedule the beam finds."""
    per_turn, early_rep = replay_max_pending(seqs)
    print(f"replay of the arena's rule on the recorded steps: {len(per_turn)} turns (run: {run_turns}); "
          f"decisions per turn mean {np.mean(per_turn):.1f}, while >= 80% run {np.mean(early_rep):.1f}")
    if bound_width > 0:
        t0 = time.perf_counter()
        per_turn, early_best = best_schedule(seqs, bound_width)
        print(f"best schedule found (beam width {bound_width}, knowing every game's future, "
              f"{time.perf_counter() - t0:.0f} s): {len(per_turn)} turns; decisions per turn mean "
              f"{np.mean(per_turn):.1f}, while >= 80% run {np.mean(early_best):.1f} = "
              f"{np.mean(early_best) / n_games:.2f} N (one side per forward)")


if __name__ == "__main__":
    main()
