"""mortal/train.py step logic, checkpoints, TensorBoard tags and data plumbing, in-process on CPU with a tiny model."""

import copy
import math
import os
import subprocess
import sys
import time

import pytest
import torch

from mortal import train as tr
from mortal.net import wire
from mortal.model.checkpoint import CHECKPOINT_KEYS, CheckpointError, atomic_torch_save
from mortal.data.claims import staleness
from mortal.data.dataloader import iter_full_batches
from mortal.learning.guards import is_better
from mortal.learning.optimizer import _fused, build_param_groups, load_optimizer_state
from mortal.learning.optimizer import LinearWarmUpCosineAnnealingLR
from mortal.learning.supervisor import supervise

from conftest import (ROOT, FakeTestPlayer, FakeWriter, ScriptedRemote, empty_drain, fake_trainer, load_tiny_config,
                      random_batch, start_param_server, stop_server, write_grp)


# per-batch instruments written at every save (mortal/learning/diagnostics.py); the probe tags need probe logs
DIAG_TAGS = {'diag/q_minus_target', 'diag/q_minus_target_greedy', 'diag/q_gap', 'diag/q_spread', 'diag/taken_greedy'}


def make_trainer(tmp_path, *, online=False, results=((0.0, 2.5),), real_submit=False, **overrides):
    """A Trainer with fake test player and writer; online ones record submissions in ``trainer.submits``
    instead of sending them (unless real_submit)."""
    config, _ = load_tiny_config(tmp_path, online=online, **overrides)
    writer = FakeWriter()
    trainer = fake_trainer(config, test_player=FakeTestPlayer(results), writer=writer)
    trainer.submits = []
    if not real_submit:
        trainer.submit_param = lambda is_idle=False: trainer.submits.append((trainer.steps, is_idle))
        trainer.sync_baseline = lambda: None  # no server to submit the baseline to
    return trainer, writer


def zero_heads(trainer):
    with torch.no_grad():
        for p in list(trainer.dqn.parameters()) + list(trainer.aux_net.parameters()):
            p.zero_()


# -- pure functions ----------------------------------------------------------------------------------------------

def test_param_groups_decay_only_linear_and_conv_weights():
    net = torch.nn.Sequential(torch.nn.Conv1d(2, 3, 1), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    decay, no_decay = build_param_groups([net], 0.1)
    assert decay['weight_decay'] == 0.1 and 'weight_decay' not in no_decay
    assert [p is q for p, q in zip(decay['params'], [net[0].weight, net[2].weight])] == [True, True]
    expected = [net[0].bias, net[1].bias, net[1].weight, net[2].bias]  # sorted names 0.bias 1.bias 1.weight 2.bias
    assert len(no_decay['params']) == 4 and all(p is q for p, q in zip(no_decay['params'], expected))


def test_fused_adamw_on_the_cpu_kept_across_a_load():
    """A checkpoint's groups carry torch's fused/foreach flags (None from a default AdamW): loading one keeps this
    process's fused step, and the fused step equals the default one up to float rounding."""
    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(64, 32))]
    ours = [torch.nn.Parameter(ref[0].detach().clone())]
    default = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.1)
    fused = torch.optim.AdamW(ours, lr=1e-3, weight_decay=0.1, fused=_fused([{'params': ours}]))
    assert fused.param_groups[0]['fused'] is True
    for step in range(3):
        g = torch.randn(64, 32)
        ref[0].grad, ours[0].grad = g.clone(), g.clone()
        default.step()
        if step == 0:  # the default's state (fused None) loaded into the fused optimizer, as after a restart
            load_optimizer_state(fused, copy.deepcopy(default.state_dict()))  # a checkpoint: its own tensors
            ours[0].data.copy_(ref[0].data)
        else:
            fused.step()
    assert fused.param_groups[0]['fused'] is True and fused.param_groups[0]['foreach'] is None
    assert fused.state[ours[0]]['step'].item() == 3
    torch.testing.assert_close(ours[0], ref[0], atol=1e-7, rtol=1e-6)
    plain = torch.optim.AdamW(ours, lr=1e-3)
    plain.load_state_dict(default.state_dict())  # torch's own load: the checkpoint's None wins
    assert plain.param_groups[0]['fused'] is None


def test_scheduler_values_by_hand():
    p = [torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.AdamW(p, lr=1)
    s = LinearWarmUpCosineAnnealingLR(opt, peak=1e-3, final=1e-4, warm_up_steps=10, max_steps=110)
    f = s.factor
    assert f(0) == pytest.approx(1e-8)
    assert f(5) == pytest.approx(1e-8 + (1e-3 - 1e-8) * 0.5)
    assert f(10) == pytest.approx(1e-3)
    assert f(60) == pytest.approx(1e-4 + 0.5 * 9e-4)  # cos(pi/2) = 0
    assert f(110) == pytest.approx(1e-4) and f(10 ** 6) == pytest.approx(1e-4)
    assert opt.param_groups[0]['lr'] == pytest.approx(1e-8)
    for _ in range(60):
        opt.step()
        s.step()
    assert opt.param_groups[0]['lr'] == pytest.approx(5.5e-4)
    const = LinearWarmUpCosineAnnealingLR(torch.optim.AdamW(p, lr=1), peak=1e-5, final=1e-5,
                                          warm_up_steps=0, max_steps=0)
    assert const.factor(0) == const.factor(12345) == 1e-5
    with pytest.raises(ValueError, match='peak >= final'):
        LinearWarmUpCosineAnnealingLR(opt, peak=1e-5, final=1e-4, warm_up_steps=0, max_steps=0)


def test_scheduler_resume_keeps_position_but_config_shape():
    p = [torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.AdamW(p, lr=1)
    s = LinearWarmUpCosineAnnealingLR(opt, peak=1e-3, final=1e-4, warm_up_steps=10, max_steps=110)
    for _ in range(60):
        opt.step()
        s.step()
    opt2 = torch.optim.AdamW(p, lr=1)
    s2 = LinearWarmUpCosineAnnealingLR(opt2, peak=2e-3, final=1e-4, warm_up_steps=10, max_steps=110)
    opt2.load_state_dict(opt.state_dict())
    s2.load_state_dict(s.state_dict())
    assert s2.last_epoch == 60 and s2.peak == 2e-3
    assert opt2.param_groups[0]['lr'] == pytest.approx(1e-4 + 0.5 * 1.9e-3)


@pytest.mark.parametrize('pt, rank, better', [
    (10.0, 2.4, True), (10.0, 2.5, True), (5.0, 2.4, True), (4.9, 2.0, False), (20.0, 2.51, False)])
def test_best_rule_needs_both_not_worse(pt, rank, better):
    assert is_better(pt, rank, {'avg_pt': 5.0, 'avg_rank': 2.5}) is better


def test_iter_full_batches_pools_short_batches():
    sizes = [4, 3, 4, 2, 3, 1]
    start, batches = 0, []
    for n in sizes:
        batches.append((torch.arange(start, start + n), torch.arange(start, start + n) * 10))
        start += n
    out = [tuple(t.tolist() for t in b) for b in iter_full_batches(batches, 4)]
    assert out == [
        ([0, 1, 2, 3], [0, 10, 20, 30]),
        ([7, 8, 9, 10], [70, 80, 90, 100]),
        ([4, 5, 6, 11], [40, 50, 60, 110]),  # pooled short ones, in arrival order
        ([12, 13, 14, 15], [120, 130, 140, 150]),
    ]  # 17 samples: the 1 left over is dropped


def test_staleness_ignores_unknown_versions():
    assert staleness({'param_version': 7, 'param_versions': [7, 5, -1, 2]}) == [0, 2, 5]
    assert staleness({'param_version': 0, 'param_versions': []}) == []


def test_atomic_save_never_leaves_a_partial_checkpoint(tmp_path, monkeypatch):
    target = str(tmp_path / 'ck.pth')
    atomic_torch_save({'steps': 1}, target)
    real_save = torch.save

    def dying_save(obj, f):
        f.write(b'PK\x03\x04 partial')
        raise KeyboardInterrupt  # as if killed mid-write

    monkeypatch.setattr(torch, 'save', dying_save)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({'steps': 2}, target)
    monkeypatch.setattr(torch, 'save', real_save)
    assert torch.load(target, weights_only=True) == {'steps': 1}


# -- Trainer ------------------------------------------------------------------------------------------------------

def test_losses_by_hand_offline(tmp_path):
    trainer, writer = make_trainer(tmp_path, online=False, **{
        'control': {'opt_step_every': 2, 'save_every': 2, 'test_every': 2}, 'env': {'gamma': 0.5}})
    zero_heads(trainer)
    b = random_batch(gamma_steps=torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]), reward=4.0)
    trainer.train_batch(*b)
    # q = 0 for every legal action; target = 4 * 0.5 ** steps = 4, 2, 1, 0.5 (twice)
    expected_dqn = 0.5 * (16 + 4 + 1 + 0.25) * 2 / 8
    n_legal = b[2].sum(-1).double()
    expected_cql = n_legal.log().mean().item()  # logsumexp over n zeros = log n; minus q = 0
    assert trainer.stats['dqn_loss'] == pytest.approx(expected_dqn, rel=1e-6)
    assert trainer.stats['cql_loss'] == pytest.approx(expected_cql, rel=1e-5)
    assert trainer.stats['next_rank_loss'] == pytest.approx(math.log(4), rel=1e-6)


def test_first_loss_point_after_a_resume_is_the_mean_of_the_batches_trained(tmp_path):
    # issue 36: a learner resumed at step 3 of a save_every=4 window writes the loss at step 4 after ONE batch;
    # its mean is that batch's loss, not a quarter of it
    trainer, writer = make_trainer(tmp_path, online=False, **{
        'control': {'opt_step_every': 1, 'save_every': 4, 'test_every': 8}, 'env': {'gamma': 0.5}})
    zero_heads(trainer)
    trainer.steps = 3
    trainer.train_batch(*random_batch(gamma_steps=torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]), reward=4.0))
    written = {t: v for t, v, s in writer.scalars if s == 4}
    assert written['loss/dqn_loss'] == pytest.approx(0.5 * (16 + 4 + 1 + 0.25) * 2 / 8, rel=1e-6)
    assert written['loss/next_rank_loss'] == pytest.approx(math.log(4), rel=1e-6)
    assert trainer.stat_batches == 0  # reset with the sums


def test_a_step_reads_no_value_back_but_the_mask_check(tmp_path):
    # issue 32 part 5: each scalar read (.item(), bool(tensor), boolean indexing) of a device tensor stalls a GPU's
    # queue; the step without an optimizer update makes one, the host-side mask check (the loader's tensors). The
    # loss sums and the q statistics stay on the device until the save (main made 10 reads a step).
    from torch.utils._python_dispatch import TorchDispatchMode
    trainer, writer = make_trainer(tmp_path, online=True, **{
        'control': {'opt_step_every': 2, 'save_every': 4, 'test_every': 4, 'submit_every': 4}})
    reads = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split('.')[0] in ('_local_scalar_dense', 'nonzero'):
                reads.append(func.__name__)
            return func(*args, **(kwargs or {}))

    batch = random_batch(seed=1)
    with Reads():
        trainer.train_batch(*batch)
    assert reads == ['_local_scalar_dense.default']
    assert trainer.stats['dqn_loss'] > 0 and trainer.stat_batches == 1


def test_online_has_no_cql_and_learns_only_with_accumulation(tmp_path):
    trainer, writer = make_trainer(tmp_path, online=True, **{
        'control': {'opt_step_every': 2, 'save_every': 4, 'test_every': 4, 'submit_every': 4}})
    before = [p.detach().clone() for p in trainer.mortal.parameters()]
    trainer.train_batch(*random_batch(seed=1))
    assert trainer.stats['cql_loss'] == 0.0 and trainer.stats['dqn_loss'] > 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.mortal.parameters()))  # accumulating
    trainer.train_batch(*random_batch(seed=2))
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.mortal.parameters()))
    assert all(p.grad is None for p in trainer.mortal.parameters())


def test_accumulation_is_keyed_on_the_global_step(tmp_path):
    trainer, _ = make_trainer(tmp_path, **{'control': {'opt_step_every': 2, 'save_every': 4, 'test_every': 4}})
    trainer.steps = 3  # e.g. resumed mid-window: the very next batch completes an accumulation window
    before = [p.detach().clone() for p in trainer.dqn.parameters()]
    trainer.train_batch(*random_batch())
    assert trainer.steps == 4
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.dqn.parameters()))


def test_freeze_bn_keeps_running_stats(tmp_path):
    trainer, _ = make_trainer(tmp_path, online=True, **{'control': {'save_every': 4, 'test_every': 4,
                                                                    'submit_every': 4}})
    bns = [m for m in trainer.mortal.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    stats = [m.running_mean.clone() for m in bns]
    gammas = [m.weight.detach().clone() for m in bns]
    trainer.train_batch(*random_batch())
    assert all(torch.equal(a, m.running_mean) for a, m in zip(stats, bns))
    assert not all(torch.equal(a, m.weight) for a, m in zip(gammas, bns))


def test_clipping_sees_unscaled_gradients_under_amp(tmp_path, monkeypatch):
    norms = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm):
        total = real_clip(params, max_norm)
        norms.append(float(total))
        return total

    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_', spy)
    for amp in (False, True):
        sub = tmp_path / str(amp)
        sub.mkdir()
        torch.manual_seed(0)
        trainer, _ = make_trainer(sub, **{'control': {'enable_amp': amp, 'save_every': 4, 'test_every': 4}})
        assert trainer.scaler.is_enabled() is amp
        trainer.train_batch(*random_batch())
    plain, amp = norms
    # GradScaler starts at a scale of 65536: clipping before unscaling would see a norm ~65536x larger.
    assert 0.5 < amp / plain < 2.0


def test_save_tags_checkpoint_test_play_and_best(tmp_path):
    trainer, writer = make_trainer(tmp_path, online=False, results=[(10.0, 2.4), (20.0, 2.6)])
    for i in range(2):
        trainer.train_batch(*random_batch(seed=i))
    state = torch.load(trainer.state_file, weights_only=True)
    assert tuple(state) == CHECKPOINT_KEYS and state['steps'] == 2
    assert state['config']['control']['online'] is False
    assert {t for t, _, _ in writer.scalars} == {'loss/dqn_loss', 'loss/cql_loss', 'loss/next_rank_loss',
                                                  'hparam/lr'} | DIAG_TAGS
    assert [(t, n, s) for t, n, s in writer.histograms] == [('q_predicted', 1, 2), ('q_target', 1, 2)]
    assert not os.path.exists(trainer.best_state_file)
    for i in range(2):
        trainer.train_batch(*random_batch(seed=i))
    assert trainer.test_player.calls == [1]  # test_play games 4 -> 1 seed
    assert trainer.best_perf == {'avg_pt': 10.0, 'avg_rank': 2.4}
    best = torch.load(trainer.best_state_file, weights_only=True)
    assert best['steps'] == 4 and best['best_perf'] == {'avg_pt': 10.0, 'avg_rank': 2.4}
    assert torch.load(trainer.state_file, weights_only=True)['best_perf'] == best['best_perf']
    for i in range(4):
        trainer.train_batch(*random_batch(seed=i))
    # 20 pt but rank 2.6 is worse: best stays
    assert trainer.best_perf == {'avg_pt': 10.0, 'avg_rank': 2.4}
    assert torch.load(trainer.best_state_file, weights_only=True)['steps'] == 4


def test_online_exits_after_test_play_and_submits(tmp_path, monkeypatch):
    trainer, writer = make_trainer(tmp_path, online=True, **{'control': {'submit_every': 3}})
    submits = trainer.submits
    trainer.train_batch(*random_batch())
    trainer.train_batch(*random_batch())  # save at 2 missed the submit (every 3): submitted at the save
    trainer.train_batch(*random_batch())  # 3: regular submit
    with pytest.raises(tr.TestPlayDone):
        trainer.train_batch(*random_batch())  # 4: save + submit (missed) + test play, then exit
    assert submits == [(2, False), (3, False), (4, False)]
    assert 'loss/cql_loss' not in writer.tags()
    assert torch.load(trainer.state_file, weights_only=True)['steps'] == 4


def test_online_without_restart_trains_on_after_each_test_play(tmp_path):
    # [online] restart_after_test_play = false: each test play judges best.pth and the same learner goes on
    config, _ = load_tiny_config(tmp_path, online=True)
    config['online']['restart_after_test_play'] = False
    trainer = fake_trainer(config, test_player=FakeTestPlayer([(10.0, 2.4), (20.0, 2.3)]))
    trainer.submit_param = trainer.sync_baseline = lambda *a, **k: None
    for i in range(8):  # test plays at steps 4 and 8 (test_every 4)
        trainer.train_batch(*random_batch(seed=i))
    assert trainer.test_player.calls == [1, 1]
    assert trainer.best_perf == {'avg_pt': 20.0, 'avg_rank': 2.3}
    assert torch.load(trainer.best_state_file, weights_only=True)['steps'] == 8
    assert torch.load(trainer.state_file, weights_only=True)['steps'] == 8


def test_resume_restores_everything(tmp_path):
    trainer, _ = make_trainer(tmp_path)
    for i in range(2):
        trainer.train_batch(*random_batch(seed=i))
    trainer2, _ = make_trainer(tmp_path)
    assert trainer2.steps == 2
    for a, b in zip(trainer.mortal.state_dict().values(), trainer2.mortal.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = trainer.optimizer.state_dict(), trainer2.optimizer.state_dict()
    assert torch.equal(s1['state'][0]['exp_avg'], s2['state'][0]['exp_avg'])
    assert trainer2.scheduler.last_epoch == 2


def test_offline_checkpoint_in_online_mode_keeps_config_optimizer(tmp_path):
    trainer, _ = make_trainer(tmp_path, online=False)
    for i in range(2):
        trainer.train_batch(*random_batch(seed=i))
    online, _ = make_trainer(tmp_path, online=True, control={'test_every': 8},
                             **{'optim.scheduler': {'peak': 5e-4, 'final': 5e-4}})
    assert online.steps == 2
    assert online.optimizer.state_dict()['state'] == {}
    assert online.scheduler.last_epoch == 0
    assert [g['lr'] for g in online.optimizer.param_groups] == [5e-4, 5e-4]
    # and an online checkpoint in online mode does load them
    for i in range(2):
        online.train_batch(*random_batch(seed=i))
    again, _ = make_trainer(tmp_path, online=True, control={'test_every': 8},
                            **{'optim.scheduler': {'peak': 5e-4, 'final': 5e-4}})
    assert again.optimizer.state_dict()['state'] != {} and again.scheduler.last_epoch == 2


def test_checkpoint_mismatch_names_both_shapes(tmp_path):
    trainer, _ = make_trainer(tmp_path)
    trainer.save()
    with pytest.raises(CheckpointError) as err:
        make_trainer(tmp_path, resnet={'conv_channels': 32})
    msg = str(err.value)
    assert 'mortal.encoder' in msg and 'has shape (16, 934, 3) in the checkpoint but the config expects (32, 934, 3)' \
        in msg
    assert 'conv_channels 16' in msg and 'conv_channels = 32' in msg and 'mortal.pth' in msg


def test_version_1_is_refused(tmp_path):
    config, _ = load_tiny_config(tmp_path)
    config['control']['version'] = 1
    with pytest.raises(ValueError, match='version = 1 cannot be trained'):
        fake_trainer(config)


def test_real_tensorboard_tags(tmp_path):
    from mortal.stat import Stat
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stat_dir = os.path.join(ROOT, 'tests', 'data', 'stat')
    name = __import__('json').loads(open(os.path.join(stat_dir, 'log_a.json')).readline())['names'][0]

    class StatPlayer:
        def test_play(self, seed_count, mortal, dqn, device):
            return Stat.from_dir(stat_dir, name)

    config, _ = load_tiny_config(tmp_path, online=False)
    trainer = tr.Trainer(config, test_player=StatPlayer())
    for i in range(4):
        trainer.train_batch(*random_batch(seed=i))
    trainer.writer.close()
    acc = EventAccumulator(config['control']['tensorboard_dir'])
    acc.Reload()
    assert set(acc.Tags()['scalars']) == {'loss/dqn_loss', 'loss/cql_loss', 'loss/next_rank_loss', 'hparam/lr',
                                          'test_play/avg_ranking', 'test_play/avg_pt', 'test_play/houjuu_point',
                                          'test_play/point_per_round', 'test_play/riichi_point',
                                          'test_play/fuuro_num', 'test_play/fuuro_point'} | DIAG_TAGS
    assert set(acc.Tags()['histograms']) == {'q_predicted', 'q_target'}
    groups = sorted(d for d in os.listdir(config['control']['tensorboard_dir'])
                    if os.path.isdir(os.path.join(config['control']['tensorboard_dir'], d)))
    # add_scalars writes one sub-directory per group member, named tag_member with '/' replaced by '_'
    assert 'test_play_ranking_1st' in groups and 'test_play_riichi_chasing_riichi' in groups
    assert acc.Scalars('hparam/lr')[-1].value == pytest.approx(1e-3)


# -- online data plumbing against a real server ------------------------------------------------------------------

@pytest.fixture
def live_server(tmp_path):
    server = start_param_server(tmp_path, 2, timeout=5)
    yield server
    stop_server(server)


START = b'{"type": "start_game"}\n'  # the server stores only logs that start as mjai logs


def test_drain_waits_resubmits_after_restart_and_logs_health(tmp_path, live_server):
    trainer, writer = make_trainer(tmp_path, online=True, real_submit=True)
    trainer.server.remote = wire.Remote('127.0.0.1', live_server.server_address[1], timeout=5)
    remote = trainer.server.remote
    sleeps = []

    def fake_sleep(sec):
        sleeps.append(sec)
        if len(sleeps) == 2:  # a client submits while the trainer polls
            sid = remote.request({'type': 'get_param', 'param_version': -1})['server_id']
            remote.request({'type': 'submit_replay', 'logs': {'a.json.gz': START + b'1', 'b.json.gz': START + b'2'},
                            'param_version': 1, 'server_id': sid})
            trainer.submit_param()  # version 2

    trainer.server.sleep = fake_sleep
    files = trainer.server.drain(trainer.steps, trainer.resubmit)
    assert sleeps == [5.0, 5.0]
    assert [os.path.basename(f) for f in files] == ['0_a.json.gz', '0_b.json.gz']
    # the learner reads its own links, so a server restart wiping drain_dir mid-epoch takes nothing from it
    assert all(os.path.dirname(f) == str(tmp_path / 'drain') + '.trainer' for f in files)
    live_server.store.reset_dirs()
    assert [open(f, 'rb').read() for f in files] == [START + b'1', START + b'2']
    # the first poll found a server without parameters (as after a restart): the trainer resubmitted them
    assert live_server.store.param_version == 2 and live_server.store.idle_param_version == 1
    got = {t: v for t, v, _ in writer.scalars}
    assert got['data/logs_per_drain'] == 2 and got['data/staleness_mean'] == 1 and got['data/staleness_max'] == 1
    assert got['data/wait_seconds'] >= 0


def test_drain_resubmits_once_per_restart_and_polls_every_5_s(tmp_path):
    trainer, writer = make_trainer(tmp_path, online=True, real_submit=True)
    drain_dir = str(tmp_path / 'drain')
    os.makedirs(drain_dir)
    (tmp_path / 'drain' / '3_x.json.gz').write_bytes(b'x')
    full = {**empty_drain(drain_dir, 'B', True), 'count': 1, 'files': ['3_x.json.gz'], 'param_versions': [-1]}
    # instance A without parameters for three polls (our resubmission not yet visible, e.g. a slow link), then a
    # second restart (instance B) also without parameters, then data
    trainer.server.remote = ScriptedRemote([empty_drain(drain_dir, 'A', False)] * 3 + [empty_drain(drain_dir, 'B', False),
                                     full])
    sleeps = []
    trainer.server.sleep = sleeps.append
    files = trainer.server.drain(trainer.steps, trainer.resubmit)
    assert trainer.server.remote.submits == [True, True]  # once for A, once for B: never a loop
    assert sleeps == [5.0, 5.0, 5.0, 5.0]
    assert [os.path.basename(f) for f in files] == ['3_x.json.gz']


def test_drained_logs_vanishing_before_the_claim_are_counted_lost(tmp_path, caplog):
    trainer, writer = make_trainer(tmp_path, online=True)
    drain_dir = str(tmp_path / 'drain')
    os.makedirs(drain_dir)
    (tmp_path / 'drain' / '0_b.json.gz').write_bytes(b'b')
    # the server restarted (wiping drain_dir) between its drain reply and the claim: 0_a and 0_c are gone
    lost = {**empty_drain(drain_dir, 'A', True), 'count': 3, 'files': ['0_a.json.gz', '0_b.json.gz', '0_c.json.gz'],
            'param_versions': [1, 2, 3], 'param_version': 5}
    all_lost = {**lost, 'files': ['1_d.json.gz'], 'count': 1, 'param_versions': [4]}
    trainer.server.remote = ScriptedRemote([all_lost, lost])
    sleeps = []
    trainer.server.sleep = sleeps.append
    with caplog.at_level('WARNING', logger='mortal.train'):
        files = trainer.server.drain(trainer.steps, trainer.resubmit)
    assert [os.path.basename(f) for f in files] == ['0_b.json.gz'] and open(files[0], 'rb').read() == b'b'
    assert sleeps == [5.0]  # a drain whose logs all vanished is an empty one: poll again
    assert trainer.server.lost_logs == 3
    warnings_ = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
    assert len(warnings_) == 2 and '1 of 1 drained logs vanished' in warnings_[0]
    assert '2 of 3 drained logs vanished' in warnings_[1] and 'lost, 3 in total' in warnings_[1]
    got = {t: v for t, v, _ in writer.scalars}
    assert got['data/logs_per_drain'] == 1 and got['data/staleness_max'] == 3  # only 0_b's version 2 counts


def test_a_hostile_drain_reply_links_nothing_outside_and_does_not_crash_the_learner(tmp_path, caplog):
    """Names with separators, '..', non-strings, and a reply missing its fields: refused with a line each, polled
    again; only the plain name is claimed, and nothing is linked outside the claim folder."""
    trainer, writer = make_trainer(tmp_path, online=True)
    drain_dir = str(tmp_path / 'drain')
    os.makedirs(drain_dir)
    (tmp_path / 'drain' / '0_a.json.gz').write_bytes(b'a')
    (tmp_path / 'secret').write_bytes(b's')
    bad_shape = {**empty_drain(drain_dir, 'A', True), 'count': '1', 'files': None}
    hostile = {**empty_drain(drain_dir, 'A', True), 'count': 5, 'param_version': 'x', 'param_versions': 7,
               'files': ['../secret', '..', ['0_a.json.gz'], '0_a.json.gz', 'a/../../b']}
    trainer.server.remote = ScriptedRemote([bad_shape, hostile])
    sleeps = []
    trainer.server.sleep = sleeps.append
    with caplog.at_level('WARNING'):
        files = trainer.server.drain(trainer.steps, trainer.resubmit)
    assert [os.path.basename(f) for f in files] == ['0_a.json.gz'] and sleeps == [5.0]
    claim_dir = os.path.dirname(files[0])
    assert sorted(n for n in os.listdir(claim_dir) if n.endswith('.gz')) == ['0_a.json.gz']
    assert os.stat(tmp_path / 'secret').st_nlink == 1  # the claim hard-links: '../secret' was never linked
    lines = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
    assert any(line.startswith('malformed drain reply (count str, files NoneType, drain_dir str)') for line in lines)
    assert any(line.startswith('4 drained names refused (not plain log file names)') for line in lines)
    got = {t: v for t, v, _ in writer.scalars}
    assert got['data/logs_per_drain'] == 1 and 'data/staleness_max' not in got


def test_a_drain_reply_naming_another_folder_makes_and_links_nothing_there(tmp_path, caplog):
    # a hostile trial's server named '.../home/.ssh' as its drain_dir: the learner made '.ssh.trainer' and hard-linked
    # id_rsa into it; another name emptied another run's claim folder
    trainer, writer = make_trainer(tmp_path, online=True)
    own = trainer.server.drain_dir
    victim = tmp_path / 'home' / '.ssh'
    victim.mkdir(parents=True)
    (victim / 'id_rsa').write_bytes(b'key')
    trainer.server.remote = ScriptedRemote([{**empty_drain(str(victim), 'A', True), 'count': 1, 'files': ['id_rsa'],
                                             'param_versions': [1]}])
    with pytest.raises(SystemExit) as info, caplog.at_level('ERROR'):
        trainer.server.drain(trainer.steps, trainer.resubmit)
    assert info.value.code == 2 and os.stat(victim / 'id_rsa').st_nlink == 1
    assert not (tmp_path / 'home' / '.ssh.trainer').exists()
    assert [r.getMessage() for r in caplog.records if r.levelname == 'ERROR'] == [
        f"the server drained to {victim}, but this config's [online.server] drain_dir is {own} ({own}): the learner "
        f"claims drained logs only in its own folder; run the server and the learner with the same folder (an "
        f"absolute path, or one under {{config_dir}})"]
    # the same folder reached through a link is the learner's own: claimed in its own config's claim folder
    os.makedirs(own)
    (tmp_path / 'drain_link').symlink_to(own)
    (tmp_path / 'drain' / '0_a.json.gz').write_bytes(b'a')
    trainer.server.remote = ScriptedRemote([{**empty_drain(str(tmp_path / 'drain_link'), 'A', True), 'count': 1,
                                             'files': ['0_a.json.gz'], 'param_versions': [1]}])
    files = trainer.server.drain(trainer.steps, trainer.resubmit)
    assert files == [own + '.trainer/0_a.json.gz'] and not (tmp_path / 'drain_link.trainer').exists()


def test_a_drain_folder_that_cannot_be_claimed_ends_the_learner_in_one_line(tmp_path, caplog):
    trainer, writer = make_trainer(tmp_path, online=True)
    trainer.server.drain_dir = None  # a learner's config without [online.server]: the server's folder is taken
    trainer.server.remote = ScriptedRemote([{**empty_drain('/proc/self', 'A', True), 'count': 1,
                                             'files': ['environ'], 'param_versions': [1]}])
    with pytest.raises(SystemExit) as info, caplog.at_level('ERROR'):
        trainer.server.drain(trainer.steps, trainer.resubmit)
    assert info.value.code == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == 'ERROR']
    assert len(errors) == 1 and errors[0].startswith('cannot claim the drained logs of /proc/self: ')


@pytest.mark.slow
def test_offline_epoch_on_real_logs_builds_index(tmp_path):
    import shutil
    (tmp_path / 'dataset').mkdir()
    for p in ('meta_annotated_hanchan.jsonl', 'riichienv_selfplay_hanchan.jsonl'):
        shutil.copy(os.path.join(ROOT, 'tests', 'data', p), tmp_path / 'dataset' / (p[:-1]))
    (tmp_path / 'dataset' / 'broken.json').write_text('{"type": "start_game"\n')
    trainer, writer = make_trainer(tmp_path, online=False, results=[(0.0, 2.5)] * 100,
                                   control={'batch_size': 64, 'save_every': 10, 'test_every': 1000})
    write_grp(trainer.config)
    trainer.run()
    index = torch.load(trainer.config['dataset']['file_index'], weights_only=True)['file_list']
    assert [os.path.basename(f) for f in index] == ['riichienv_selfplay_hanchan.json',
                                                   'meta_annotated_hanchan.json', 'broken.json']
    assert trainer.steps > 10  # two hanchan, four seats each: > 1000 samples at batch 64


@pytest.mark.slow
def test_supervisor_restarts_on_zero_and_stops_on_error(tmp_path):
    counter = tmp_path / 'n'
    script = tmp_path / 'child.py'
    script.write_text(
        'import os, sys\n'
        f'p = {str(counter)!r}\n'
        'n = int(open(p).read()) if os.path.exists(p) else 0\n'
        'open(p, "w").write(str(n + 1))\n'
        'assert os.environ["MORTAL_IS_SUB_PROC"] == "1"\n'
        'sys.exit(0 if n < 2 else 3)\n')
    code = supervise([], restart_delay=0.05, script=str(script))
    assert code == 3 and counter.read_text() == '3'


@pytest.mark.slow
def test_supervisor_honours_sigterm_between_learners(tmp_path):
    # A SIGTERM that lands in the restart pause (no learner running) must stop the supervisor,
    # not be lost: the child below exits 0 at once, so the signal arrives while it sleeps.
    counter = tmp_path / 'n'
    child = tmp_path / 'child.py'
    child.write_text(f'p = {str(counter)!r}\n'
                     'import os\n'
                     'n = int(open(p).read()) if os.path.exists(p) else 0\n'
                     'open(p, "w").write(str(n + 1))\n')
    runner = tmp_path / 'runner.py'
    runner.write_text('import sys\n'
                      'from mortal.learning import supervisor\n'
                      f'sys.exit(supervisor.supervise([], restart_delay=3.0, script={str(child)!r}))\n')
    env = {**os.environ, 'PYTHONPATH': str(tr.path.dirname(tr.path.dirname(tr.__file__)))}
    proc = subprocess.Popen([sys.executable, str(runner)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not counter.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the learner has exited; the supervisor is in its 3 s pause
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert counter.read_text() == '1'  # no second learner was started


@pytest.mark.slow
def test_packed_batches_train_exactly_like_float_ones(tmp_path):
    # The loader hands train_batch packed rows (mortal.features.packed_obs); the same samples as float32 must
    # give bit-identical weights.
    from mortal.features.packed_obs import REAL_ROWS, pack
    g = torch.Generator().manual_seed(3)
    _, actions, masks, steps, rewards, ranks = random_batch()
    obs = (torch.rand((8, 934, 34), generator=g) < 0.2).float()
    obs[:, list(REAL_ROWS[3])] = torch.rand((8, len(REAL_ROWS[3]), 34), generator=g)
    packed = torch.from_numpy(pack(obs.numpy(), 3))
    assert packed.dtype == torch.uint8 and packed.shape == (8, 13900)
    states = []
    for name, x in (('float', obs), ('packed', packed)):
        (tmp_path / name).mkdir()
        torch.manual_seed(0)
        trainer, _ = make_trainer(tmp_path / name, online=False)
        for _ in range(2):
            trainer.train_batch(x, actions, masks, steps, rewards, ranks)
        states.append(trainer.mortal.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(states[0].values(), states[1].values()))
    assert not torch.equal(obs, torch.zeros_like(obs))


# -- a CUDA device on a CPU-only torch (issue 35, case 8) ----------------------------------------------------------

def _cpu_only_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.backends.cuda, 'is_built', lambda: False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize('process, key', [('train', '[control] device'), ('train', '[baseline.test] device'),
                                          ('client', '[baseline.train] device'),
                                          ('train_grp', '[grp.control] device'),
                                          ('one_vs_three', '[1v3.champion] device')])
def test_a_cuda_device_on_a_cpu_only_torch_is_one_line_naming_the_key_and_both_fixes(tmp_path, capsys, monkeypatch,
                                                                                      process, key):
    import importlib
    import toml
    from conftest import tiny_config_dict
    _cpu_only_torch(monkeypatch)
    config = tiny_config_dict(tmp_path, online=False)
    table, name = key[1:].split('] ')
    node = config
    for part in table.split('.'):
        node = node[part]
    node[name] = 'cuda:0'
    path = tmp_path / 'config.toml'
    path.write_text(toml.dumps(config))
    monkeypatch.setattr('sys.argv', [f'{process}.py'])
    main = importlib.import_module(f'mortal.{process}').main
    with pytest.raises(SystemExit) as info:
        code = main(['-c', str(path)])
        raise SystemExit(code)
    assert info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error: ')]
    assert lines == [f"error: {key} = 'cuda:0', but this torch ({torch.__version__}) is a CPU-only build: install a "
                     f"CUDA build of torch, or set {key} = 'cpu'"]


def test_a_diverged_model_is_not_saved_and_its_checkpoint_is_refused(tmp_path):
    trainer, writer = make_trainer(tmp_path)
    trainer.train_batch(*random_batch(seed=0))
    trainer.save()
    state_file = trainer.state_file
    saved = open(state_file, 'rb').read()
    with torch.no_grad():
        trainer.dqn.state_dict()['a_head.2.bias'].fill_(float('nan'))
    with pytest.raises(tr.Diverged, match=r'current_dqn\.a_head\.2\.bias holds NaN or inf at step 1; .*mortal\.pth '
                                          r'is left at step 1'):
        trainer.on_save()
    assert open(state_file, 'rb').read() == saved and writer.histograms == []  # nothing written after the NaN
    trainer.saved_steps = None  # a fresh run that diverges before its first save
    with pytest.raises(tr.Diverged, match=r'mortal\.pth is not written; lower \[optim\] lr'):
        trainer.on_save()
    # a checkpoint holding NaN (a diverged run's, or a damaged file) is refused by name, not trained on
    state = torch.load(state_file)
    state['current_dqn']['a_head.2.bias'].fill_(float('inf'))
    torch.save(state, state_file)
    with pytest.raises(CheckpointError, match=r'mortal\.pth: current_dqn\.a_head\.2\.bias holds NaN or inf'):
        make_trainer(tmp_path)
    state['current_dqn']['a_head.2.bias'].fill_(0.0)
    torch.save({**state, 'steps': 'abc'}, state_file)
    with pytest.raises(CheckpointError, match=r"mortal\.pth: 'steps' is 'abc', not a count of steps"):
        make_trainer(tmp_path)


def test_a_diverged_model_is_never_sent_to_the_clients(tmp_path):
    # a hostile trial's log (a branch record of 10**300 points) made the weights NaN; the submit that came before the
    # save's check sent them to every client, whose sampling then crashed
    trainer, writer = make_trainer(tmp_path, online=True, real_submit=True)
    sent = []
    trainer.server.submit = lambda mortal, dqn, **kw: sent.append(kw['is_idle'])
    trainer.submit_param(is_idle=True)
    with torch.no_grad():
        trainer.mortal.state_dict()['encoder.net.0.weight'].view(-1)[0] = float('nan')
    with pytest.raises(tr.Diverged, match=r'mortal\.encoder\.net\.0\.weight holds NaN or inf at step 0'):
        trainer.submit_param()
    assert sent == [True]


def test_a_learner_that_cannot_resume_says_so_in_one_line(tmp_path, capsys):
    config, _ = load_tiny_config(tmp_path)
    with open(config['control']['state_file'], 'wb') as f:
        f.write(b'PK\x03\x04 truncated')
    assert tr.run_learner(config) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {config['control']['state_file']}: ")
    assert err[0].endswith('restore it (a copy of [control] best_state_file is a sound start)')
    assert open(config['control']['state_file'], 'rb').read() == b'PK\x03\x04 truncated'  # left as it was
    # another model file the learner loads (the anchor's baseline) gets no advice about the state file
    (tmp_path / 'anchor').mkdir()
    config, _ = load_tiny_config(tmp_path / 'anchor', online=True)
    config['online']['anchor_weight'] = 1.0
    with open(config['baseline']['train']['state_file'], 'wb') as f:
        f.write(b'PK\x03\x04 truncated')
    assert tr.run_learner(config) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {config['baseline']['train']['state_file']}: ")
    assert 'cannot resume' not in err[0]
