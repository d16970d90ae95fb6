"""Observation shapes and encoding of a ``PlayerState`` into model input.

Encoding is delegated to ``mjai.mlibriichi`` (a fork of Mortal's Rust core),
which implements feature versions 1-3 only. Version 4 adds a 123-row
single-player (SP) block that the fork lacks, and asking the Rust side for it
raises a pyo3 ``PanicException`` (a ``BaseException``, so ``except Exception``
would not catch it). Every entry point here therefore validates the version in
Python first and never forwards an unsupported one to Rust.
"""

import numpy as np

__all__ = [
    "SUPPORTED_VERSIONS",
    "UnsupportedVersionError",
    "check_version",
    "encode",
    "obs_shape",
    "oracle_obs_shape",
]

# Channel counts per version, as Mortal's libriichi consts.rs. Kept in Python
# so that shapes of version 4 (for building/loading v4 models) are available
# without touching the Rust side, whose obs_shape(4) panics in mlibriichi.
_OBS_CHANNELS = {1: 938, 2: 942, 3: 934, 4: 1012}
_ORACLE_CHANNELS = {1: 211, 2: 217, 3: 217, 4: 217}

#: Versions ``encode`` can produce with ``mjai.mlibriichi``.
SUPPORTED_VERSIONS = (1, 2, 3)


class UnsupportedVersionError(ValueError):
    """The requested feature version cannot be encoded by this installation."""


def _known_version(version) -> int:
    # bool is an int subclass; True would silently mean version 1.
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise UnsupportedVersionError(
            f"feature version must be an integer 1-4, got {version!r} ({type(version).__name__})"
        )
    version = int(version)
    if version not in _OBS_CHANNELS:
        raise UnsupportedVersionError(f"unknown feature version {version}; Mortal defines versions 1-4")
    return version


def obs_shape(version: int) -> tuple[int, int]:
    """Shape ``(C, 34)`` of one observation for ``version`` (1-4).

    Values as Mortal's ``consts.rs``: v1 938, v2 942, v3 934, v4 1012 channels.
    Version 4 is answered (model construction needs it) even though ``encode``
    cannot produce it. Raises ``UnsupportedVersionError`` for any other value.
    """
    return (_OBS_CHANNELS[_known_version(version)], 34)


def oracle_obs_shape(version: int) -> tuple[int, int]:
    """Shape ``(C, 34)`` of the oracle (invisible) observation: v1 211, v2-v4 217 channels.

    Raises ``UnsupportedVersionError`` for a version outside 1-4.
    """
    return (_ORACLE_CHANNELS[_known_version(version)], 34)


def check_version(version) -> int:
    """Return ``version`` as ``int`` if ``encode`` supports it (1, 2 or 3).

    Call this at process start-up so that a bad ``[control] version`` fails
    before any work begins. Raises ``UnsupportedVersionError`` (a ``ValueError``)
    for version 4, explaining that its single-player feature block is missing
    from ``mjai.mlibriichi``, and for anything that is not a version 1-4 integer.
    """
    version = _known_version(version)
    if version == 4:
        raise UnsupportedVersionError(
            "feature version 4 is not supported: its 123-row single-player (SP) feature block "
            "is not available in mjai.mlibriichi (which implements versions 1-3 only), so v4 "
            "observations cannot be encoded. Use version = 3 in [control] (or 1 or 2)."
        )
    return version


def encode(state, version: int, at_kan_select: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Encode the current decision of ``state`` for the model.

    Args:
        state: a ``mjai.mlibriichi.state.PlayerState`` that was just updated with the
            event offering a decision.
        version: feature version, 1-3 (checked by ``check_version`` before Rust is called).
        at_kan_select: ``True`` for the second pass that chooses which kan to make;
            this sets the kan-select row and masks only kan tiles (Mortal's obs_repr.rs).

    Returns:
        ``(obs, mask)``: ``obs`` ``(C, 34)`` float32 with ``C = obs_shape(version)[0]``,
        ``mask`` ``(46,)`` bool of legal actions.

    Raises:
        UnsupportedVersionError: for version 4 or an invalid version.
    """
    version = check_version(version)
    obs, mask = state.encode_obs(version, bool(at_kan_select))
    obs = np.asarray(obs, dtype=np.float32)
    mask = np.asarray(mask, dtype=np.bool_)
    return obs, mask
