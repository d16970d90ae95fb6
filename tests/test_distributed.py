"""Offline training on several processes (mortal/learning/distributed.py, mortal/train.py under torchrun).

The fast tests check the pieces by hand (sharding, the lock-step end of an epoch, one process unchanged, online
refused); the slow ones start 2 gloo ranks with torchrun (tests/ddp_worker.py) on CPU.
"""

import os
import shutil
import subprocess
import sys

import pytest
import toml
import torch

from mortal import train as tr
from mortal.learning import distributed
from mortal.model.checkpoint import CHECKPOINT_KEYS
from mortal.model.networks import AuxNet, Brain, DQN

from conftest import (FIXTURE_LOGS, ROOT, TINY_VERSION, fake_trainer, free_port, load_tiny_config, random_batch,
                      tiny_config_dict, write_baseline, write_grp)


# -- the pieces, by hand -------------------------------------------------------------------------------------------

def test_shard_files_strided_by_hand():
    files = ['e', 'd', 'c', 'b', 'a']  # build_file_list's order: sorted descending
    assert distributed.shard_files(files, 0, 2) == ['e', 'c', 'a']
    assert distributed.shard_files(files, 1, 2) == ['d', 'b']
    assert [distributed.shard_files(files, r, 3) for r in range(3)] == [['e', 'b'], ['d', 'a'], ['c']]
    assert distributed.shard_files(['x', 'y'], 1, 2) == ['y']
    with pytest.raises(ValueError, match='2 log files cannot be shared by 3 training processes'):
        distributed.shard_files(['x', 'y'], 0, 3)


def test_lockstep_stops_every_rank_at_the_shortest():
    # This rank has 4 batches, another only 2: both train 2; the third step's vote is this rank's last.
    votes = []

    def others_have_two(mine):
        votes.append(mine)
        return mine and len(votes) <= 2
    assert list(distributed.lockstep(iter('abcd'), others_have_two)) == ['a', 'b']
    assert votes == [True, True, True]
    # This rank is the short one (2 batches, the others more): it votes False at step 3 and all stop.
    votes.clear()
    assert list(distributed.lockstep(iter('ab'), lambda mine: votes.append(mine) or mine)) == ['a', 'b']
    assert votes == [True, True, False]
    assert list(distributed.lockstep(iter(''), lambda mine: mine)) == []


def test_world_size_from_the_environment():
    assert distributed.world_size({}) == 1
    assert distributed.world_size({'WORLD_SIZE': '1'}) == 1
    assert distributed.world_size({'WORLD_SIZE': '4'}) == 4
    for bad in ('0', 'two', '-1'):
        with pytest.raises(ValueError, match='WORLD_SIZE'):
            distributed.world_size({'WORLD_SIZE': bad})
    with pytest.raises(ValueError, match='needs RANK and LOCAL_RANK'):
        distributed.setup('cpu', {'WORLD_SIZE': '2'})
    with pytest.raises(ValueError, match='RANK=2 is outside 0..1'):
        distributed.setup('cpu', {'WORLD_SIZE': '2', 'RANK': '2', 'LOCAL_RANK': '0'})


def test_one_process_is_left_as_it_was(tmp_path):
    for env in ({}, {'WORLD_SIZE': '1', 'RANK': '0', 'LOCAL_RANK': '0'}):
        assert distributed.setup('cpu', env) is distributed.SINGLE
    assert not torch.distributed.is_initialized()
    config, _ = load_tiny_config(tmp_path, online=False)
    trainer = fake_trainer(config)
    assert trainer.dist is distributed.SINGLE
    assert all(a is b for a, b in zip(trainer.nets, trainer.models))  # the bare models train, no wrapper
    assert trainer.dist.average({'x': 1.5}) == {'x': 1.5}


def test_online_under_torchrun_is_refused(tmp_path, monkeypatch, capsys):
    _, path = load_tiny_config(tmp_path, online=True)
    for key, value in {'WORLD_SIZE': '2', 'RANK': '0', 'LOCAL_RANK': '0'}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exc:
        tr.main(['-c', str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ['error: online training runs as one learner: start it without torchrun (more than one '
                   'process, WORLD_SIZE > 1, is for offline training only)']
    assert not torch.distributed.is_initialized()


def test_null_writer_writes_nothing():
    w = distributed.NullWriter()
    assert w.add_scalar('loss/x', 1.0, 3) is None and w.add_histogram('q', [1], 3) is None and w.close() is None
    with pytest.raises(AttributeError):
        w.log_dir


# -- two real ranks (gloo, CPU) ------------------------------------------------------------------------------------

def torchrun(mode, config_path, out, timeout=300):
    """Run tests/ddp_worker.py MODE on 2 ranks; returns the two ranks' records."""
    out.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ('WORLD_SIZE', 'RANK', 'LOCAL_RANK')}
    env['OMP_NUM_THREADS'] = '1'
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_addr', '127.0.0.1',
           '--master_port', str(free_port()), str(ROOT / 'tests' / 'ddp_worker.py'), mode, str(config_path),
           str(out)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [torch.load(out / f'rank{r}.pth', weights_only=False) for r in (0, 1)], proc.stderr


def assert_same(a: dict, b: dict, keys=None):
    keys = a.keys() if keys is None else keys
    assert a.keys() == b.keys()
    different = [k for k in keys if not torch.equal(a[k], b[k])]
    assert not different, different[:5]


def params_of(weights: dict, config) -> list:
    """The keys of ``weights`` (``ddp_worker.weights``) that are parameters, not buffers."""
    r = config['resnet']
    brain = Brain(version=TINY_VERSION, conv_channels=r['conv_channels'], num_blocks=r['num_blocks'])
    names = [f'mortal.{n}' for n, _ in brain.named_parameters()]
    names += [f'dqn.{n}' for n, _ in DQN(version=TINY_VERSION).named_parameters()]
    names += [f'aux.{n}' for n, _ in AuxNet((4,)).named_parameters()]
    assert set(names) < set(weights)
    return names


@pytest.mark.slow
def test_two_ranks_train_the_same_weights_and_only_rank_0_writes(tmp_path):
    (tmp_path / 'dataset').mkdir()
    for p in FIXTURE_LOGS:  # two hanchan: one file per rank
        shutil.copy(p, tmp_path / 'dataset' / (p.stem + '.json'))
    cfg = tiny_config_dict(tmp_path, online=False,
                           control={'batch_size': 32, 'save_every': 4, 'test_every': 8, 'opt_step_every': 2})
    (tmp_path / 'config.toml').write_text(toml.dumps(cfg))
    write_grp(cfg)
    write_baseline(cfg, cfg['baseline']['test']['state_file'])  # read at the start (the test play is faked)
    ranks, stderr = torchrun('train', tmp_path / 'config.toml', tmp_path / 'out')
    r0, r1 = ranks
    assert r0['code'] == r1['code'] == 0
    # shards: the sorted (descending) list, strided
    assert r0['files'] == [[str(tmp_path / 'dataset' / 'riichienv_selfplay_hanchan.json')]]
    assert r1['files'] == [[str(tmp_path / 'dataset' / 'meta_annotated_hanchan.json')]]
    # the same start (DDP copies rank 0's random init), the same steps, and the same weights after training
    assert_same(r0['initial'], r1['initial'])
    assert r0['steps'] == r1['steps'] >= 12  # ~600 samples per hanchan at 32 a batch: ~18 steps
    assert_same(r0['final'], r1['final'])  # parameters and BatchNorm buffers
    params = params_of(r0['final'], cfg)
    moved = [k for k in params if not torch.equal(r0['initial'][k], r0['final'][k])]
    assert len(moved) > len(params) // 2
    s0, w0 = r0['at_save']
    s1, w1 = r1['at_save']
    assert s0 == s1 == r0['steps'] // 4 * 4
    assert_same(w0, w1, params)  # at each save the parameters already agree
    # BatchNorm learns (offline, not frozen): rank 0's statistics, kept by every rank at the end
    bn = [k for k in r0['final'] if k.endswith('running_mean')]
    assert bn and not torch.equal(r0['initial'][bn[0]], r0['final'][bn[0]])
    # only rank 0 saves, test-plays and writes TensorBoard
    saves = list(range(4, r0['steps'] + 1, 4))
    assert r0['saves'] == sorted(saves + [s for s in saves if s % 8 == 0])  # a test play saves again (best)
    assert r1['saves'] == [] and r1['test_players'] == 0 and r1['writer'] == 'NullWriter'
    assert r0['test_players'] == 1 and r0['test_plays'] == r0['steps'] // 8 and r0['writer'] == 'SummaryWriter'
    events = os.listdir(tmp_path / 'tb')
    assert len(events) == 1 and f".{r0['pid']}." in events[0]
    # the checkpoint: Mortal's keys, the bare modules' state dicts, rank 0's weights at the last save
    ck = torch.load(tmp_path / 'mortal.pth', weights_only=True)
    assert set(CHECKPOINT_KEYS) <= set(ck) and ck['steps'] == s0
    for entry, prefix in (('mortal', 'mortal'), ('current_dqn', 'dqn'), ('aux_net', 'aux')):
        assert not any(k.startswith('module.') for k in ck[entry])
        assert_same(ck[entry], {k[len(prefix) + 1:]: v for k, v in w0.items() if k.startswith(prefix + '.')})
    assert (tmp_path / 'best.pth').exists()
    # progress lines come from rank 0 only: one 'total steps' line per save plus the epoch's first
    assert stderr.count('INFO mortal.train: total steps:') == 1 + len(saves)
    assert stderr.count('distributed training: 2 processes (gloo)') == 1


@pytest.mark.slow
def test_two_ranks_step_as_one_process_on_both_batches(tmp_path):
    # Frozen BatchNorm (no batch statistics), so 2 ranks x 8 rows and one process x 16 rows see the same loss
    # mean; accumulation over 2 batches (the first not synced), clipping at 1, CQL on.
    (tmp_path / 'ddp').mkdir()
    cfg = tiny_config_dict(tmp_path / 'ddp', online=False, freeze_bn={'mortal': True},
                           control={'batch_size': 8, 'opt_step_every': 2, 'save_every': 100, 'test_every': 100})
    (tmp_path / 'ddp' / 'config.toml').write_text(toml.dumps(cfg))
    write_baseline(cfg, cfg['control']['state_file'], seed=3)  # the same start for all
    ranks, _ = torchrun('step', tmp_path / 'ddp' / 'config.toml', tmp_path / 'out')
    assert ranks[0]['steps'] == ranks[1]['steps'] == 4
    assert_same(ranks[0]['final'], ranks[1]['final'])

    (tmp_path / 'one').mkdir()
    config, _ = load_tiny_config(tmp_path / 'one', online=False, freeze_bn={'mortal': True},
                                 control={'batch_size': 16, 'opt_step_every': 2, 'save_every': 100,
                                          'test_every': 100})
    shutil.copy(cfg['control']['state_file'], config['control']['state_file'])
    one = fake_trainer(config)
    for i in range(4):
        both = zip(random_batch(seed=10 * i), random_batch(seed=10 * i + 1))
        one.train_batch(*(torch.cat(pair) for pair in both))
    start = torch.load(cfg['control']['state_file'], weights_only=True)
    moved = 0
    for prefix, entry, model in zip(('mortal', 'dqn', 'aux'), ('mortal', 'current_dqn', 'aux_net'), one.models):
        for name, value in model.state_dict().items():
            # Adam's first steps move each weight by about lr = 1e-3 whatever the gradient's size, so a gradient
            # near 0 whose rounding differs moves its weight by up to ~1e-5 differently (1 of 44k entries here)
            torch.testing.assert_close(ranks[0]['final'][f'{prefix}.{name}'], value, rtol=0, atol=5e-5,
                                       msg=f'{prefix}.{name}')
            moved += not torch.equal(value, start[entry][name])
    assert moved > 10  # the two optimizer steps moved the weights
    # what this test tells apart: rank 0's batches alone (gradients not averaged) end elsewhere
    (tmp_path / 'alone').mkdir()
    config, _ = load_tiny_config(tmp_path / 'alone', online=False, freeze_bn={'mortal': True},
                                 control={'opt_step_every': 2, 'save_every': 100, 'test_every': 100})
    shutil.copy(cfg['control']['state_file'], config['control']['state_file'])
    alone = fake_trainer(config)
    for i in range(4):
        alone.train_batch(*random_batch(seed=10 * i))
    gap = (alone.dqn.a_head[0].weight - ranks[0]['final']['dqn.a_head.0.weight']).abs().max().item()
    assert gap > 1e-3
