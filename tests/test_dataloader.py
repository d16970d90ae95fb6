"""FileDatasetsIter: sample tuples, targets, passes, sharding and worker start method."""

import gzip

import numpy as np
import pytest
import torch

from mortal.data.dataloader import FileDatasetsIter, _game_columns, make_dataloader
from mortal.data.gameplay import GameplayLoader
from mortal.model.networks import GRP
from mortal.data.reward import RewardCalculator

from conftest import DATA_DIR

RIICHIENV = DATA_DIR / "riichienv_selfplay_hanchan.jsonl"
META = DATA_DIR / "meta_annotated_hanchan.jsonl"
PTS = [6.0, 4.0, 2.0, 0.0]
N_RIICHIENV = [212, 215, 216, 215]  # samples per seat (test_gameplay checks the labels)
N_META = [160, 159, 151, 147]


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    d = tmp_path_factory.mktemp("logs")
    out = []
    for i, src in enumerate([RIICHIENV, META]):
        p = d / f"{i}.json.gz"
        p.write_bytes(gzip.compress(src.read_bytes()))
        out.append(p)
    bad = d / "bad.json.gz"
    bad.write_bytes(gzip.compress(b""))
    return out, bad


@pytest.fixture(scope="module")
def grp():
    torch.manual_seed(0)
    return GRP()


def _ds(files, grp, **kw):
    return FileDatasetsIter(3, [str(f) for f in files], PTS, grp, **kw)


def test_samples_tuple_and_counts(logs, grp):
    files, bad = logs
    ds = _ds(files + [bad], grp, file_batch_size=2)
    samples = list(ds)
    assert len(samples) == sum(N_RIICHIENV) + sum(N_META)
    assert ds.skipped == 1
    obs, action, mask, steps, reward, rank, cf_action, cf_delta = samples[0]
    assert cf_action == -1 and cf_delta == 0  # offline logs carry no counterfactual branch
    assert isinstance(cf_action, np.int64) and isinstance(cf_delta, np.float32)
    assert obs.shape == (934, 34) and obs.dtype == np.float32
    assert mask.shape == (46,) and mask.dtype == np.bool_
    assert isinstance(action, np.int64) and isinstance(steps, np.int64)
    assert isinstance(reward, np.float64) and isinstance(rank, np.int64)
    assert all(s[2][s[1]] for s in samples)
    batch = next(iter(make_dataloader(_ds(files, grp), batch_size=8, num_workers=0)))
    assert [t.dtype for t in batch] == [torch.float32, torch.int64, torch.bool, torch.int64, torch.float64,
                                        torch.int64, torch.int64, torch.float32]
    assert batch[0].shape == (8, 934, 34)


def test_steps_to_done_rewards_and_ranks(grp):
    ds = _ds([], grp)
    ds.reward_calc = RewardCalculator(grp, PTS)
    game = GameplayLoader(3, player_names=["0"]).load_log(RIICHIENV.read_text())[0]
    actions, dones, at_kyoku = game.actions.copy(), game.dones.copy(), game.at_kyoku.copy()
    gamma_steps = game.apply_gamma.copy()
    rewards = ds.reward_calc.calc_delta_pt(0, game.grp.feature, game.grp.rank_by_player)
    packed, acts, masks, steps, kyoku_rewards, ranks, cf_actions, cf_deltas = _game_columns(game, ds.reward_calc)
    assert (cf_actions == -1).all() and (cf_deltas == 0).all()
    assert packed.shape == (len(actions), 13900) and packed.dtype == np.uint8
    assert (steps[dones] == 0).all()
    # recurrence by hand on the first kyoku: count the discounted steps after each sample
    end = int(np.flatnonzero(dones)[0])
    for i in range(end + 1):
        assert steps[i] == gamma_steps[i:end].sum()
    np.testing.assert_array_equal(kyoku_rewards, rewards[at_kyoku])
    np.testing.assert_array_equal(acts, actions)
    # seat 0: E2 starts 21000/22000/23000/34000 -> 4th; final 2400 -> 4th
    assert (ranks[at_kyoku == 0] == 3).all() and (ranks[at_kyoku == 11] == 3).all()


def test_reserve_epochs_and_augmentation(logs, grp, monkeypatch):
    files, _ = logs
    total = sum(N_RIICHIENV) + sum(N_META)
    assert len(list(_ds(files, grp, file_batch_size=1, reserve_ratio=0.5))) == total
    order = []
    orig = FileDatasetsIter.load_files

    def spy(self, augmented):
        order.append(augmented)
        return orig(self, augmented)

    monkeypatch.setattr(FileDatasetsIter, "load_files", spy)
    out = list(_ds(files[:1], grp, player_names=["0"], num_epochs=2, enable_augmentation=True,
                   augmented_first=True))
    assert order == [True, False, True, False]
    assert len(out) == 4 * N_RIICHIENV[0]


def test_shard_slices():
    ds = FileDatasetsIter(3, list("abcdefg"), PTS, None)
    ds.shard(1, 3)
    assert ds.file_list == ["d", "e", "f"]
    ds.shard(0, 3)  # idempotent
    assert ds.file_list == ["d", "e", "f"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_workers_read_each_file_once_after_native_threads(tmp_path, grp):
    # Run threaded native code in the parent first (the situation where fork can hang).
    torch.randn(256, 256) @ torch.randn(256, 256)
    files = []
    for i in range(3):
        p = tmp_path / f"{i}.json.gz"
        p.write_bytes(gzip.compress(META.read_bytes()))
        files.append(p)
    dl = make_dataloader(_ds(files, grp, player_names=["1"]), batch_size=64, num_workers=2)
    assert dl.multiprocessing_context.get_start_method() in ("forkserver", "spawn")
    n = sum(len(b[1]) for b in dl)
    assert n == 3 * N_META[1]


def _rows(batches):
    """Each sample of ``batches`` as the bytes of all its columns, sorted (the order depends on the worker's seed)."""
    cols = [torch.cat(c).numpy() for c in zip(*batches)]
    return sorted(b"".join(c[i].tobytes() for c in cols) for i in range(len(cols[0])))


@pytest.mark.slow
def test_a_worker_hands_each_batch_over_as_one_storage(logs, grp):
    # One shared-memory segment a batch instead of one a column (each is a file descriptor handshake)
    files, _ = logs
    batches = list(make_dataloader(_ds(files, grp, batch_size=64), batch_size=64, num_workers=1))
    assert [len(b[1]) for b in batches[:-1]] == [64] * (len(batches) - 1)
    for batch in batches:
        assert len({t.untyped_storage().data_ptr() for t in batch}) == 1
        assert [t.dtype for t in batch] == [torch.uint8, torch.int64, torch.bool, torch.int64, torch.float64,
                                            torch.int64, torch.int64, torch.float32]
        assert all(t.is_contiguous() and t.storage_offset() * t.element_size() % 8 == 0 for t in batch)
    in_process = list(make_dataloader(_ds(files, grp, batch_size=64), batch_size=64, num_workers=0))
    assert sum(len(b[1]) for b in batches) == sum(N_RIICHIENV) + sum(N_META)
    assert _rows(batches) == _rows(in_process)


_WORKER_LOG_SCRIPT = """
import gzip, logging, sys
from mortal.data.dataloader import make_dataloader
from mortal.train_grp import GrpFileDatasetsIter, collate
logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
bad, good = sys.argv[1], sys.argv[2]
data = GrpFileDatasetsIter([bad, good], file_batch_size=2)
batches = list(make_dataloader(data, batch_size=1, num_workers=1, collate_fn=collate))
print(len(batches))
"""


@pytest.mark.slow
def test_worker_warnings_carry_the_log_format(tmp_path):
    # A forkserver worker does not inherit the parent's basicConfig; its 'skipped log' warning
    # used to print as a bare message through logging's last-resort handler.
    import re
    import subprocess
    import sys

    from conftest import ROOT

    bad, good = tmp_path / "bad.json.gz", tmp_path / "good.json.gz"
    bad.write_bytes(gzip.compress(b"<mjloggm/>"))
    good.write_bytes(gzip.compress((DATA_DIR / "riichienv_selfplay_hanchan.jsonl").read_bytes()))
    proc = subprocess.run([sys.executable, "-c", _WORKER_LOG_SCRIPT, str(bad), str(good)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["12"]  # 12 kyoku in the good log, one sample each
    lines = [x for x in proc.stderr.splitlines() if "skipped log" in x]
    assert len(lines) == 1, proc.stderr
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING mortal\.grp: skipped log " + re.escape(str(bad)),
                    lines[0]), lines[0]


def test_points_reward_needs_no_grp():
    """[env] reward = 'points': the loader's kyoku reward is the seat's scaled score change, without a GRP."""
    ds = FileDatasetsIter(3, [], PTS, None, reward="points")
    list(ds)  # builds the reward calculator
    game = GameplayLoader(3, player_names=["0"]).load_log(RIICHIENV.read_text())[0]
    at_kyoku = game.at_kyoku.copy()
    kyoku_rewards = _game_columns(game, ds.reward_calc)[4]
    # seat 0: E1 25000 -> 21000 = -4000 points x 6 / 30000 = -0.8 pt
    np.testing.assert_allclose(kyoku_rewards[at_kyoku == 0], -0.8)
    expected = RewardCalculator(None, PTS, reward="points").calc_points_reward(0, game.grp.feature,
                                                                               game.grp.final_scores)
    np.testing.assert_array_equal(kyoku_rewards, expected[at_kyoku])
