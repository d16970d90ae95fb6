#!/usr/bin/env bash
# Install the project, its test dependencies and the fleet's Ray, which its test needs (idempotent; quick when
# everything is already there).
# torch is pinned and installed first so pip takes the CPU wheel instead of pulling a multi-GB CUDA build; a CUDA
# build of torch that is already installed (a GPU machine) is kept whatever its version, never swapped for the CPU one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore

if ! "$PY" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0" and not torch.version.cuda)' 2>/dev/null; then
    echo "setup.sh: installing torch 2.13.0 (the CPU wheel; a few minutes on a fresh machine)" >&2
    "$PY" -m pip install -q torch==2.13.0
fi
# Editable install of THIS checkout present (not another clone) and test tools importable?
installed_here() {
    "$PY" -I - "$PWD" <<'PY' 2>/dev/null  # -I: not the egg-info in the checkout
import importlib.metadata as m, json, pathlib, sys
url = json.loads(m.distribution('mortal-online').read_text('direct_url.json'))['url']
here = pathlib.Path(sys.argv[1]).resolve().as_uri()
# a dependency missing from an older install: reinstall
import pytest, pytest_timeout, xdist, pydantic, filelock, ray  # noqa: F401
sys.exit(url.rstrip('/') != here.rstrip('/'))
PY
}
if ! installed_here; then
    echo "setup.sh: installing this checkout (editable) with its test tools and Ray (about half a minute)" >&2
    "$PY" -m pip install -q -e '.[test,fleet]'
fi
# The compiled single-player core behind observation v4 (mortal/features/sp/csrc, C++17, gcc).
# build_ext only recompiles when a source or header is newer than the built module.
if ! "$PY" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' 2>/dev/null; then
    "$PY" -m pip install -q 'setuptools>=77'
fi
"$PY" setup.py -q build_ext --inplace
if ! "$PY" -c 'import mortal.features.sp._core' 2>/dev/null; then
    echo "setup.sh: WARNING: the C++ single-player core (mortal/features/sp/csrc) did not build: install g++ and the" >&2
    echo "          Python headers and rerun. Versions 1-3 are unaffected; version 4 needs it (its processes refuse" >&2
    echo "          to start without it)." >&2
fi
