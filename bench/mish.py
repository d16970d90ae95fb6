"""Mish on the CPU, interleaved (A B C A B C ...): ``F.mish`` against ``networks``' torch code (``_stem = None``)
against the compiled kernels (``_stem.mish_forward`` / ``mish_backward``).

Per call on each ``--shapes`` float32 tensor (x ~ N(0, 9)): forward + backward through ``F.mish`` and ``_MishFn``,
and the forward alone without grad (``networks.mish``, as the frozen inference copy calls it). With ``--engine``,
also the frozen engine's ``react_batch`` on real observations (the quickstart's 32x2 v3 model) at 12 and 96 rows,
``networks.mish`` by torch and by the kernel. Prints medians (process CPU time) and the kernel's ratios.

Usage: python bench/mish.py [--rounds 30] [--threads 1] [--shapes 128x32x34,128x1024] [--engine]
"""

if __package__ in (None, ''):  # run as a script: python bench/mish.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import time

import numpy as np
import torch
from torch.nn import functional as F

from mortal.model import networks


def _timed(fn, calls):
    t = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t) / calls * 1e6


def _report(label, times, unit):
    base = np.array(times[next(iter(times))])
    cells = [f"{k} {np.median(v):.1f} {unit} (x{np.median(np.array(v) / base):.2f} "
             f"[{np.min(np.array(v) / base):.2f}-{np.max(np.array(v) / base):.2f}])" for k, v in times.items()]
    print(f"{label}: " + ", ".join(cells))


def per_call(shape, rounds, stem):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 3).requires_grad_()
    g = torch.randn(shape)

    def fwd_bwd(fn):
        fn(x).backward(g)

    def no_grad(fn):
        with torch.no_grad():
            fn(x)

    for mode, run, paths in (
            ("forward+backward", fwd_bwd, (("F.mish", F.mish, None), ("torch", networks._MishFn.apply, None),
                                           ("kernel", networks._MishFn.apply, stem))),
            ("forward, no grad", no_grad, (("F.mish", F.mish, None), ("torch", networks.mish, None),
                                           ("kernel", networks.mish, stem)))):
        times = {name: [] for name, _, _ in paths}
        for _ in range(rounds):
            for name, fn, s in paths:
                networks._stem = s
                times[name].append(_timed(lambda: run(fn), 20))
                x.grad = None
        _report(f"{tuple(shape)} {mode}", times, "us")


def engine(rounds, stem):
    from bench.forward import real_observations, trained_like
    from mortal.play.engine import MortalEngine
    brain, dqn = trained_like(3, 32, 2)
    obs, masks = real_observations(3)
    eng = MortalEngine(brain, dqn, version=3)
    for batch in (12, 96):
        o, m = [obs[i % len(obs)] for i in range(batch)], [masks[i % len(masks)] for i in range(batch)]
        times = {"torch": [], "kernel": []}
        for _ in range(rounds):
            for name, s in (("torch", None), ("kernel", stem)):
                networks._stem = s  # only networks.mish reads it: the engine keeps its own sparse stem
                times[name].append(_timed(lambda: eng.react_batch(o, m), max(1, 1200 // batch)) / batch)
        _report(f"frozen react_batch, {batch} rows", times, "us/row")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--shapes", default="128x32x34,128x1024")
    p.add_argument("--engine", action="store_true", help="also the frozen engine's react_batch (real observations)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    stem = networks._stem
    if stem is None or not hasattr(stem, "mish_forward"):
        raise SystemExit("mortal.model._stem with mish_forward is not built: python setup.py build_ext --inplace")
    try:
        for shape in a.shapes.split(","):
            per_call([int(s) for s in shape.split("x")], a.rounds, stem)
        if a.engine:
            engine(max(1, a.rounds // 2), stem)
    finally:
        networks._stem = stem


if __name__ == "__main__":
    main()
