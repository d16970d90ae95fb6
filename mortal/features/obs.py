"""Observation shapes and encoding; the version is checked first (Rust panics on version 4 or an unknown one)."""

import numbers

import numpy as np

from mortal.config_schema import SUPPORTED_VERSIONS


class UnsupportedVersionError(ValueError):
    """The requested feature version is not one of Mortal's versions 1-4 (or not an integer)."""


def check_version(version) -> int:
    """``version`` as int if in ``SUPPORTED_VERSIONS`` (1-4), else ``UnsupportedVersionError`` (bool too)."""
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise UnsupportedVersionError(
            f"feature version must be an integer 1-4, got {version!r} ({type(version).__name__})")
    if int(version) not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(f"unknown feature version {version}; Mortal defines versions 1-4")
    return int(version)


# Channel counts per version (Mortal's consts.rs); mlibriichi's obs_shape(4) panics.
_OBS_CHANNELS = {1: 938, 2: 942, 3: 934, 4: 1012}
_ORACLE_CHANNELS = {1: 211, 2: 217, 3: 217, 4: 217}


def obs_shape(version: int) -> tuple[int, int]:
    """Shape ``(C, 34)`` of one observation: v1 938, v2 942, v3 934, v4 1012 channels (Mortal's ``consts.rs``)."""
    return (_OBS_CHANNELS[check_version(version)], 34)


def oracle_obs_shape(version: int) -> tuple[int, int]:
    """Shape ``(C, 34)`` of the oracle observation: v1 211, v2-v4 217 channels."""
    return (_ORACLE_CHANNELS[check_version(version)], 34)


def new_v4_encoder(version, seat: int):
    """A fresh ``V4Encoder`` for ``seat`` (0-3) if ``version`` is 4, else None."""
    if check_version(version) != 4:
        return None
    from mortal.features.obs_v4 import V4Encoder
    return V4Encoder(seat)


def encode(state, version: int, at_kan_select: bool = False, v4=None) -> tuple[np.ndarray, np.ndarray]:
    """``(obs (C, 34) float32, mask (46,) bool)`` of ``state``'s current decision; ``v4``: the seat's ``V4Encoder``
    (version 4 only). Raises ``UnsupportedVersionError``, or ValueError for a missing ``v4``."""
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
    return np.asarray(obs, dtype=np.float32), np.asarray(mask, dtype=np.bool_)
