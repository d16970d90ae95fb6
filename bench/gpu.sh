#!/usr/bin/env bash
# GPU benchmark (bench/gpu.py): set-up from a clean checkout, then self-play, trainer, memory and the learner's idle
# fraction with Mortal's 192x40 network, all within 8 minutes on one GPU.
#
#   bash bench/gpu.sh [--cpu-smoke] [--arena] [DIR]
#
# Results: results.json, results.md and logs/ in $OUT if set, else DIR (default bench-gpu-results/).
# --cpu-smoke: no set-up, a tiny network on the CPU, seconds per part (CI: tests/test_bench_gpu.py).
# --arena: instead of those parts, the arena with speculate_passes off and on (about 5 minutes at most with set-up).
# A CUDA build of torch that is already installed is kept: setup.sh never swaps it, and pip is held to it here.
set -uo pipefail
cd "$(dirname "$0")/.."
export BENCH_T0="${BENCH_T0:-$(date +%s.%N)}"
PY="${PYTHON:-python3}"
SMOKE=0
PARTS=all
DIR=
for arg in "$@"; do
    case "$arg" in
        --cpu-smoke) SMOKE=1 ;;
        --arena) PARTS=arena ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        -*) echo "bench/gpu.sh: unknown option $arg" >&2; exit 2 ;;
        '') echo "bench/gpu.sh: DIR is empty (it would put the results in /)" >&2; exit 2 ;;
        *) [ -z "$DIR" ] || { echo "bench/gpu.sh: one DIR only, got $DIR and $arg" >&2; exit 2; }
           DIR="$arg" ;;
    esac
done
RESULTS="${OUT:-${DIR:-bench-gpu-results}}"
rm -rf "$RESULTS/logs" "$RESULTS/results.json" "$RESULTS/results.md" "$RESULTS/setup.json"  # a rerun in DIR
mkdir -p "$RESULTS/logs" || { echo "bench/gpu.sh: cannot write the results to $RESULTS" >&2; exit 2; }

driver() {  # bench/gpu.py; a driver that cannot even start still leaves a results.json saying why
    "$PY" bench/gpu.py run --out "$RESULTS" "$@" 2> >(tee -a "$RESULTS/logs/driver.log" >&2)
    local rc=$?
    if [ "$rc" != 0 ] && [ ! -s "$RESULTS/results.json" ]; then
        "$PY" -c 'import json, sys; json.dump({"errors": {"driver": "bench/gpu.py exited " + sys.argv[1] + "; see logs/driver.log"}}, open(sys.argv[2], "w"))' \
            "$rc" "$RESULTS/results.json" || echo "{\"errors\": {\"driver\": \"exit $rc\"}}" > "$RESULTS/results.json"
    fi
    return "$rc"
}

if [ "$SMOKE" = 1 ]; then
    driver --cpu-smoke --parts "$PARTS"
    exit $?
fi

# Set-up, bounded: scripts/setup.sh (idempotent); with a CUDA torch present, pip may not replace it.
SETUP_LOG="$RESULTS/logs/setup.log"
CUDA_TORCH=$("$PY" -c 'import torch; print(torch.__version__ if torch.version.cuda else "")' 2>/dev/null || true)
if [ -n "$CUDA_TORCH" ]; then
    PIN="$(mktemp)"
    echo "torch==$CUDA_TORCH" > "$PIN"
    export PIP_CONSTRAINT="$PIN"
fi
t0=$(date +%s.%N)
timeout 150 bash scripts/setup.sh > "$SETUP_LOG" 2>&1
rc=$?
if [ "$rc" != 0 ]; then
    # setup.sh stops at its first failure (e.g. pip without an index): the compiled core alone still helps v4
    echo "--- setup.sh exited $rc: building the single-player core alone" >> "$SETUP_LOG"
    timeout 120 "$PY" setup.py -q build_ext --inplace >> "$SETUP_LOG" 2>&1 || true
fi
t1=$(date +%s.%N)
TORCH_NOW=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
CORE=$("$PY" -c 'import mortal.features.sp._core' 2>/dev/null && echo true || echo false)
"$PY" - "$RESULTS/setup.json" "$rc" "$t0" "$t1" "$CUDA_TORCH" "$TORCH_NOW" "$CORE" "$SETUP_LOG" <<'PY'
import json, sys
out, rc, t0, t1, kept, now, core, log = sys.argv[1:]
tail = open(log, errors='replace').read().splitlines()[-15:]
json.dump({'status': 'ok' if rc == '0' else f'failed (exit {rc}); see logs/setup.log', 'seconds': round(float(t1) - float(t0), 1),
           'cuda_torch_kept': kept or None, 'torch': now, 'sp_core': core == 'true', 'log_tail': tail},
          open(out, 'w'), indent=2)
PY
driver --setup-json "$RESULTS/setup.json" --parts "$PARTS"
