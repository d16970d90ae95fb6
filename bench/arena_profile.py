"""Where the arena's time goes: a py-spy profile of ``OneVsThree.py_vs_py`` grouped into cost categories.

Reads py-spy's raw (collapsed) output, keeps the main thread's samples under ``py_vs_py`` and files each one under
the category of the deepest project frame (``mortal/...``) that matches a rule: by function name or by the text of
its source line, read from ``--tree`` (the checkout that was profiled). Unmatched samples are the lock-step
bookkeeping. Prints a Markdown table: category, µs per decision (share x ``--us``, the arena's µs per decision
measured without the profiler), share.

Usage: ``py-spy record -r 200 -f raw -o arena.raw -- python bench/arena_floor.py --versions 3 --rounds 1``, then
``python bench/arena_profile.py arena.raw [--tree .] [--us 100]``.
"""

import argparse
import collections
import linecache
import os
import re

RULES = [  # (category, function-name regex or None, source-text substring or None), first match wins
    ("table step (riichienv)", None, "self.env.step("),
    ("table reset + wall", None, "self.env.reset("),
    ("table reset + wall", "kyoku_wall", None),
    ("end-of-kyoku catch-up", None, "get_observations("),
    ("logs: riichienv mjai_log parse", None, "self.env.mjai_log"),
    ("logs: JSON lines", None, "json.dumps(e, separators"),
    ("logs: JSON lines", None, "_dumps(e)"),
    ("logs: JSON lines", "log_text|kyoku_lines|kyoku_results|render_line|_event_type|meta_json", None),
    ("logs: gzip + write (main thread)", "write_log_atomic", None),
    ("logs: gzip + write (main thread)", "_reap", None),  # LogWriter waiting for its thread
    ("PlayerState.update", "_feed", None),
    ("encode_obs", None, "state.encode_obs("),
    ("encode_obs", None, "np.asarray(obs, dtype=np.float32)"),
    ("engine (FirstLegal react_batch)", None, "self.engine.react_batch("),
    ("engine (FirstLegal react_batch)", None, "_array_call(self.engine)("),
    ("quick eval", "_quick_eval_index|_quick_eval_batch|_quick_eval_cans", None),
    ("meta", "_meta_core|_mask_bits|batch_meta_parts", None),
    ("reaction (index -> mjai dict)", "^_reaction$|reaction_from_index|_dahai|_chi|_pon|_kan", None),
    ("action to the table", None, "select_action_from_mjai("),
]


def categorize(raw_lines, tree: str) -> tuple[collections.Counter, int]:
    """Samples per category (``RULES``) of py-spy raw lines ``"frame;frame;... count"``; returns (counts, total)."""
    cats, total = collections.Counter(), 0
    for line in raw_lines:
        stack, _, cnt = line.rstrip().rpartition(" ")
        if "py_vs_py" not in stack or "Thread._bootstrap" in stack:
            continue
        total += int(cnt)
        hit = None
        for f in reversed(stack.split(";")):
            m = re.match(r"(.*) \((.*):(\d+)\)", f)
            if not m or "mortal/" not in m.group(2):
                continue
            fn, path, ln = m.group(1), m.group(2), int(m.group(3))
            src = linecache.getline(os.path.join(tree, path[path.index("mortal/"):]), ln)
            for cat, fre, txt in RULES:
                if (fre and re.search(fre, fn.split(".")[-1])) or (txt and txt in src):
                    hit = cat
                    break
            if hit:
                break
        cats[hit or "lock-step bookkeeping (the rest)"] += int(cnt)
    return cats, total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", help="py-spy record -f raw output")
    p.add_argument("--tree", default=".", help="the checkout that was profiled (its source lines are read)")
    p.add_argument("--us", type=float, default=100.0, help="the arena's µs per decision, to scale the shares")
    args = p.parse_args(argv)
    with open(args.raw) as f:
        cats, total = categorize(f, args.tree)
    if not total:
        raise SystemExit(f"{args.raw}: no samples under py_vs_py")
    print(f"{total} samples under py_vs_py; µs scaled to {args.us:.1f} µs/decision")
    print("| where | µs/decision | share |\n|---|---:|---:|")
    for c, n in cats.most_common():
        print(f"| {c} | {n / total * args.us:.1f} | {n / total:.1%} |")
    return cats, total


if __name__ == "__main__":
    main()
