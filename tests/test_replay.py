"""[online] replay_ratio / replay_window (mortal/learning/replay.py and the learner's epoch loop)."""

import pytest
import torch

from mortal.learning.replay import ReplayWindow

from conftest import fake_trainer, random_batch, write_baseline


def _marked(n, first):
    """A batch of ``n`` rows whose kyoku reward column is ``first, first + 1, ...``: each row is recognisable."""
    obs, actions, masks, steps, _, ranks = random_batch(n, seed=first)
    return obs, actions, masks, steps, torch.arange(first, first + n, dtype=torch.float64), ranks


def test_window_draws_rows_without_replacement_from_the_last_batches_only():
    w = ReplayWindow(2, generator=torch.Generator().manual_seed(0))
    for first in (0, 100, 200):  # window 2: the batch of rows 0..3 is dropped
        w.add(_marked(4, first))
    assert len(w) == 8
    drawn = w.sample(8)
    assert len(drawn) == 6 and drawn[0].shape == (8, *_marked(4, 0)[0].shape[1:])
    assert sorted(drawn[4].tolist()) == [100, 101, 102, 103, 200, 201, 202, 203]
    # each row keeps its columns together: the action of reward 201 is the one added with it
    row = drawn[4].tolist().index(201)
    assert drawn[1][row] == _marked(4, 200)[1][1]
    assert w.sample(3)[4].unique().numel() == 3


def test_window_errors():
    with pytest.raises(ValueError, match='replay_window must be >= 1'):
        ReplayWindow(0)
    w = ReplayWindow(3)
    w.add(_marked(4, 0))
    with pytest.raises(ValueError, match='holds 4 rows, fewer than a batch of 8'):
        w.sample(8)
    with pytest.raises(ValueError, match='a batch of 5 columns after batches of 6'):
        w.add(_marked(4, 0)[:5])


class _Ledger:
    """The claim ledger's calls the epoch loop makes, recorded."""

    def __init__(self):
        self.recorded, self.commits = [], []

    def begin_epoch(self, files):
        pass

    def note_dropped(self, ids):
        pass

    def record(self, ids):
        self.recorded.append(ids[:, 2].tolist())

    def commit_with(self, steps, save):
        save()
        self.commits.append(len(self.recorded))

    def end_epoch(self):
        return 0


class _Loader(list):
    class dataset:  # noqa: N801 - the attribute of a DataLoader
        files = []


@pytest.mark.parametrize('ratio', [1, 3])
def test_epoch_trains_each_fresh_batch_then_ratio_minus_one_replays(tiny_config, ratio):
    """Two fresh batches of 8 at ratio 3: 6 steps; steps 2-3 draw from the first batch's rows only, steps 5-6
    from both; the claim ids are recorded for the fresh batches only, and each save (every 2 steps) commits the
    ledger. At ratio 1 (Mortal) the epoch is the 2 fresh steps."""
    config, _ = tiny_config
    config['online']['replay_ratio'] = ratio
    config['online']['replay_window'] = 4
    config['control']['test_every'] = 1000
    write_baseline(config, config['baseline']['train']['state_file'], seed=3)
    write_baseline(config, config['control']['state_file'], seed=3)
    trainer = fake_trainer(config, drop_submits=True)
    assert (trainer.replay is None) == (ratio == 1)
    ledger = trainer.ledger = _Ledger()
    fresh = []
    for first in (0, 100):
        ids = torch.zeros((8, 4), dtype=torch.int64)
        ids[:, 2] = torch.arange(first, first + 8)
        fresh.append((*_marked(8, first), ids))
    trainer.file_list = lambda: ([], ['trainee'])
    trainer.epoch_drained = True
    trainer.data_loader = lambda *a, **k: _Loader(fresh)
    seen = []
    real = trainer.train_batch

    def spy(*batch):
        seen.append(sorted(batch[4].tolist()))
        real(*batch)

    trainer.train_batch = spy
    assert trainer.train_epoch() == 2  # fresh batches
    assert trainer.steps == 2 * ratio
    assert seen[0] == list(range(8)) and seen[ratio] == list(range(100, 108))
    assert ledger.recorded == [list(range(8)), list(range(100, 108))]
    if ratio == 3:
        assert seen[1] == seen[2] == list(range(8))  # a window of one batch: all its 8 rows
        for s in seen[4:]:  # 8 distinct rows of the 16 in the window
            assert len(set(s)) == 8 and set(s) <= set(range(8)) | set(range(100, 108))
        assert ledger.commits == [1, 2, 2]  # saves at steps 2 (a replay of batch 1), 4 (fresh 2), 6 (a replay)
    else:
        assert ledger.commits == [2]


def test_replay_ratio_is_online_only_and_validated(tiny_config):
    from mortal.config import ConfigError, load_config
    import toml
    config, path = tiny_config
    config['online']['replay_ratio'] = 0
    path.write_text(toml.dumps(config))
    with pytest.raises(ConfigError, match='replay_ratio'):
        load_config(path)
