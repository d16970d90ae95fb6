"""Observation shapes and encoding of a ``PlayerState`` into model input.

Versions 1-3 are encoded by ``mjai.mlibriichi`` (a fork of Mortal's Rust
core). Version 4 (1012 rows: a re-packed v3 plus Mortal's 123-row
single-player (SP) block) is built by ``mortal.features.obs_v4.V4Encoder``, which needs
per-kyoku facts ``PlayerState`` does not expose, so each seat that encodes v4
keeps a ``V4Encoder`` fed with the same events as its ``PlayerState`` and
passes it to ``encode(..., v4=encoder)``.

Asking the Rust side for version 4 (or any unknown version) raises a pyo3
``PanicException`` (a ``BaseException``, so ``except Exception`` would not catch
it). Every entry point here therefore validates the version in Python first and
never forwards version 4 or an unknown one to Rust.
"""

import numbers

import numpy as np

from mortal.config_schema import SUPPORTED_VERSIONS

__all__ = [
    "SUPPORTED_VERSIONS",
    "UnsupportedVersionError",
    "check_version",
    "encode",
    "new_v4_encoder",
    "obs_shape",
    "oracle_obs_shape",
]

class UnsupportedVersionError(ValueError):
    """The requested feature version is not one of Mortal's versions 1-4 (or not an integer)."""


def check_version(version) -> int:
    """``version`` as ``int`` if it is one of ``SUPPORTED_VERSIONS`` (1-4): the one check of a feature/model version
    (``[control] version``, a checkpoint's, a model's), called at start-up so a bad one fails before any work.
    Raises ``UnsupportedVersionError`` (a ``ValueError``) for anything else (``bool``, ``str`` and ``float`` too)."""
    # bool is an int subclass; True would silently mean version 1. numpy integers are numbers.Integral.
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise UnsupportedVersionError(
            f"feature version must be an integer 1-4, got {version!r} ({type(version).__name__})")
    if int(version) not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(f"unknown feature version {version}; Mortal defines versions 1-4")
    return int(version)


# Channel counts per version, as Mortal's libriichi consts.rs. Kept in Python
# because mlibriichi's obs_shape(4) panics.
_OBS_CHANNELS = {1: 938, 2: 942, 3: 934, 4: 1012}
_ORACLE_CHANNELS = {1: 211, 2: 217, 3: 217, 4: 217}


def obs_shape(version: int) -> tuple[int, int]:
    """Shape ``(C, 34)`` of one observation for ``version`` (1-4).

    Values as Mortal's ``consts.rs``: v1 938, v2 942, v3 934, v4 1012 channels.
    Raises ``UnsupportedVersionError`` for any other value.
    """
    return (_OBS_CHANNELS[check_version(version)], 34)


def oracle_obs_shape(version: int) -> tuple[int, int]:
    """Shape ``(C, 34)`` of the oracle (invisible) observation: v1 211, v2-v4 217 channels.

    Raises ``UnsupportedVersionError`` for a version outside 1-4.
    """
    return (_ORACLE_CHANNELS[check_version(version)], 34)


def new_v4_encoder(version, seat: int):
    """A fresh ``mortal.features.obs_v4.V4Encoder`` for ``seat`` (0-3) if ``version`` is 4, else ``None``.

    Lets callers hold "the seat's encoder" without paying for v4 when they encode 1-3.
    Raises ``UnsupportedVersionError`` for an invalid version, ``ValueError`` for a bad seat.
    """
    if check_version(version) != 4:
        return None
    from mortal.features.obs_v4 import V4Encoder
    return V4Encoder(seat)


def encode(state, version: int, at_kan_select: bool = False, v4=None) -> tuple[np.ndarray, np.ndarray]:
    """Encode the current decision of ``state`` for the model.

    Args:
        state: a ``mjai.mlibriichi.state.PlayerState`` that was just updated with the
            event offering a decision.
        version: feature version 1-4 (checked by ``check_version`` before Rust is called).
        at_kan_select: ``True`` for the second pass that chooses which kan to make;
            this sets the kan-select row and masks only kan tiles (Mortal's obs_repr.rs).
        v4: version 4 only, required: the seat's ``mortal.features.obs_v4.V4Encoder``, fed every
            event ``state`` was fed, in the same order (see ``new_v4_encoder``). Ignored
            for versions 1-3.

    Returns:
        ``(obs, mask)``: ``obs`` ``(C, 34)`` float32 with ``C = obs_shape(version)[0]``
        (1012 for version 4), ``mask`` ``(46,)`` bool of legal actions (v4's equals v3's).

    Raises:
        UnsupportedVersionError: an invalid version.
        ValueError: version 4 without ``v4``, or a ``v4`` encoder of another seat.
    """
    version = check_version(version)
    if version == 4:
        if v4 is None:
            raise ValueError(
                "feature version 4 needs the seat's V4Encoder (encode(state, 4, ..., v4=encoder), "
                "the encoder fed every event the PlayerState got): its single-player block "
                "uses facts PlayerState does not expose")
        obs, mask = v4.encode(state, bool(at_kan_select))
    else:
        obs, mask = state.encode_obs(version, bool(at_kan_select))
    obs = np.asarray(obs, dtype=np.float32)
    mask = np.asarray(mask, dtype=np.bool_)
    return obs, mask
