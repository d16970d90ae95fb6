#!/usr/bin/env bash
# Set up (idempotent), then run the test suite with the pytest arguments given, if any. Without a path among them
# pytest runs pyproject.toml's testpaths (tests/): `bash scripts/test.sh` is the whole suite (what CI runs, in one
# process), `bash scripts/test.sh -m 'not slow' -n 2` the fast subset in 2 pytest-xdist worker processes; a path,
# -k or -x narrow the run as usual.
# Exits with pytest's status; "no tests collected" (pytest status 5) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

bash scripts/setup.sh || exit $?
"$PY" -m pytest -q -p no:cacheprovider --timeout=600 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: no tests were collected" >&2
    exit 1
fi
exit "$rc"
