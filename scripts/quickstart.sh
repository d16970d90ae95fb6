#!/usr/bin/env bash
# The main job: install what is needed (scripts/setup.sh), then run the whole pipeline at a small embedded
# size: rule-based games -> GRP -> offline Mortal -> server + trainer + client until a test play and the training
# after it (see mortal/tools/quickstart.py). Arguments go to the quickstart (e.g. --short, --work-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
start=$(date +%s)
bash scripts/setup.sh
"$PY" -m mortal.tools.quickstart "$@"
echo "quickstart.sh: $(( $(date +%s) - start )) s in all, setup included"
