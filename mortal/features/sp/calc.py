"""The compiled single-player core ``mortal.features.sp._core`` (``csrc/``) that version 4 needs: Mortal's
``algo/sp`` in float64 (~1e-6 relative of Mortal's f32); ``tests/sp_oracle`` is its Python twin."""

from __future__ import annotations

try:  # built by scripts/setup.sh (python setup.py build_ext --inplace)
    from mortal.features.sp import _core
except ImportError:  # pragma: no cover - exercised only on an unbuilt checkout
    _core = None

HAVE_CORE = _core is not None

#: The one message of a version-4 process on a checkout without the core (doctor, start-up, the encoder).
CORE_MISSING = ("observation version 4 needs the compiled single-player core (mortal.features.sp._core), which is "
                "not built here: run bash scripts/setup.sh (needs g++ and the Python headers)")


class SPCoreMissing(ImportError):
    """The compiled core is not built; an ImportError so no bad-input handler takes it for a bad hand."""


def require_core():
    """The ``_core`` module; raises ``SPCoreMissing`` when it is not built."""
    if _core is None:
        raise SPCoreMissing(CORE_MISSING)
    return _core
