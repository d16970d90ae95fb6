"""The Brain's first convolution in training, dense (oneDNN) against sparse (``mortal.model._stem``), interleaved.

Real observations (every decision of the public hanchan in tests/data, encoded at ``--version``), ``--batch`` rows
a call, the quickstart's 32 output channels. Per round, in turn: the dense forward ``F.conv1d``, the sparse forward
(``networks._SparseStemConv``), the dense weight gradient (``aten::convolution_backward``, weight only, as autograd
calls it for an input that needs no gradient) and the sparse one (``_SparseStemConv.backward``: pad, transpose,
kernel, permute). Prints ms a call of process CPU time, median over ``--reps`` rounds, and each sparse/dense speed-up
(median of the per-round ratios, min, max).

Usage: python bench/stem_train.py [--version 3] [--batch 128] [--reps 7] [--threads 1]
"""

if __package__ in (None, ''):  # run as a script: python bench/stem_train.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import json
import statistics
import time

import numpy as np
import torch

from bench.forward import real_observations
from mortal.model import networks


def _cpu_ms(fn, calls):
    t = time.process_time()
    for _ in range(calls):
        fn()
    return 1e3 * (time.process_time() - t) / calls


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--channels", type=int, default=32)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--calls", type=int, default=5, help="calls timed per variant per round")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if networks._stem is None:
        raise SystemExit("mortal.model._stem is not built: python setup.py build_ext --inplace")
    obs = np.stack(real_observations(a.version)[0])
    x = torch.from_numpy(obs[:a.batch].copy())
    conv = networks.Brain(conv_channels=a.channels, num_blocks=1, version=a.version).encoder.net[0]
    w = conv.weight.detach()
    g = torch.randn(x.shape[0], a.channels, 34)
    ctx = type("Ctx", (), {"saved_tensors": (x,), "needs_input_grad": (False, True),
                           "save_for_backward": lambda self, *t: None})()
    variants = {
        "forward dense": lambda: torch.nn.functional.conv1d(x, w, padding=1),
        "forward sparse": lambda: networks._SparseStemConv.forward(ctx, x, w),
        "weight grad dense": lambda: torch.ops.aten.convolution_backward(
            g, x, w, None, [1], [1], [1], False, [0], 1, [False, True, False]),
        "weight grad sparse": lambda: networks._SparseStemConv.backward(ctx, g),
    }
    ms = {k: [] for k in variants}
    for fn in variants.values():  # warm-up (oneDNN's first call)
        fn()
    for _ in range(a.reps):
        for k, fn in variants.items():
            ms[k].append(_cpu_ms(fn, a.calls))
    out = {"rows": x.shape[0], "nonzero": round(float((x != 0).float().mean()), 4), "threads": a.threads,
           "ms_median": {k: round(statistics.median(v), 3) for k, v in ms.items()}}
    for part in ("forward", "weight grad"):
        r = sorted(d / s for d, s in zip(ms[part + " dense"], ms[part + " sparse"]))
        out[part + " speed-up"] = [round(statistics.median(r), 2), round(r[0], 2), round(r[-1], 2)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
