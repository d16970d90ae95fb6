"""Tests of mortal.features.obs: shapes, version checks and encoding of real logs via mjai PlayerState."""

import json

import numpy as np
import pytest
from mjai.mlibriichi import consts
from mjai.mlibriichi.state import PlayerState

from mortal.features.obs import (SUPPORTED_VERSIONS, UnsupportedVersionError, check_version, encode, new_v4_encoder,
                                 obs_shape, oracle_obs_shape)

from conftest import DATA_DIR

LOG = DATA_DIR / "meta_annotated_hanchan.jsonl"


RUST_VERSIONS = (1, 2, 3)  # encoded by mjai.mlibriichi; 4 by mortal.features.obs_v4


def test_obs_shape_values():
    # Mortal consts.rs; v4's 1012 is not available from mlibriichi (its obs_shape(4) panics).
    assert [obs_shape(v) for v in (1, 2, 3, 4)] == [(938, 34), (942, 34), (934, 34), (1012, 34)]
    assert [oracle_obs_shape(v) for v in (1, 2, 3, 4)] == [(211, 34), (217, 34), (217, 34), (217, 34)]
    assert SUPPORTED_VERSIONS == (1, 2, 3, 4)
    for v in RUST_VERSIONS:
        assert obs_shape(v) == tuple(consts.obs_shape(v))
        assert oracle_obs_shape(v) == tuple(consts.oracle_obs_shape(v))


@pytest.mark.parametrize("bad", [0, 5, -1, "3", "4", 3.0, 4.0, True, None])
def test_unknown_versions_rejected(bad):
    with pytest.raises(UnsupportedVersionError):
        obs_shape(bad)
    with pytest.raises(UnsupportedVersionError):
        check_version(bad)


def test_check_version_accepts_1_to_4():
    assert [check_version(v) for v in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert type(check_version(np.int64(4))) is int
    with pytest.raises(UnsupportedVersionError) as info:
        check_version(5)
    assert isinstance(info.value, ValueError) and "1-4" in str(info.value)


def test_new_v4_encoder_only_for_version_4():
    from mortal.features.obs_v4 import V4Encoder
    enc = new_v4_encoder(4, 2)
    assert isinstance(enc, V4Encoder) and enc.player_id == 2
    assert [new_v4_encoder(v, 2) for v in (1, 2, 3)] == [None, None, None]
    with pytest.raises(UnsupportedVersionError):
        new_v4_encoder(True, 0)


class _NoRust:
    """Stands in for a PlayerState; calling into it would be the bug under test."""

    player_id = 0

    def encode_obs(self, version, at_kan_select):
        raise AssertionError("encode_obs must not be called")


def test_v4_without_encoder_is_a_clear_error_before_rust():
    with pytest.raises(ValueError) as info:
        encode(_NoRust(), 4)
    assert "V4Encoder" in str(info.value) and not isinstance(info.value, UnsupportedVersionError)


def test_v4_goes_through_the_seat_encoder():
    from mortal.features.obs_v4 import V4Encoder
    # E1 seat 0's first decision (a discard); the encoder saw the same events as the state.
    state, enc = PlayerState(0), V4Encoder(0)
    with open(LOG) as f:
        for line in f:
            cans = state.update(line)
            enc.update(line)
            if cans.can_act:
                break
    obs, mask = encode(state, 4, v4=enc)
    ref_obs, ref_mask = enc.encode(state, False)
    assert obs.shape == (1012, 34) and obs.dtype == np.float32 and mask.dtype == np.bool_
    np.testing.assert_array_equal(obs, ref_obs)
    np.testing.assert_array_equal(mask, encode(state, 3)[1])  # v4's mask is v3's
    kan, _ = encode(state, 4, at_kan_select=True, v4=enc)
    np.testing.assert_array_equal(kan, enc.encode(state, True)[0])
    with pytest.raises(ValueError, match="seat"):
        encode(state, 4, v4=V4Encoder(1))


def _decision_states(seat, limit=None):
    """Yield (event_index, state, cans) at each decision point of `seat` in LOG."""
    state = PlayerState(seat)
    with open(LOG) as f:
        for i, line in enumerate(f):
            if json.loads(line)["type"] == "end_game":
                break
            cans = state.update(line)
            if cans.can_act:
                yield i, state, cans
                limit = None if limit is None else limit - 1
                if limit == 0:
                    return


def test_real_log_encodes_for_v1_to_v3():
    n = 0
    for seat in range(4):
        for _, state, cans in _decision_states(seat):
            for v in RUST_VERSIONS:
                obs, mask = encode(state, v)
                assert obs.shape == obs_shape(v) and obs.dtype == np.float32
                assert mask.shape == (46,) and mask.dtype == np.bool_
                assert mask.any()
                # the mask agrees with the candidate flags reported by update()
                assert mask[45] == cans.can_pass
                assert mask[37] == cans.can_riichi
                assert mask[41] == cans.can_pon
                assert mask[43] == cans.can_agari
                assert mask[:37].any() == cans.can_discard
            n += 1
    assert n > 500  # 150-160 decisions per seat in this log


def test_first_decision_values_by_hand():
    # E1 seat 0 (oya): tehai C 6m 9p 1s 7m 4p 5p S 8p 7s 6p 9m 5sr, tsumo 8p.
    index, state, cans = next(_decision_states(0))
    assert index == 2 and cans.can_discard
    tile = {"6m": 5, "7m": 6, "9m": 8, "4p": 12, "5p": 13, "6p": 14, "8p": 16, "9p": 17, "1s": 18, "5s": 22,
            "7s": 24, "S": 28, "C": 33}
    counts = np.zeros(34)
    for name in ("6m", "7m", "9m", "4p", "5p", "6p", "8p", "8p", "9p", "1s", "5s", "7s", "S", "C"):
        counts[tile[name]] += 1
    for v in RUST_VERSIONS:
        obs, mask = encode(state, v)
        for row in range(4):  # thermometer of tile counts
            np.testing.assert_array_equal(obs[row], (counts > row).astype(np.float32))
        # red fives held: 5mr, 5pr, 5sr rows -> only 5sr
        assert obs[4].sum() == 0 and obs[5].sum() == 0 and np.all(obs[6] == 1)
        # every tile in hand may be discarded; 5sr is discard label 36 (red 5s), not 22
        expected = np.zeros(46, dtype=bool)
        expected[[i for i in range(34) if counts[i] and i != 22]] = True
        expected[36] = True
        np.testing.assert_array_equal(mask, expected)


def test_kan_select_flag_changes_encoding():
    _, state, _ = next(_decision_states(0))
    plain, _ = encode(state, 3)
    kan, _ = encode(state, 3, at_kan_select=True)
    assert kan.shape == plain.shape and not np.array_equal(kan, plain)
