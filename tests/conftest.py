"""Shared pytest fixtures."""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Rust errors carry a slow full backtrace when this is set (engine_choice.md).
os.environ.pop("RUST_BACKTRACE", None)

import pytest  # noqa: E402

DATA_DIR = ROOT / "tests" / "data"
FIXTURE_LOGS = sorted(DATA_DIR.glob("*.jsonl"))


@pytest.fixture
def fixture_logs():
    """Paths of the real public mjai logs in tests/data (see its README)."""
    return list(FIXTURE_LOGS)
