"""The version-4 loader's batched single-player searches (``obs_v4.DeferredSP`` in ``GameplayLoader``) give
bit for bit the samples of encoding each decision at once with ``V4Encoder.encode``."""

import json
import pathlib

import numpy as np
import pytest

from mortal.data import gameplay
from mortal.data.gameplay import GameplayLoader
from mortal.data.mjai_log import BadLogError
from mortal.features import obs_v4
from mortal.features.sp.calc import HAVE_CORE

needs_core = pytest.mark.skipif(not HAVE_CORE, reason="the compiled single-player core is not built")

FIELDS = ("packed_obs", "actions", "masks", "at_kyoku", "dones", "apply_gamma", "event_idx")


class _AtOnce:
    """Stand-in for ``DeferredSP``: every decision encoded at once by ``V4Encoder.encode`` (the per-sample path)."""

    def __init__(self, threads=None):
        pass

    def __len__(self):
        return 0

    def encode(self, enc, state, at_kan_select, tag=None):
        obs, mask = enc.encode(state, at_kan_select)
        return obs, mask, False

    def flush(self, background=False):
        return []


def _per_sample(monkeypatch, load):
    with monkeypatch.context() as m:
        m.setattr(gameplay, "DeferredSP", _AtOnce)
        return load()


@needs_core
@pytest.mark.slow
@pytest.mark.parametrize("batch,threads", [(128, 2), (7, 3), (1, 1)])
@pytest.mark.parametrize("augmented", [False, True])
def test_batched_loader_equals_per_sample_on_fixture_logs(fixture_logs, monkeypatch, batch, threads, augmented):
    monkeypatch.setattr(gameplay, "_V4_BATCH", batch)
    monkeypatch.setattr(obs_v4, "SP_THREADS", threads)
    n_total = n_pending = 0
    real_flush = obs_v4.DeferredSP.flush

    def counting_flush(self, background=False):
        nonlocal n_pending
        out = real_flush(self, background)
        n_pending += len(out)
        assert len(out) <= 2 * (batch + 1)  # the batch in flight and the rest (a kan select may join a full one)
        return out

    monkeypatch.setattr(obs_v4.DeferredSP, "flush", counting_flush)
    for path in fixture_logs:
        loader = GameplayLoader(4, augmented=augmented)
        new = loader.load_log_file(path)
        old = _per_sample(monkeypatch, lambda: GameplayLoader(4, augmented=augmented).load_log_file(path))
        assert [g.player_id for g in new] == [g.player_id for g in old] == [0, 1, 2, 3]
        for a, b in zip(new, old):
            for name in FIELDS:
                x, y = getattr(a, name), getattr(b, name)
                assert x.dtype == y.dtype and x.shape == y.shape, name
                np.testing.assert_array_equal(x, y, err_msg=f"{path.name} seat {a.player_id} {name}")
            n_total += len(a)
    # 1475: the two fixture logs' samples, as the v3 loader counts them; most went through a batch search
    assert n_total == 1475
    assert n_pending > 0.9 * n_total


def _kakan_log():
    """The first kyoku of the meta fixture with a kakan of 8p by seat 2 when seat 0 has seen all four 8p:
    seat 0's PlayerState takes it, the SP core refuses seat 0's next hand (5 copies of 8p seen)."""
    text = (pathlib.Path(__file__).parent / "data" / "meta_annotated_hanchan.jsonl").read_text()
    events = [json.loads(line) for line in text.splitlines()]
    end = [i for i, e in enumerate(events) if e["type"] == "end_kyoku"][0]
    events = events[:end + 1] + [{"type": "end_game"}]
    k = [i for i, e in enumerate(events) if e["type"] == "tsumo" and e["actor"] == 2][5]
    events.insert(k + 1, {"type": "kakan", "actor": 2, "pai": "8p", "consumed": ["8p"] * 3})
    return "\n".join(json.dumps(e) for e in events)


def _errors_of_both_paths(monkeypatch, raw, name):
    """The BadLogError messages of loading ``raw`` by the batched path and by the per-sample one."""
    with pytest.raises(BadLogError) as new:
        GameplayLoader(4).load_log(raw, name)
    with pytest.raises(BadLogError) as old:
        _per_sample(monkeypatch, lambda: GameplayLoader(4).load_log(raw, name))
    return str(new.value), str(old.value)


@needs_core
@pytest.mark.parametrize("batch", [128, 1])
def test_a_bad_hand_in_a_batch_is_reported_at_its_own_line(monkeypatch, batch):
    monkeypatch.setattr(gameplay, "_V4_BATCH", batch)
    new, old = _errors_of_both_paths(monkeypatch, _kakan_log(), "kakan")
    assert "tiles_seen: count 5 of tile 16 is above 4" in new
    assert new == old


@needs_core
@pytest.mark.parametrize("batch", [4, 128])
def test_the_first_unpackable_decision_is_reported_as_the_per_sample_path_does(monkeypatch, batch):
    # rows 3 and 5 of seat 0 refuse to pack: both paths must name row 3's line (the earlier decision)
    monkeypatch.setattr(gameplay, "_V4_BATCH", batch)
    real = gameplay.packer

    def failing_packer(version):
        pack = real(version)

        def run(obs, out, index):
            if index in (3, 5):
                raise gameplay.NotPackableError(version, index, 0, 0.5)  # "row": the sample index here
            pack(obs, out, index)
        return run

    monkeypatch.setattr(gameplay, "packer", failing_packer)
    raw = (pathlib.Path(__file__).parent / "data" / "meta_annotated_hanchan.jsonl").read_text()
    new, old = _errors_of_both_paths(monkeypatch, raw, "meta")
    assert "seat 0: feature version 4: row 3 column 0 holds 0.5" in new
    assert new == old
