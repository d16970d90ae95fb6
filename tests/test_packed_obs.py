"""Packed observations (mortal.features.packed_obs): exact round trip, the byte layout, refusals, batch mode."""

import gzip
import random

import numpy as np
import pytest
import torch

import mortal.features.packed_obs as po
from mortal.data.dataloader import FileDatasetsIter, make_dataloader
from mortal.data.gameplay import GameplayLoader
from mortal.model.networks import GRP

from conftest import DATA_DIR

LOGS = sorted(p for p in DATA_DIR.iterdir() if p.name.endswith((".jsonl", ".json.gz")))
PTS = [6.0, 4.0, 2.0, 0.0]


@pytest.fixture(params=[True, False], ids=["core", "numpy"])
def packer(request, monkeypatch):
    """Run a test with the compiled kernel and with the numpy fallback."""
    if request.param:
        if not po.HAVE_FAST_PACK:
            pytest.skip("compiled core not built")
    else:
        monkeypatch.setattr(po, "_pack_obs", None)
    return request.param


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_round_trip_of_every_fixture_decision_is_bit_exact(version, packer):
    seen = 0
    for path in LOGS:
        for game in GameplayLoader(version).load_log_file(path):
            packed = game.packed_obs
            obs = game.obs
            assert packed.shape == (len(game), po.row_bytes(version)) and packed.dtype == np.uint8
            np.testing.assert_array_equal(po.pack(obs, version), packed)
            np.testing.assert_array_equal(_bits(po.unpack(packed, version)), _bits(obs))
            seen += len(game)
    assert seen == 2018  # 8 seats of the 3 logs (tests/data/README.md: 150-219 decisions each)


@pytest.mark.slow
def test_gameplay_obs_is_the_encoder_output():
    # the stored rows unpack to exactly what PlayerState.encode_obs returned at each decision
    from mjai.mlibriichi.state import PlayerState
    path = DATA_DIR / "riichienv_selfplay_hanchan.jsonl"
    game = GameplayLoader(3).load_log_file(path)[0]  # seat 0
    lines = path.read_text().splitlines()
    state, ref = PlayerState(game.player_id), []
    for i, line in enumerate(lines):
        state.update(line)
        for _ in range(int(np.sum(game.event_idx == i))):
            ref.append(state.encode_obs(3, False)[0])  # kan-select rows differ in one row: compared below
    obs = game.obs
    plain = [i for i in range(len(game)) if i == 0 or game.event_idx[i] != game.event_idx[i - 1]]
    np.testing.assert_array_equal(_bits(obs[plain]), _bits(np.stack(ref)[plain]))


def test_layout_bytes_by_hand(packer):
    lay = po.layout(3)
    assert (lay.real_bytes, lay.bit_bytes, lay.row_bytes) == (73 * 136, 3970, 73 * 136 + 3972)
    obs = np.zeros((934, 34), np.float32)
    obs[0, 0] = 1.0       # element 0 -> bit 0 of the first bit byte
    obs[1, 2] = 1.0       # element 36 -> byte 4, bit 4
    obs[7, :] = 0.25      # the first real row (a score row)
    obs[880, 5] = 0.75    # the last real row of v3
    obs[933, 33] = 1.0    # the very last element, 31755 -> byte 3969, bit 3
    out = np.full((2, lay.row_bytes), 0xAB, np.uint8)
    po.pack_into(obs, out, 1, 3)
    assert (out[0] == 0xAB).all()  # only row 1 written
    row = out[1]
    real = row[:lay.real_bytes].view(np.float32).reshape(73, 34)
    assert (real[0] == 0.25).all() and real[-1, 5] == 0.75 and np.count_nonzero(real) == 35
    bits = row[lay.real_bytes:]
    assert bits[0] == 0b1 and bits[4] == 0b10000 and bits[3969] == 0b1000
    assert bits[3970:].tolist() == [0, 0]  # padding
    # the real rows' elements also have their nonzero bits: row 7 = elements 238..271
    assert bits[238 // 8] & (1 << (238 % 8))
    assert np.count_nonzero(np.unpackbits(bits, bitorder="little")) == 3 + 34 + 1
    np.testing.assert_array_equal(_bits(po.unpack(out[1:], 3)[0]), _bits(obs))


@pytest.mark.parametrize("row,col,value", [(0, 3, 0.5), (933, 33, 2.0), (100, 0, -0.0), (6, 17, 1e-30)])
def test_a_value_outside_the_real_rows_that_is_not_0_or_1_is_refused(packer, row, col, value):
    obs = np.zeros((934, 34), np.float32)
    obs[7, 0] = 0.5  # fine: a real row
    obs[row, col] = value
    out = np.zeros((1, po.row_bytes(3)), np.uint8)
    with pytest.raises(po.NotPackableError) as e:
        po.pack_into(obs, out, 0, 3)
    assert (e.value.row, e.value.col) == (row, col)
    assert f"row {row} column {col}" in str(e.value)


def test_bad_arguments_are_value_errors(packer):
    out = np.zeros((1, po.row_bytes(3)), np.uint8)
    with pytest.raises(ValueError):
        po.pack_into(np.zeros((942, 34), np.float32), out, 0, 3)  # a v2 array
    with pytest.raises(ValueError):
        po.pack_into(np.zeros((934, 34), np.float32), out, 1, 3)  # no row 1
    with pytest.raises(ValueError):
        po.unpack(out[:, :-4], 3)


def test_unpack_of_a_tensor_matches_numpy():
    game = GameplayLoader(3, player_names=["rule_b"]).load_log_file(LOGS[0])[0]
    packed = game.packed_obs[:16]
    t = po.unpack(torch.from_numpy(packed), 3)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == (16, 934, 34)
    np.testing.assert_array_equal(_bits(t.numpy()), _bits(po.unpack(packed, 3)))


@pytest.mark.slow
@pytest.mark.parametrize("reserve_ratio", [0.0, 0.5])
def test_batch_mode_makes_the_batches_of_the_sample_stream(tmp_path, reserve_ratio):
    # Same seeds: batch mode (packed, built by the dataset) against the per-sample stream batched by the
    # default collate, as the loader did before; with sample ids and a trained filter.
    files = []
    for i, src in enumerate(LOGS):
        p = tmp_path / f"{i}.json.gz"
        p.write_bytes(src.read_bytes() if src.name.endswith(".gz") else gzip.compress(src.read_bytes()))
        files.append(str(p))
    torch.manual_seed(0)
    grp = GRP()
    trained = {files[1]: {0: [0, 5, 7]}, files[2]: {1: None}}

    def run(**kw):
        random.seed(7)
        ds = FileDatasetsIter(3, files, PTS, grp, file_batch_size=2, reserve_ratio=reserve_ratio,
                              enable_augmentation=True, sample_ids=True, trained=trained, **kw)
        return list(make_dataloader(ds, batch_size=100, num_workers=0))

    old, new = run(), run(batch_size=100)
    assert [len(b[1]) for b in new] == [len(b[1]) for b in old]
    assert sum(len(b[1]) for b in new) == 2 * 2018 - 3 - 858  # two passes, less the trained ones (858: riichienv)
    assert len(new[-1][1]) < 100
    for a, b in zip(old, new):
        assert b[0].dtype == torch.uint8
        assert torch.equal(po.unpack(b[0], 3).view(torch.int32), a[0].view(torch.int32))
        for x, y in zip(a[1:], b[1:]):
            assert x.dtype == y.dtype and torch.equal(x, y)


def test_batch_on_device_joins_packed_online_and_offline_rows_bit_exact():
    """The learner's intake joins the online and offline-mix rows packed and unpacks once: the same floats, rows in
    the same order, as unpacking each; a float online batch still joins a packed offline one."""
    from mortal.learning.intake import batch_on_device
    game = GameplayLoader(3).load_log_file(LOGS[0])[0]
    packed = torch.from_numpy(game.packed_obs[:12])
    n = 12
    actions = torch.from_numpy(np.asarray(game.actions[:n], dtype=np.int64))
    masks = torch.from_numpy(np.asarray(game.masks[:n], dtype=bool))
    rest = (torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.int64))
    online = (packed[:8], actions[:8], masks[:8], *(t[:8] for t in rest), None, None)
    offline = (packed[8:], actions[8:], masks[8:], *(t[8:] for t in rest), None, None)
    want = po.unpack(game.packed_obs[:12], 3)
    for first in (online, (po.unpack(packed[:8], 3), *online[1:])):
        obs, acts, ms, *_ = batch_on_device(first, torch.device('cpu'), 3, iter([offline]))
        assert obs.shape == (12, 934, 34) and obs.dtype == torch.float32
        np.testing.assert_array_equal(_bits(obs.numpy()), _bits(want))
        assert torch.equal(acts, actions) and torch.equal(ms, masks)


@pytest.mark.parametrize("version", [1, 3])
def test_unpack_of_no_rows(version):
    """0 packed rows (numpy or torch) unpack to 0 observations of the version's (C, 34), as 1 row gives 1."""
    channels = po.layout(version).channels
    width = po.row_bytes(version)
    for rows in (np.zeros((0, width), np.uint8), torch.zeros((0, width), dtype=torch.uint8)):
        obs = po.unpack(rows, version)
        assert type(obs) is type(rows) and tuple(obs.shape) == (0, channels, 34) and str(obs.dtype).endswith("float32")


def test_batch_on_device_rows_of_another_version_name_the_width():
    """Packed offline-mix rows of another version than the online ones (version 2's 12,572 bytes against version 3's
    13,900): unpack's ValueError naming the expected width, not the join's size mismatch."""
    from mortal.learning.intake import batch_on_device
    n = 2
    rest = (torch.zeros(n, dtype=torch.int64), torch.ones(n, 46, dtype=torch.bool), torch.zeros(n, dtype=torch.int64),
            torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.int64), None, None)
    v3 = (torch.zeros((n, po.row_bytes(3)), dtype=torch.uint8), *rest)
    v2 = (torch.zeros((n, po.row_bytes(2)), dtype=torch.uint8), *rest)
    for online, offline in ((v3, v2), (v2, v3)):
        with pytest.raises(ValueError, match=r"expected \(B, 13900\) uint8 rows of version 3, got torch.uint8 "
                                             r"\(2, 12572\)"):
            batch_on_device(online, torch.device('cpu'), 3, iter([offline]))
