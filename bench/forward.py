"""The CPU forward of a small model: today's path against its candidates, interleaved in one run.

Observations are real: every decision of the two public hanchan in tests/data, encoded at ``--version`` for all
four seats (about 1,500). The model is a freshly initialised ``Brain`` + ``DQN`` of ``--channels`` x ``--blocks``
(the quickstart's 32 x 2 by default) whose BatchNorms get random running statistics and affine weights, as a
trained model has. Each variant maps a list of N observations and masks to greedy actions and q-values, as
``MortalEngine.react_batch`` does:

* ``today``: ``MortalEngine(frozen_cpu=False)`` (np.stack, tensor, Brain, DQN under ``inference_mode``);
* ``no_grad``: the same under ``torch.no_grad`` instead of ``inference_mode``;
* ``jit``: Brain + DQN traced at the batch size, ``torch.jit.freeze`` (folds BatchNorm, oneDNN layouts);
* ``bf16``: today's modules under CPU autocast to bfloat16;
* ``frozen_dense``: ``mortal.model.inference.FrozenQ`` with the dense first convolution;
* ``frozen``: ``MortalEngine()`` as it runs now (FrozenQ, sparse first convolution);
* ``compile`` (``--compile``): ``torch.compile`` of Brain + DQN; its compile time is printed.

For each batch size and thread count the variants run in turn (A B C ... A B C ...), ``--reps`` times; the bench
prints µs per row, of process CPU time (steadier on a shared machine; with 2 threads it sums both) and of wall
time, each as the median and each variant's speed-up over ``today`` (median of the per-round ratios, and their
10-90% spread), and the largest q-value difference to ``today`` over all observations. ``--profile``
prints the torch profiler's op table of ``today`` and ``frozen`` at batch 96.

``--selfplay`` instead plays the quickstart's self-play round (``selfplay``), today's engine against the frozen
one, A B A B.

Usage: python bench/forward.py [--version 3] [--channels 32] [--blocks 2] [--batches 1,16,64,96,128]
       [--threads 1,2] [--reps 7] [--variants today,frozen,...] [--compile] [--profile]
       python bench/forward.py --selfplay [--seeds 4] [--pairs 2] [--threads 1]
"""

if __package__ in (None, ''):  # run as a script: python bench/forward.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LOGS = [ROOT / "tests/data/riichienv_selfplay_hanchan.jsonl", ROOT / "tests/data/meta_annotated_hanchan.jsonl"]


def real_observations(version: int, logs=LOGS, seats=range(4)) -> tuple[list, list]:
    """Every decision of ``logs`` for ``seats`` (default all four): (obs list of (C, 34) float32, mask list of
    (46,) bool)."""
    from mjai.mlibriichi.state import PlayerState
    from mortal.features.obs import encode, new_v4_encoder

    obs, masks = [], []
    for log in logs:
        lines = Path(log).read_text().splitlines()
        for seat in seats:
            state, v4 = PlayerState(seat), new_v4_encoder(version, seat)
            for line in lines:
                if v4 is not None:
                    v4.update(line)
                if state.update(line).can_act:
                    o, m = encode(state, version, False, v4=v4)
                    obs.append(o)
                    masks.append(m)
    return obs, masks


def trained_like(version: int, channels: int, blocks: int, seed: int = 0):
    """A fresh Brain + DQN (eval) with random BatchNorm statistics and affine weights."""
    import torch
    from mortal.model.networks import DQN, Brain

    torch.manual_seed(seed)
    brain, dqn = Brain(conv_channels=channels, num_blocks=blocks, version=version), DQN(version=version)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in brain.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 2 + 0.2)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
    return brain.eval(), dqn.eval()


class CountingEngine:
    """An engine that adds the rows handed to it to ``rows[0]`` (a list the wrappers of one round share) and is
    otherwise ``engine``; the arena's agent calls its ``react_arrays`` as it calls the engine's."""

    def __init__(self, engine, rows: list):
        self._engine, self._rows = engine, rows

    def __getattr__(self, attr):
        return getattr(self._engine, attr)

    def react_batch(self, obs, masks, invisible_obs=None):
        self._rows[0] += len(obs)
        return self._engine.react_batch(obs, masks, invisible_obs)

    def react_arrays(self, obs, masks, invisible_obs=None):
        self._rows[0] += len(obs)
        return self._engine.react_arrays(obs, masks, invisible_obs)

    react_batch.lists_of_arrays = True  # as MortalEngine's (mortal.play.agent._array_call); an older agent ignores it


class _Pair:
    """Brain + DQN as one module (for jit and compile): (obs, mask) -> q."""

    def __new__(cls, brain, dqn):
        import torch

        class Pair(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.brain, self.dqn = brain, dqn

            def forward(self, obs, mask):
                out = self.brain(obs)
                return self.dqn(out[0] if isinstance(out, tuple) else out, mask)

        return Pair().eval()


def _select(q, mask_t):
    import torch
    q = q.float().masked_fill(~mask_t, -torch.inf)
    return q.argmax(-1).tolist(), q.tolist()


def make_variants(names, brain, dqn, version, batch, obs, compile_log):
    """name -> f(obs list, mask list) -> (actions, q lists)."""
    import torch
    from mortal.model.inference import FrozenQ
    from mortal.play.engine import MortalEngine

    today = MortalEngine(brain, dqn, version=version, frozen_cpu=False)
    frozen = MortalEngine(brain, dqn, version=version)
    out = {}

    def engine_call(engine):
        def f(o, m):
            a, q, _, _ = engine.react_batch(o, m)
            return a, q
        return f

    def module_call(fn, mode):
        def f(o, m):
            with mode():
                mask_t = torch.from_numpy(np.stack(m))
                return _select(fn(torch.from_numpy(np.stack(o)), mask_t), mask_t)
        return f

    pair = _Pair(brain, dqn)
    for name in names:
        if name == "today":
            out[name] = engine_call(today)
        elif name == "frozen":
            out[name] = engine_call(frozen)
        elif name == "no_grad":
            out[name] = module_call(pair, torch.no_grad)
        elif name == "bf16":
            def bf16(x, mask):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return pair(x, mask)
            out[name] = module_call(bf16, torch.inference_mode)
        elif name == "frozen_dense":
            fq = FrozenQ(brain, dqn, sparse_stem=False)
            out[name] = module_call(lambda x, mask: fq.q_values(x.numpy(), mask), torch.inference_mode)
        elif name == "jit":
            with torch.no_grad():
                x = torch.from_numpy(np.stack([obs[i % len(obs)] for i in range(batch)]))
                mask = torch.ones(batch, 46, dtype=torch.bool)
                traced = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(pair, (x, mask))))
                traced(x, mask)
            out[name] = module_call(traced, torch.no_grad)
        elif name == "compile":
            compiled = torch.compile(pair, dynamic=True)
            t0 = time.perf_counter()
            with torch.inference_mode():
                x = torch.from_numpy(np.stack([obs[i % len(obs)] for i in range(batch)]))
                compiled(x, torch.ones(batch, 46, dtype=torch.bool))
            compile_log.append((batch, time.perf_counter() - t0))
            out[name] = module_call(compiled, torch.inference_mode)
        else:
            raise SystemExit(f"unknown variant {name!r}")
    return out


def max_q_diff(variants, obs, masks, chunk=128):
    """Largest |q - q_today| over finite entries, and the share of rows whose greedy action differs."""
    worst = {k: 0.0 for k in variants}
    flips = {k: 0 for k in variants}
    for i in range(0, len(obs), chunk):
        o, m = obs[i:i + chunk], masks[i:i + chunk]
        a_ref, q_ref = variants["today"](o, m)
        q_ref = np.array(q_ref)
        fin = np.isfinite(q_ref)
        for k, f in variants.items():
            a, q = f(o, m)
            worst[k] = max(worst[k], float(np.abs(np.array(q)[fin] - q_ref[fin]).max()))
            flips[k] += int((np.array(a) != np.array(a_ref)).sum())
    return worst, {k: v / len(obs) for k, v in flips.items()}


def profile(variants, obs, masks, batch=96):
    from torch.profiler import ProfilerActivity, profile as tprofile

    o, m = obs[:batch], masks[:batch]
    for name in ("today", "frozen"):
        f = variants[name]
        for _ in range(3):
            f(o, m)
        with tprofile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
            for _ in range(10):
                f(o, m)
        print(f"--- profile of {name}, batch {batch}, 10 calls ---")
        print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=14,
                                                              max_name_column_width=28, max_shapes_column_width=48))


def selfplay(args, brain, dqn, out=print):
    """The quickstart's self-play round, today's engine (A) against the frozen one (B), A B A B ...: OneVsThree of
    ``--seeds`` x 4 games with logs written (as TrainPlayer.train_play), the trainee greedy-with-exploration as in
    the embedded config, the same model on both sides. Prints rows/s (wall) and CPU µs per row of each run, and
    the B/A ratios (median and range over the pairs)."""
    import tempfile

    import torch
    from mortal.play.arena import OneVsThree
    from mortal.play.engine import MortalEngine

    figures = {"today": [], "frozen": []}
    for pair in range(args.pairs):
        for name in ("today", "frozen"):
            frozen = name == "frozen"
            rows = [0]
            trainee = MortalEngine(brain, dqn, version=args.version, name="trainee", boltzmann_epsilon=0.005,
                                   boltzmann_temp=0.05, seed=pair, frozen_cpu=frozen)
            baseline = MortalEngine(brain, dqn, version=args.version, name="baseline",
                                    enable_rule_based_agari_guard=True, frozen_cpu=frozen)
            with tempfile.TemporaryDirectory() as log_dir:
                arena = OneVsThree(disable_progress_bar=True, log_dir=log_dir)
                t0, c0 = time.perf_counter(), time.process_time()
                arena.py_vs_py(CountingEngine(trainee, rows), CountingEngine(baseline, rows),
                               seed_start=(10000 + pair, 2024), seed_count=args.seeds)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            figures[name].append((rows[0], wall, cpu))
            out(f"selfplay pair {pair} {name:6s}: {rows[0]} rows in {wall:.1f} s = {rows[0] / wall:.0f} rows/s; "
                f"CPU {cpu / rows[0] * 1e6:.0f} us/row (torch threads {torch.get_num_threads()})")
    a, b = np.array(figures["today"]), np.array(figures["frozen"])
    speed = (b[:, 0] / b[:, 1]) / (a[:, 0] / a[:, 1])
    cpu = (a[:, 2] / a[:, 0]) / (b[:, 2] / b[:, 0])
    out(f"selfplay frozen/today: rows/s x{np.median(speed):.2f} [{speed.min():.2f}-{speed.max():.2f}], "
        f"CPU per row x{np.median(cpu):.2f} [{cpu.min():.2f}-{cpu.max():.2f}] over {args.pairs} pairs")
    return figures


def main(argv=None):
    from mortal import entry

    p = entry.parser(__doc__.splitlines()[0], config=False)
    p.add_argument("--version", type=int, default=3)
    p.add_argument("--channels", type=int, default=32)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--batches", default="1,16,64,96,128")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--rows", type=int, default=400, help="rows timed per variant per round (at least one call)")
    p.add_argument("--variants", default="today,no_grad,jit,bf16,frozen_dense,frozen")
    p.add_argument("--compile", action="store_true", help="also torch.compile (slow to compile)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--selfplay", action="store_true",
                   help="instead: self-play rounds (OneVsThree, logs written), today's engine vs the frozen one")
    p.add_argument("--seeds", type=int, default=4, help="--selfplay: nonces per round (games = 4 x seeds; the "
                   "quickstart's train_games 16 = 4)")
    p.add_argument("--pairs", type=int, default=2, help="--selfplay: A B rounds")
    args = entry.start(p, argv, log_level=None)

    import torch
    from mortal.model.inference import HAVE_SPARSE_STEM

    if args.selfplay:
        torch.set_num_threads(int(args.threads.split(",")[0]))
        selfplay(args, *trained_like(args.version, args.channels, args.blocks))
        return
    names = args.variants.split(",") + (["compile"] if args.compile else [])
    if "today" not in names:
        names.insert(0, "today")
    obs, masks = real_observations(args.version)
    brain, dqn = trained_like(args.version, args.channels, args.blocks)
    density = float(np.mean([np.count_nonzero(o) / o.size for o in obs]))
    print(f"model: Brain({args.channels}x{args.blocks}, version {args.version}) + DQN; {len(obs)} real observations "
          f"{obs[0].shape}, {density:.1%} nonzero; sparse first convolution built: {HAVE_SPARSE_STEM}")
    rng = np.random.default_rng(0)
    compile_log = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for batch in [int(b) for b in args.batches.split(",")]:
            variants = make_variants(names, brain, dqn, args.version, batch, obs, compile_log)
            if threads == int(args.threads.split(",")[0]) and batch == int(args.batches.split(",")[-1]):
                worst, flips = max_q_diff(variants, obs, masks)
                print(f"  max |q - q_today| over all observations (batch 128 chunks): " + ", ".join(
                    f"{k} {worst[k]:.2e} (greedy differs {flips[k]:.2%})" for k in names))
            calls = max(1, args.rows // batch)
            wall = {k: [] for k in names}
            cpu = {k: [] for k in names}
            for _ in range(args.reps):
                idx = rng.choice(len(obs), batch)
                o, m = [obs[i] for i in idx], [masks[i] for i in idx]
                for k in names:
                    variants[k](o, m)  # warm
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(calls):
                        variants[k](o, m)
                    wall[k].append((time.perf_counter() - t0) / calls / batch * 1e6)
                    cpu[k].append((time.process_time() - c0) / calls / batch * 1e6)
            for label, times in (("cpu", cpu), ("wall", wall)):
                base = np.array(times["today"])
                line = []
                for k in names:
                    t = np.array(times[k])
                    ratio = base / t
                    line.append(f"{k} {np.median(t):.1f} x{np.median(ratio):.2f} "
                                f"[{np.quantile(ratio, 0.1):.2f}-{np.quantile(ratio, 0.9):.2f}]")
                print(f"threads {threads} batch {batch:3d} {label:4s} us/row, median, speed-up [10-90%]: "
                      + "; ".join(line))
    for batch, seconds in compile_log:
        print(f"torch.compile: first call at batch {batch} took {seconds:.1f} s")
    if args.profile:
        torch.set_num_threads(1)
        profile(make_variants(["today", "frozen"], brain, dqn, args.version, 96, obs, []), obs, masks)


if __name__ == "__main__":
    main()
