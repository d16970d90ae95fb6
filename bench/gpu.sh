#!/usr/bin/env bash
# GPU benchmark (bench/gpu.py): offline set-up from a clean checkout, then a profile of one client, the self-play
# sweep over 1-12 client processes at versions 3 and 4, trainer, memory and the learner's idle fraction with
# Mortal's 192x40 network, all within 8 minutes on one GPU.
#
#   bash bench/gpu.sh [--quick|--cpu-smoke] [--sweep|--arena] [--set KEY=VALUE ...] [DIR]
#
# Results: results.json, results.md, setup.json and logs.tar.gz (logs/ outside $OUT) in $OUT if set, else DIR
# (default bench-gpu-results/). --quick: every part on the GPU with a small network, within 2 minutes, set-up
# included. --cpu-smoke: no set-up, a tiny network on the CPU, seconds per part (CI: tests/test_bench_gpu.py).
# --sweep: the profile and the self-play sweep alone, with the whole budget. --arena: instead of those parts, the
# arena with speculate_passes off and on. --set: one size of the mode (bench/gpu.py's sizes).
# Set-up never calls a package index: the wheels in .whl/ (bash scripts/device_wheels.sh, on a machine with one)
# go into a temporary site folder on PYTHONPATH; an installed CUDA torch is kept; the compiled core is built.
set -uo pipefail
cd "$(dirname "$0")/.."
export BENCH_T0="${BENCH_T0:-$(date +%s.%N)}"
PY="${PYTHON:-python3}"
SMOKE=0
MODE=()
PARTS=all
DIR=
SETS=()
NEXT_IS_SET=0
for arg in "$@"; do
    if [ "$NEXT_IS_SET" = 1 ]; then SETS+=(--set "$arg"); NEXT_IS_SET=0; continue; fi
    case "$arg" in
        --cpu-smoke) SMOKE=1 ;;
        --quick) MODE=(--quick) ;;
        --arena) PARTS=arena ;;
        --sweep) PARTS=sweep ;;
        --set) NEXT_IS_SET=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        -*) echo "bench/gpu.sh: unknown option $arg" >&2; exit 2 ;;
        '') echo "bench/gpu.sh: DIR is empty (it would put the results in /)" >&2; exit 2 ;;
        *) [ -z "$DIR" ] || { echo "bench/gpu.sh: one DIR only, got $DIR and $arg" >&2; exit 2; }
           DIR="$arg" ;;
    esac
done
[ "$NEXT_IS_SET" = 0 ] || { echo "bench/gpu.sh: --set needs KEY=VALUE" >&2; exit 2; }
RESULTS="${OUT:-${DIR:-bench-gpu-results}}"
rm -rf "$RESULTS/logs" "$RESULTS/logs.tar.gz" "$RESULTS/results.json" "$RESULTS/results.md" "$RESULTS/setup.json"
mkdir -p "$RESULTS/logs" || { echo "bench/gpu.sh: cannot write the results to $RESULTS" >&2; exit 2; }

driver() {  # bench/gpu.py; a driver that cannot even start still leaves a results.json saying why
    "$PY" bench/gpu.py run --out "$RESULTS" "${MODE[@]}" "${SETS[@]}" "$@" 2> >(tee -a "$RESULTS/logs/driver.log" >&2)
    local rc=$?
    if [ "$rc" != 0 ] && [ ! -s "$RESULTS/results.json" ]; then
        "$PY" -c 'import json, sys; json.dump({"errors": {"driver": "bench/gpu.py exited " + sys.argv[1] + "; see logs/driver.log"}}, open(sys.argv[2], "w"))' \
            "$rc" "$RESULTS/results.json" || echo "{\"errors\": {\"driver\": \"exit $rc\"}}" > "$RESULTS/results.json"
    fi
    return "$rc"
}

pack_logs() {  # under $OUT (a device call brings back 8 files at most): the logs as one archive
    if [ -n "${OUT:-}" ] && [ -d "$RESULTS/logs" ]; then
        sleep 0.5  # the tee of driver.log ends just after the driver
        tar -czf "$RESULTS/logs.tar.gz" -C "$RESULTS" logs && rm -rf "$RESULTS/logs"
    fi
}

if [ "$SMOKE" = 1 ]; then
    driver --cpu-smoke --parts "$PARTS"
    rc=$?
    pack_logs
    exit "$rc"
fi

# Set-up, offline and bounded: the wheels of .whl/ into a temporary site folder (no index is ever asked), then the
# compiled single-player core. A package the machine already has is not needed from .whl/.
SETUP_LOG="$RESULTS/logs/setup.log"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
t0=$(date +%s.%N)
rc=0
WHEELS=$(ls .whl/*.whl 2>/dev/null | wc -l)
if [ "$WHEELS" -gt 0 ]; then
    SITE="$(mktemp -d)/site"
    echo "--- installing $WHEELS wheels from .whl/ into $SITE (offline)" >> "$SETUP_LOG"
    timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .whl/*.whl >> "$SETUP_LOG" 2>&1 || rc=$?
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
MISSING=$("$PY" -c '
import importlib.util
names = ("torch", "numpy", "mjai", "riichienv", "pydantic", "toml", "filelock", "tqdm", "loguru", "requests",
         "tensorboard")
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))' 2>>"$SETUP_LOG" || echo python)
if [ -n "$MISSING" ]; then
    echo "--- missing: $MISSING (run bash scripts/device_wheels.sh on a machine with a package index and carry .whl)" \
        >> "$SETUP_LOG"
    [ "$rc" != 0 ] || rc=3
fi
echo "--- building the compiled single-player core" >> "$SETUP_LOG"
timeout 150 "$PY" setup.py -q build_ext --inplace >> "$SETUP_LOG" 2>&1 || { r=$?; [ "$rc" != 0 ] || rc=$r; }
t1=$(date +%s.%N)
CUDA_TORCH=$("$PY" -c 'import torch; print(torch.__version__ if torch.version.cuda else "")' 2>/dev/null || true)
TORCH_NOW=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
CORE=$("$PY" -c 'import mortal.features.sp._core' 2>/dev/null && echo true || echo false)
"$PY" - "$RESULTS/setup.json" "$rc" "$t0" "$t1" "$CUDA_TORCH" "$TORCH_NOW" "$CORE" "$SETUP_LOG" "$WHEELS" "$MISSING" <<'PY'
import json, sys
out, rc, t0, t1, cuda, now, core, log, wheels, missing = sys.argv[1:]
tail = open(log, errors='replace').read().splitlines()[-15:]
json.dump({'status': 'ok' if rc == '0' else f'failed (exit {rc}); see logs/setup.log', 'seconds': round(float(t1) - float(t0), 1),
           'wheels': int(wheels), 'missing': missing.split(), 'cuda_torch': cuda or None, 'torch': now,
           'sp_core': core == 'true', 'log_tail': tail},
          open(out, 'w'), indent=2)
PY
driver --setup-json "$RESULTS/setup.json" --parts "$PARTS"
rc=$?
pack_logs
exit "$rc"
