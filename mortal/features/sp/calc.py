"""The compiled single-player (SP) core ``mortal.features.sp._core`` (C++ in ``csrc/``; ``scripts/setup.sh`` builds
it), which version 4 needs: Mortal's ``algo/sp`` search with the settings v4 uses, nekobean's mahjong-cpp
single-player calculator ported. For a hand at ``shanten <= 3`` it searches every draw/discard sequence over the
remaining own draws (assuming nobody else wins and discards never return to the wall) and gives per candidate the
probability of being tenpai / having won and the expected tsumo value by turn; above 3 shanten only the required
tiles. ``_core.sp_rows`` turns a decision into its rows 889-1011 (``mortal.features.obs_v4``).

Settings fixed by Mortal's ``single_player_tables`` (``agent_helper.rs``): no tegawari, no shanten-down search,
rank by EV, results sorted best first. Arithmetic is float64 (Mortal uses f32), so values agree to ~1e-6
relative. The pure-Python twin is a test oracle (``tests/sp_oracle``).
"""

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
    """The compiled core is not built (``CORE_MISSING``); an ImportError, so that no handler of bad input takes it
    for a bad hand or log."""


def require_core():
    """The ``_core`` module; raises ``SPCoreMissing`` when it is not built."""
    if _core is None:
        raise SPCoreMissing(CORE_MISSING)
    return _core
