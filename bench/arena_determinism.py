"""Arena logs under a change of batching: seeded 1v3 runs compared log by log.

Plays the same seeded OneVsThree games (a small random Brain+DQN per side, the champion with the agari guard)
four times per exploration setting: twice with ``speculate_passes=False`` (the batching before speculation),
once with ``speculate_passes=True``, and once without speculation but with every agent call split
into two ``react_batch`` calls (another batch composition, same games in flight). For each pair it prints how many logs
are byte-identical, equal once meta ``eval_time_ns`` (wall time) is removed, once ``batch_size`` is removed too,
and once ``q_values`` are removed too (the same events: the same game), plus the largest q-value difference.

``--epsilon 0`` is test play / 1v3 (greedy); ``--epsilon 0.2`` with the engine's seeded generator is self-play
with reproducible draws (self-play itself leaves the seed unset: torch's global RNG).

Usage: python bench/arena_determinism.py [--seeds 2] [--epsilon 0 0.2]
"""

if __package__ in (None, ''):  # run as a script: python bench/arena_determinism.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import gzip
import json
import os
import tempfile


def _engines(eps, torch):
    from mortal.model.networks import DQN, Brain
    from mortal.play.engine import MortalEngine

    torch.manual_seed(0)
    return [MortalEngine(Brain(conv_channels=32, num_blocks=2, version=3).eval(), DQN(version=3).eval(), version=3,
                         name=name, boltzmann_epsilon=e, boltzmann_temp=1.0, top_p=1.0, seed=1234,
                         enable_rule_based_agari_guard=guard)
            for name, e, guard in (("trainee", eps, False), ("baseline", 0, True))]


def _play(eps, split, seeds, log_dir, torch, speculate=False):
    from mortal.play.agent import MortalBatchAgent
    from mortal.play.arena import OneVsThree

    class Split(MortalBatchAgent):
        """Each call's scenes answered in two react_batch calls."""

        def react(self, scenes):
            h = len(scenes) // 2
            return super().react(scenes[:h]) + super().react(scenes[h:]) if h else super().react(scenes)

    a, b = _engines(eps, torch)
    if split:
        a, b = Split(a), Split(b)
    OneVsThree(disable_progress_bar=True, log_dir=log_dir, speculate_passes=speculate).py_vs_py(
        a, b, seed_start=(300, 7), seed_count=seeds)
    return {f: gzip.open(os.path.join(log_dir, f)).read() for f in sorted(os.listdir(log_dir))}


def strip(raw: bytes, keys) -> list:
    """The events of a log (gzip-decoded bytes) with ``keys`` removed from every meta (and its kan_select)."""
    out = []
    for line in raw.decode().splitlines():
        ev = json.loads(line)
        for m in (ev.get("meta"), (ev.get("meta") or {}).get("kan_select")):
            for k in keys if m else ():
                m.pop(k, None)
        out.append(ev)
    return out


def compare(x: dict, y: dict) -> str:
    """One line: how many of the logs (name -> bytes) are equal at each level, and the largest q-value gap
    over the logs that hold the same game (equal but for the meta keys)."""
    levels = [[], ["eval_time_ns"], ["eval_time_ns", "batch_size"], ["eval_time_ns", "batch_size", "q_values"]]
    counts = [sum((x[f] == y[f]) if not keys else strip(x[f], keys) == strip(y[f], keys) for f in x)
              for keys in levels]
    worst = 0.0
    for f in x:
        if strip(x[f], levels[3]) != strip(y[f], levels[3]):
            continue  # another game: its q-values are of other positions
        for ea, eb in zip(strip(x[f], levels[2]), strip(y[f], levels[2])):
            qa, qb = (ea.get("meta") or {}).get("q_values"), (eb.get("meta") or {}).get("q_values")
            if qa and qb and len(qa) == len(qb):
                worst = max(worst, max(abs(p - q) for p, q in zip(qa, qb)))
    return (f"{len(x)} logs: byte-identical {counts[0]}, without eval_time_ns {counts[1]}, also without batch_size "
            f"{counts[2]}, also without q_values {counts[3]}; max |q difference| in the same games {worst:.1e}")


def main(argv=None):
    from mortal import entry

    p = entry.parser(__doc__.splitlines()[0], config=False)
    p.add_argument("--seeds", type=int, default=2, help="nonces; games = 4 * seeds")
    p.add_argument("--epsilon", type=float, nargs="+", default=[0.0, 0.2])
    args = entry.start(p, argv, log_level=None)
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for eps in args.epsilon:
            runs = {}
            for name, split, spec in (("a", False, False), ("b", False, False), ("on", False, True),
                                      ("split", True, False)):
                d = os.path.join(tmp, f"{eps}_{name}")
                os.makedirs(d)
                runs[name] = _play(eps, split, args.seeds, d, torch, spec)
            print(f"epsilon {eps}, no speculation twice:      {compare(runs['a'], runs['b'])}")
            print(f"epsilon {eps}, speculation off vs on:     {compare(runs['a'], runs['on'])}")
            print(f"epsilon {eps}, off vs off + split batches: {compare(runs['a'], runs['split'])}")


if __name__ == "__main__":
    main()
