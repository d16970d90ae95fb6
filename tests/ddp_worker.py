"""One rank of the multi-process tests of tests/test_distributed.py, started by torchrun (not a test file).

``python -m torch.distributed.run --nproc_per_node 2 tests/ddp_worker.py MODE CONFIG OUT``:

* ``train``: ``mortal.train.main(['-c', CONFIG])``, the real entry point, with spies on the trainer that record,
  per rank, the files its loader got, its saves, test players, test plays and SummaryWriter, and the weights right after start-up,
  at each save and at the end; written to ``OUT/rank<R>.pth``.
* ``step``: a ``Trainer`` of CONFIG on this rank's group trains ``train_batch`` on ``conftest.random_batch(seed=10 * i
  + rank)`` for i in 0..3, then writes its weights to ``OUT/rank<R>.pth``.
"""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / 'tests')]

import torch  # noqa: E402

from mortal import train as tr  # noqa: E402
from mortal.config import load_config  # noqa: E402
from mortal.learning import distributed  # noqa: E402


def weights(trainer) -> dict:
    """Copies of the bare models' state dicts, keyed 'mortal.<name>', 'dqn.<name>', 'aux.<name>'."""
    out = {}
    for prefix, model in zip(('mortal', 'dqn', 'aux'), trainer.models):
        out.update({f'{prefix}.{k}': v.detach().clone() for k, v in model.state_dict().items()})
    return out


def run_train(config_path: str, out: pathlib.Path) -> None:
    from conftest import FakeTestPlayer
    import mortal.play.player as player
    rank = int(os.environ['RANK'])
    record = {'pid': os.getpid(), 'files': [], 'saves': [], 'test_players': 0, 'writer': None}
    fake = FakeTestPlayer([(0.0, 2.5)] * 100)

    def make_test_player(config):  # the games themselves are tested elsewhere
        record['test_players'] += 1
        return fake
    player.TestPlayer = make_test_player

    init, on_save, save, data_loader = tr.Trainer.__init__, tr.Trainer.on_save, tr.Trainer.save, tr.Trainer.data_loader

    def spy_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        record['writer'] = type(self.writer).__name__
        record['initial'] = weights(self)
        record['trainer'] = self

    def spy_on_save(self):
        on_save(self)
        record['at_save'] = (self.steps, weights(self))

    def spy_save(self):
        record['saves'].append(self.steps)
        save(self)

    def spy_loader(self, file_list, *args, **kwargs):
        record['files'].append(list(file_list))
        return data_loader(self, file_list, *args, **kwargs)

    tr.Trainer.__init__, tr.Trainer.on_save, tr.Trainer.save = spy_init, spy_on_save, spy_save
    tr.Trainer.data_loader = spy_loader
    code = 0
    try:
        tr.main(['-c', config_path])
    except SystemExit as exc:
        code = exc.code
    trainer = record.pop('trainer')
    record.update(code=code, steps=trainer.steps, final=weights(trainer), test_plays=len(fake.calls))
    torch.save(record, out / f'rank{rank}.pth')
    sys.exit(code)


def run_step(config_path: str, out: pathlib.Path) -> None:
    from conftest import FakeTestPlayer, fake_trainer, random_batch
    config = load_config(config_path, env={})
    dist = distributed.setup(config['control']['device'])
    try:
        trainer = fake_trainer(config, test_player=FakeTestPlayer([(0.0, 2.5)]), dist=dist)
        for i in range(4):
            trainer.train_batch(*random_batch(seed=10 * i + dist.rank))
        torch.save({'steps': trainer.steps, 'final': weights(trainer)}, out / f'rank{dist.rank}.pth')
    finally:
        dist.close()


if __name__ == '__main__':
    mode, config_path, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    {'train': run_train, 'step': run_step}[mode](config_path, out)
