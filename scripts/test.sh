#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite, or the pytest arguments given instead.
# Exits with pytest's status; "no tests collected" (pytest status 5) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

bash scripts/setup.sh || exit $?
[ "$#" -gt 0 ] || set -- tests   # arguments, if any, replace the test path (e.g. one file, -k, -x)
"$PY" -m pytest -q -p no:cacheprovider --timeout=600 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: no tests were collected" >&2
    exit 1
fi
exit "$rc"
