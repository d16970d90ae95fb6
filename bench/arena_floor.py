"""The arena against its engine's floor: µs per decision of the client's arena and of the bare loop beneath it.

Both run a zero-cost policy (the lowest legal Mortal action index), interleaved in one process (floor, arena,
floor, arena, ...), at each version asked:

* **floor**: ``riichienv`` tables playing whole hanchan (``game_mode`` 2, Tenhou's kuikae rule), four
  ``mjai`` ``PlayerState`` s per table fed each seat's new events, the version's observation encoded at every
  decision (``PlayerState.encode_obs``; version 4: the seats' ``V4Encoder`` s, one ``encode_batch`` per pass over
  the tables, as the arena batches its searches), the lowest legal index mapped to a table action. No logs, no
  arena code: the least any arena on these engines can spend per decision.
* **arena**: ``mortal.play.arena.OneVsThree`` as the client runs it (``log_dir`` set, so every game's gzip log
  is written; ``speculate_passes`` off), with ``FirstLegal`` engines (``bench/arena.py``) on both sides; with
  ``--batch`` the engine first makes its rows one ``(N, C, 34)`` array, as a network's forward must (a stack of
  the rows when it is handed a list, nothing when it is handed an array).

With ``--bare`` (versions 1-3) a third loop runs between them, ``bare_run``: the floor's loop plus the arena's
outputs and no other structure (reactions through the table's parser, meta, the seats' events, logs), its rows
held, dropped or packed: what the outputs alone cost (docs/performance.md, session 34).

A decision is one seat asked by its table (a scene, quick-eval ones included). Per version the bench prints each
round's µs per decision, the median of the rounds and floor / arena (the arena's share of the floor's speed;
1.0 = at the floor) with its spread over the rounds, in wall time and in CPU time of the process (all its
threads: on a shared machine the steadier figure; a log-writer thread's work counts, its overlap does not).

With ``--against OLD`` (another checkout), each round runs this bench once on the old tree and once on this one,
alternating (old, new, old, new, ...), each in a fresh process that measures its own floor and arena; it prints
both trees' floor / arena per round and their medians. ``--tree DIR`` runs the arena of the checkout ``DIR``.

Usage: ``python bench/arena_floor.py [--versions 3 4] [--games 128] [--games-v4 16] [--rounds 2] [--json PATH]
[--bare] [--against OLD | --tree DIR]`` (``--games`` rounded up to a multiple of 4: the arena plays each seed in 4
rotations).
"""

if __name__ == '__main__' and __package__ in (None, ''):  # run as a script: python bench/arena_floor.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import inspect
import json
import statistics
import tempfile
import time

# riichienv ActionType (its int value) -> Mortal action index; discards (0) and chi (1) are resolved by tile
_FIXED = {5: 37, 2: 41, 3: 42, 8: 42, 9: 42, 6: 43, 4: 43, 10: 44, 7: 45}
_RED = {16: 34, 52: 35, 88: 36}  # riichienv's red five tile ids -> Mortal's red five indices


def mortal_index(action) -> int:
    """Mortal's action index (0-45) of a ``riichienv`` ``Action`` (136-tile ids; a chi's type from the called
    tile's place in its run)."""
    kind = int(action.action_type)
    if kind == 0:
        t = action.tile
        return _RED.get(t, t // 4)
    if kind == 1:
        called = action.tile // 4
        below = sum(t // 4 < called for t in action.consume_tiles)  # 0: called is the low tile, 1: mid, 2: high
        return 38 + below
    return _FIXED[kind]


def _first_legal_action(ob, mask):
    """The first table action whose Mortal index is the lowest legal one in ``mask`` (46,) bool."""
    want = int(mask.argmax())
    for a in ob.legal_actions():
        if mortal_index(a) == want:
            return a
    raise RuntimeError(f"no table action for Mortal index {want} among {ob.legal_actions()}")


def floor_run(version: int, games: int, seed0: int = 1) -> tuple[float, int, float]:
    """Play ``games`` hanchan on bare tables (see the module docstring); returns (wall seconds, decisions, CPU
    seconds of the process)."""
    import numpy as np  # noqa: F401 (the masks are numpy arrays)
    from mjai.mlibriichi.state import PlayerState
    from riichienv import GameRule, RiichiEnv

    encode_batch = None
    if version == 4:
        from mortal.features.obs_v4 import V4Encoder, encode_batch
    rule = GameRule(sanchaho_is_draw=False, kuikae_forbidden=True)
    t0, c0 = time.perf_counter(), time.process_time()
    tables = []
    for g in range(games):
        env = RiichiEnv(game_mode=2, seed=seed0 + g, rule=rule)
        encs = [V4Encoder(s) for s in range(4)] if version == 4 else [None] * 4
        tables.append((env, [PlayerState(s) for s in range(4)], encs, env.reset()))
    decisions = 0
    while tables:
        asked = []  # (table index, seat, ob)
        for i, (env, states, encs, obs) in enumerate(tables):
            for seat, ob in obs.items():
                st, enc = states[seat], encs[seat]
                for ev in ob.new_events():
                    st.update(ev)
                    if enc is not None:
                        enc.update(ev)
                asked.append((i, seat, ob))
        if version == 4:
            masks = [m for _, m in encode_batch([(tables[i][2][s], tables[i][1][s], False) for i, s, _ in asked])]
        else:
            masks = [tables[i][1][s].encode_obs(version, False)[1] for i, s, _ in asked]
        decisions += len(asked)
        actions = [{} for _ in tables]
        for (i, seat, ob), mask in zip(asked, masks):
            actions[i][seat] = _first_legal_action(ob, mask)
        left = []
        for (env, states, encs, _), act in zip(tables, actions):
            obs = env.step(act)
            if not env.done():
                left.append((env, states, encs, obs))
        tables = left
    return time.perf_counter() - t0, decisions, time.process_time() - c0


BARE_ROWS = ("held", "dropped", "packed")


class _BareTable:
    """One hanchan of ``bare_run``: its table, seat states, the table's asks now, each seat's events (the arena's
    ``history``) and each seat's ``[reaction, meta]`` queue (``kyoku_lines``'s ``meta_queues``)."""

    __slots__ = ("game", "env", "states", "obs", "views", "queues")

    def __init__(self, game: int, env):
        from mjai.mlibriichi.state import PlayerState
        self.game, self.env = game, env
        self.states = [PlayerState(s) for s in range(4)]
        self.obs = env.reset()
        self.views = [[], [], [], []]
        self.queues = [[], [], [], []]


def bare_run(version: int, games: int, log_dir: str, seed0: int = 1, rows: str = "held") -> tuple[float, int, float]:
    """The floor's loop (the same tables, seeds ``seed0`` .. ``seed0 + games - 1`` and decisions) plus what the arena
    must produce beyond it, with no other structure: each batch's observations held until its actions are chosen
    (as an engine's batch must be), quick eval (one legal discard: no meta), the action as an mjai reaction dict
    handed to the table's parser, Mortal's meta for each logged reaction, each seat's events kept, and at a
    hanchan's end its log (``kyoku_lines`` of the whole hanchan, meta rendered) gzipped at level 1 on the
    ``LogWriter`` thread to ``log_dir/{game}.json.gz``; gc's threshold as the arena's.

    ``rows`` (``BARE_ROWS``): "dropped" keeps only the masks, as the floor does (what no engine could do: the cost
    of holding the rows); "packed" packs each row into the batch's buffer at once (``mortal.features.packed_obs``,
    about a tenth of the bytes) and drops it. Versions 1-3. Returns (wall seconds, decisions, CPU seconds of the
    process)."""
    import gc

    from riichienv import GameRule, RiichiEnv

    from mortal.play.arena import GC_THRESHOLD

    if rows not in BARE_ROWS:
        raise ValueError(f"rows must be one of {BARE_ROWS}, got {rows!r}")
    if version not in (1, 2, 3):
        raise ValueError(f"bare_run plays versions 1-3, got {version}")
    rule = GameRule(sanchaho_is_draw=False, kuikae_forbidden=True)
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], GC_THRESHOLD), *thresholds[1:])
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        tables = [_BareTable(g, RiichiEnv(game_mode=2, seed=seed0 + g, rule=rule)) for g in range(games)]
        decisions = _bare_loop(tables, version, log_dir, rows)
        return time.perf_counter() - t0, decisions, time.process_time() - c0
    finally:
        gc.set_threshold(*thresholds)


def _bare_loop(tables: list, version: int, log_dir: str, rows: str) -> int:
    """``bare_run``'s loop over its ``_BareTable`` s until every hanchan ends; returns the decisions."""
    import os
    import types

    import numpy as np

    from mortal.features.packed_obs import packer, row_bytes
    from mortal.play.agent import _quick_eval_batch, _reaction, batch_meta_parts
    from mortal.play.log_writer import REACTION_TYPES, LogWriter, kyoku_lines, render_line

    pack, width = packer(version), row_bytes(version)
    decisions = 0
    with LogWriter(1) as logs:
        while tables:
            asked = []  # (table, seat, ob, state)
            for t in tables:
                for seat, ob in t.obs.items():
                    st = t.states[seat]
                    events = ob.new_events()
                    for ev in events:
                        st.update(ev)
                    t.views[seat].extend(events)
                    asked.append((t, seat, ob, st))
            if rows == "held":
                batch = [st.encode_obs(version, False) for _, _, _, st in asked]  # the batch's rows
                masks = np.array([m for _, m in batch], dtype=bool)
            elif rows == "dropped":
                masks = np.array([st.encode_obs(version, False)[1] for _, _, _, st in asked], dtype=bool)
            else:
                batch = np.empty((len(asked), width), dtype=np.uint8)
                masks = np.empty((len(asked), 46), dtype=bool)
                for k, (_, _, _, st) in enumerate(asked):
                    obs, masks[k] = st.encode_obs(version, False)
                    pack(obs, batch, k)
            only = _quick_eval_batch([types.SimpleNamespace(state=a[3]) for a in asked], list(masks))
            chosen = masks.argmax(1).tolist()
            batch = None  # an engine's rows live until it has answered
            legal_q, bits = batch_meta_parts(np.where(masks, np.float32(0), np.float32(-np.inf)), masks)
            n = len(asked)
            decisions += n
            acted: dict = {}  # id(table) -> (actions, seats whose call may not be executed)
            for k, (t, seat, ob, st) in enumerate(asked):
                actions, calls = acted.setdefault(id(t), ({}, []))
                reaction = _reaction(st, chosen[k])
                actions[seat] = ob.select_action_from_mjai(reaction)
                if reaction["type"] in REACTION_TYPES:
                    meta = None if only[k] is not None else {
                        "q_values": legal_q[k], "mask_bits": bits[k], "is_greedy": True, "shanten": int(st.shanten),
                        "at_furiten": bool(st.at_furiten), "batch_size": n, "eval_time_ns": 0}
                    t.queues[seat].append([reaction, meta])
                    if reaction["type"] in ("chi", "pon", "daiminkan"):
                        calls.append(seat)
            left = []
            for t in tables:
                actions, calls = acted[id(t)]
                t.obs = t.env.step(actions)
                # a call is executed iff its caller acts next; safe across a kyoku's end in game_mode 2 because the
                # table asks a ron alone, before any call (else kyoku_lines raises: loud, not skewed)
                for seat in calls:
                    if seat not in t.obs:
                        t.queues[seat].pop()
                if not t.env.done():
                    left.append(t)
                    continue
                for seat, ob in t.env.get_observations([0, 1, 2, 3]).items():
                    t.views[seat].extend(ob.new_events())
                lines, _ = kyoku_lines(t.views, t.queues)
                logs.submit(os.path.join(log_dir, f"{t.game}.json.gz"), "\n".join(map(render_line, lines)) + "\n")
            tables = left
    return decisions


def _first_legal_cls(batch: bool = False):
    """``FirstLegal`` of ``bench/arena.py`` (loaded from its file: bench is no package); ``batch``: a subclass that
    first makes the rows one ``(N, C, 34)`` float32 array, as a network's forward must (``np.stack`` of a list; an
    array as it is)."""
    import importlib.util
    import pathlib

    import numpy as np

    path = pathlib.Path(__file__).resolve().parent / "arena.py"
    spec = importlib.util.spec_from_file_location("arena_bench_floor", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not batch:
        return mod.FirstLegal

    class FirstLegalBatch(mod.FirstLegal):
        def react_arrays(self, obs, masks, invisible_obs=None):
            rows = obs if isinstance(obs, np.ndarray) else np.stack(obs)
            assert rows.dtype == np.float32 and len(rows) == len(masks)
            return super().react_arrays(rows, masks, invisible_obs)

    return FirstLegalBatch


def arena_run(version: int, games: int, log_dir: str, first_legal=None) -> tuple[float, int, float]:
    """Play ``games`` hanchan (rounded up to a multiple of 4) in the client's arena with ``FirstLegal`` engines,
    writing logs to ``log_dir``; returns (wall seconds, decisions, CPU seconds of the process: all its threads). ``first_legal``: the engine class (default
    ``bench/arena.py``'s ``FirstLegal``)."""
    from mortal.play.agent import MortalBatchAgent
    from mortal.play.arena import OneVsThree

    cls = first_legal or _first_legal_cls()
    chal, champ = MortalBatchAgent(cls("challenger", version)), MortalBatchAgent(cls("champion", version))
    # the client's gzip level 1 (session 25); an older checkout (--against) has only Mortal's 9
    level = {"log_compresslevel": 1} if "log_compresslevel" in inspect.signature(OneVsThree).parameters else {}
    t0, c0 = time.perf_counter(), time.process_time()
    OneVsThree(disable_progress_bar=True, log_dir=log_dir, **level).py_vs_py(chal, champ, seed_start=(1, 2024),
                                                                   seed_count=max(1, -(-games // 4)))
    return time.perf_counter() - t0, chal.decisions + champ.decisions, time.process_time() - c0


def measure(version: int, games: int, rounds: int, log=print, batch: bool = False, bare: bool = False) -> dict:
    """Interleaved rounds of floor and arena at ``version``; returns the figures (µs per decision per round,
    medians, ratio floor / arena per round). ``batch``: the arena's engine takes its rows as one array. ``bare``
    (versions 1-3): each round also runs ``bare_run`` once per ``BARE_ROWS`` after its floor, in an order that turns
    with the round, the arena among them (``bare_held`` etc.: CPU µs per decision, CPU ratios floor / bare and
    bare / arena)."""
    cls = _first_legal_cls(batch)
    log(f"v{version}: {games} games; arena engine {cls.__name__} ({'rows as one array' if batch else 'rows as handed'})")
    floor_us, arena_us, ratios, floor_cpu, arena_cpu, cpu_ratios = [], [], [], [], [], []
    bare_cpu = {kind: [] for kind in BARE_ROWS}
    bare = bare and version != 4
    for r in range(rounds):
        sec, n, cpu = floor_run(version, games)
        floor_us.append(1e6 * sec / n)
        floor_cpu.append(1e6 * cpu / n)
        loops = [*BARE_ROWS, "arena"] if bare else ["arena"]
        for kind in loops[r % len(loops):] + loops[:r % len(loops)]:  # each first in turn: the drift spread over them
            if kind != "arena":
                with tempfile.TemporaryDirectory() as d:
                    sec_b, n_b, cpu_b = bare_run(version, games, d, rows=kind)
                if n_b != n:
                    raise RuntimeError(f"bare loop: {n_b} decisions, the floor's same games {n}")
                bare_cpu[kind].append(1e6 * cpu_b / n)
                log(f"v{version} round {r + 1}: bare, rows {kind}: {1e6 * sec_b / n:6.1f} µs/decision, CPU "
                    f"{bare_cpu[kind][-1]:.1f}; CPU floor/bare {floor_cpu[-1] / bare_cpu[kind][-1]:.3f}")
                continue
            with tempfile.TemporaryDirectory() as d:
                sec_a, n_a, cpu_a = arena_run(version, games, d, cls)
            arena_us.append(1e6 * sec_a / n_a)
            arena_cpu.append(1e6 * cpu_a / n_a)
            ratios.append(floor_us[-1] / arena_us[-1])
            cpu_ratios.append(floor_cpu[-1] / arena_cpu[-1])
            log(f"v{version} round {r + 1}: floor {floor_us[-1]:6.1f} µs/decision ({n} decisions, {sec:.1f} s); "
                f"arena {arena_us[-1]:6.1f} µs/decision ({n_a} decisions, {sec_a:.1f} s); floor/arena "
                f"{ratios[-1]:.3f}; CPU: floor {floor_cpu[-1]:.1f}, arena {arena_cpu[-1]:.1f} µs/decision, "
                f"floor/arena {cpu_ratios[-1]:.3f}")
    med = statistics.median
    fig = {"version": version, "games": games, "rounds": rounds, "batch": batch,
           "floor_us": [round(v, 2) for v in floor_us], "arena_us": [round(v, 2) for v in arena_us],
           "ratio": [round(v, 4) for v in ratios],
           "floor_cpu_us": [round(v, 2) for v in floor_cpu], "arena_cpu_us": [round(v, 2) for v in arena_cpu],
           "cpu_ratio": [round(v, 4) for v in cpu_ratios],
           "floor_us_median": round(med(floor_us), 2), "arena_us_median": round(med(arena_us), 2),
           "ratio_median": round(med(ratios), 4), "cpu_ratio_median": round(med(cpu_ratios), 4)}
    for kind in BARE_ROWS if bare else ():
        fb = [f / b for f, b in zip(floor_cpu, bare_cpu[kind])]
        ba = [b / a for b, a in zip(bare_cpu[kind], arena_cpu)]
        fig[f"bare_{kind}"] = {"cpu_us": [round(v, 2) for v in bare_cpu[kind]],
                               "floor_bare_cpu": [round(v, 4) for v in fb], "bare_arena_cpu": [round(v, 4) for v in ba]}
        log(f"v{version}: CPU time: floor/bare (rows {kind}) {med(fb):.3f} (rounds {min(fb):.3f}-{max(fb):.3f}), "
            f"bare/arena {med(ba):.3f} (rounds {min(ba):.3f}-{max(ba):.3f})")
    spread = f" (rounds {min(ratios):.3f}-{max(ratios):.3f})" if rounds > 1 else ""
    log(f"v{version}: floor {fig['floor_us_median']:.1f} µs/decision, arena {fig['arena_us_median']:.1f} µs/decision, "
        f"floor/arena {fig['ratio_median']:.3f}{spread}; CPU time: floor/arena {fig['cpu_ratio_median']:.3f}")
    return fig


def against(args) -> list:
    """``--against``: alternate fresh processes of this bench on the old tree and this one; returns per tree the
    figures of its rounds."""
    import os
    import pathlib
    import subprocess
    import sys

    here = pathlib.Path(__file__).resolve()
    trees = {"old": pathlib.Path(args.against).resolve(), "new": here.parent.parent}
    runs = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for name, tree in trees.items():
                out = os.path.join(d, f"{name}{r}.json")
                cmd = [sys.executable, str(here), "--tree", str(tree), "--rounds", "1", "--json", out,
                       "--games", str(args.games), "--games-v4", str(args.games_v4),
                       "--versions", *map(str, args.versions)] + (["--batch"] if args.batch else [])
                print(f"round {r + 1}, {name} tree ({tree}):", flush=True)
                subprocess.run(cmd, check=True)
                with open(out) as f:
                    runs[name].append(json.load(f))
    for k, v in enumerate(args.versions):
        for name in trees:
            figs = [run[k] for run in runs[name]]
            ratios = [f["ratio"][0] for f in figs]
            cpu = [f["cpu_ratio"][0] for f in figs]
            arena = [f["arena_us"][0] for f in figs]
            arena_cpu = [f["arena_cpu_us"][0] for f in figs]
            print(f"v{v} {name}: floor/arena {statistics.median(ratios):.3f} (rounds "
                  f"{', '.join(f'{x:.3f}' for x in ratios)}); CPU floor/arena {statistics.median(cpu):.3f} (rounds "
                  f"{', '.join(f'{x:.3f}' for x in cpu)}); arena {statistics.median(arena):.1f} µs/decision, "
                  f"{statistics.median(arena_cpu):.1f} CPU µs/decision")
    return [runs[name] for name in trees]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", type=int, nargs="+", default=[3, 4], choices=(1, 2, 3, 4))
    p.add_argument("--games", type=int, default=128, help="hanchan per run at versions 1-3")
    p.add_argument("--games-v4", type=int, default=16, help="hanchan per run at version 4 (its search is slow)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved floor/arena rounds per version")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument("--against", default=None, metavar="OLD", help="alternate runs on the checkout OLD and this one")
    p.add_argument("--tree", default=None, metavar="DIR", help="import mortal from the checkout DIR")
    p.add_argument("--batch", action="store_true",
                   help="the arena's engine first makes its rows one (N, C, 34) array, as a network must")
    p.add_argument("--bare", action="store_true",
                   help="versions 1-3: also run the floor's loop with the arena's outputs and nothing else "
                        "(bare_run), its rows held, dropped and packed")
    args = p.parse_args(argv)
    if args.games < 1 or args.games_v4 < 1 or args.rounds < 1:
        p.error("--games, --games-v4 and --rounds must be >= 1")
    if args.against:
        return against(args)
    if args.tree:
        import pathlib
        import sys
        sys.path.insert(0, args.tree)
        import mortal  # now: this tree's package, whatever a bench module does to sys.path later
        if pathlib.Path(args.tree).resolve() not in pathlib.Path(mortal.__file__).resolve().parents:
            p.error(f"--tree {args.tree}: mortal imported from {mortal.__file__}")
    out = [measure(v, args.games_v4 if v == 4 else args.games, args.rounds, batch=args.batch, bare=args.bare)
           for v in args.versions]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
