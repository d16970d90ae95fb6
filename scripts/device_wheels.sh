#!/usr/bin/env bash
# Download, here, the wheels a GPU machine without a package index needs to run the project (bench/gpu.sh installs
# them offline from .whl/, which is ignored by git and never committed).
#
#   bash scripts/device_wheels.sh [PYTHON_VERSION]      # default 3.12 (the device's Python); x86-64 Linux wheels
#
# The device's Python already holds torch (CUDA), numpy, requests, tensorboard, msgpack, safetensors and matplotlib;
# the list below is what the project imports at run time beyond those (mjai needs loguru at import; its other
# requirement, mahjong, is never imported), plus setuptools for building the compiled core with this pyproject.toml
# (its license fields need setuptools >= 77). Versions are pinned to what this checkout is tested with.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi  # run with sh: pipefail and arrays need bash
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PYV="${1:-3.12}"
WHEELS=(
    mjai==0.2.1 loguru==0.7.3 riichienv==0.4.11
    pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.15.0
    toml==0.10.2 filelock==4.3.2 tqdm==4.70.1 setuptools==84.2.1
)
mkdir -p .whl
# one version of each: an older download of the same name would stop the offline install
for spec in "${WHEELS[@]}"; do
    name="${spec%%==*}"
    stem="$(echo "$name" | tr '-' '_')"
    find .whl -maxdepth 1 -iname "${stem}-*.whl" ! -iname "${stem}-${spec##*==}-*" -delete
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
ls -l .whl
du -ch .whl/*.whl | tail -1
