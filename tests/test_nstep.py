"""[online] n_step / target_update_every: the loader's bootstrap columns (nstep_columns), the pure target function
(nstep_targets), the trainer's targets from its frozen target network and the network's refreshes, the config
rules; on values worked by hand."""

import gzip
import itertools

import numpy as np
import pytest
import toml
import torch

from mortal.data.dataloader import FileDatasetsIter, learner_loader, nstep_columns
from mortal.learning.loss import nstep_targets

from conftest import FIXTURE_LOGS, fake_trainer, random_batch, write_baseline, write_grp

GAMMA = 0.9
# two kyoku: decisions 0-3 (done at 3) and 4-6 (done at 6); decision 1 is not a discounted step
DONES = np.array([0, 0, 0, 1, 0, 0, 1], dtype=np.bool_)
APPLY_GAMMA = np.array([1, 0, 1, 1, 1, 1, 1], dtype=np.bool_)
N = len(DONES)


def _trajectory():
    packed = np.arange(N * 5, dtype=np.uint8).reshape(N, 5)  # row i = 5i .. 5i+4: every row distinct
    masks = np.zeros((N, 46), dtype=np.bool_)
    masks[np.arange(N), np.arange(N)] = True  # decision i: action i legal
    masks[np.arange(N), 45] = True
    return packed, masks


def _steps_to_done():
    """As mortal.data.dataloader._game_columns counts them."""
    steps = np.zeros(N, dtype=np.int64)
    for i in range(N - 2, -1, -1):
        if not DONES[i]:
            steps[i] = steps[i + 1] + int(APPLY_GAMMA[i])
    return steps


@pytest.mark.parametrize('n_step, has_next, discount', [
    # n=1: every decision but each kyoku's last; decision 1 (apply_gamma False) is not discounted
    (1, [1, 1, 1, 0, 1, 1, 0], [0.9, 1.0, 0.9, 0.0, 0.9, 0.9, 0.0]),
    # n=2: 0 -> 2 and 1 -> 3 cross decision 1 (one discounted step of two), 4 -> 6 two discounted steps;
    # 2 -> 4 would cross into the next kyoku
    (2, [1, 1, 0, 0, 1, 0, 0], [0.9, 0.9, 0.0, 0.0, 0.81, 0.0, 0.0]),
])
def test_nstep_columns_by_hand(n_step, has_next, discount):
    packed, masks = _trajectory()
    next_obs, next_masks, next_discount, got_has_next = nstep_columns(packed, masks, DONES, APPLY_GAMMA, n_step,
                                                                     GAMMA)
    has_next = np.array(has_next, dtype=np.bool_)
    np.testing.assert_array_equal(got_has_next, has_next)
    assert got_has_next.dtype == np.bool_ and next_discount.dtype == np.float32
    assert next_obs.dtype == np.uint8 and next_obs.shape == packed.shape
    assert next_masks.dtype == np.bool_ and next_masks.shape == masks.shape
    np.testing.assert_allclose(next_discount, np.array(discount, dtype=np.float32), rtol=1e-6)
    steps = _steps_to_done()
    for i in range(N):
        if has_next[i]:
            j = i + n_step
            np.testing.assert_array_equal(next_obs[i], packed[j])
            np.testing.assert_array_equal(next_masks[i], masks[j])
            # gamma ** steps_to_done[i] == next_discount * gamma ** steps_to_done[j]
            assert next_discount[i] == pytest.approx(GAMMA ** (steps[i] - steps[j]), rel=1e-6)
        else:
            assert not next_obs[i].any() and not next_masks[i].any() and next_discount[i] == 0


def test_nstep_columns_past_the_trajectory_bootstrap_nothing():
    packed, masks = _trajectory()
    *_, has_next = nstep_columns(packed, masks, DONES, APPLY_GAMMA, N, GAMMA)
    assert not has_next.any()


def test_nstep_targets_by_hand():
    mc = torch.tensor([1.0, 2.0, 3.0, -4.0])
    has_next = torch.tensor([True, False, True, False])
    disc = torch.tensor([0.9, 0.5, 0.81, 1.0])
    v_next = torch.tensor([10.0, 100.0, -2.0, float('nan')])  # ignored where not has_next
    got = nstep_targets(mc, has_next, disc, v_next)
    torch.testing.assert_close(got, torch.tensor([9.0, 2.0, -1.62, -4.0]))


# -- the trainer ---------------------------------------------------------------------------------------------------

def _trainer(config, **online):
    config['online'].update(online)
    config['optim']['scheduler'].update(peak=1e-2, final=1e-2)
    write_baseline(config, config['control']['state_file'], seed=3)
    trainer = fake_trainer(config, drop_submits=True)
    return trainer


def _nstep_batch(n, seed=0):
    """random_batch's six columns, the two counterfactual ones (none) and the four n-step ones: float next_obs,
    masks with at least one legal action, has_next on every other row."""
    obs, actions, masks, steps, rewards, ranks = random_batch(n, seed, gamma_steps=torch.arange(n) % 3, reward=2.0)
    g = torch.Generator().manual_seed(seed + 100)
    next_obs = torch.rand(obs.shape, generator=g)
    next_masks = torch.rand((n, 46), generator=g) < 0.3
    next_masks[:, 7] = True
    next_discount = torch.tensor([0.9, 0.0, 0.81, 0.0, 1.0, 0.0, 0.9, 0.0][:n], dtype=torch.float32)
    has_next = torch.arange(n) % 2 == 0
    cf_actions = torch.full((n,), -1, dtype=torch.int64)
    return (obs, actions, masks, steps, rewards, ranks, cf_actions, torch.zeros(n),
            next_obs, next_masks, next_discount, has_next)


def _capture_q_target(trainer):
    seen = []
    backward = trainer._backward

    def spy(obs, actions, masks, q_target, *rest, **kw):
        seen.append(q_target.detach().clone())
        return backward(obs, actions, masks, q_target, *rest, **kw)
    trainer._backward = spy
    return seen


def _state(models):
    return {f'{i}.{k}': v.detach().clone() for i, m in enumerate(models) for k, v in m.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_online_targets_bootstrap_from_the_target_network(tiny_config):
    """n_step 1: rows with has_next get next_discount * max legal Q of the target network at next_obs, the others
    gamma ** steps_to_done * reward, and the offline-mix rows always the Monte-Carlo target."""
    config, _ = tiny_config
    trainer = _trainer(config, n_step=1)
    assert trainer.target_net is not None and trainer.n_step == 1
    n = config['control']['batch_size']
    batch = _nstep_batch(n)
    obs, actions, masks, steps, rewards, ranks, _, _, next_obs, next_masks, next_discount, has_next = batch
    extra = random_batch(4, seed=5, gamma_steps=torch.tensor([0, 1, 2, 3]), reward=-1.0)
    trainer.offline_stream = itertools.repeat(extra)  # the offline mix: its own rows, Monte-Carlo targets
    with torch.no_grad():
        brain, dqn = trainer.target_net
        v_next = dqn(brain(next_obs), next_masks).max(-1).values
    mc = (trainer.gamma ** steps * rewards).float()
    expected = torch.where(has_next, next_discount * v_next, mc)
    expected_extra = (trainer.gamma ** extra[3] * extra[4]).float()
    assert not torch.allclose(expected, mc)  # the bootstrapped rows do differ
    seen = _capture_q_target(trainer)
    trainer.train_batch(*batch)
    assert len(seen) == 1 and seen[0].shape == (n + 4,)
    torch.testing.assert_close(seen[0][:n], expected)
    torch.testing.assert_close(seen[0][n:], expected_extra)
    assert trainer.instruments.window.sums['nstep_bootstrapped'] == [float(has_next.sum()), n]
    # Mortal's positional calls (6 or 8 columns) keep the Monte-Carlo target
    trainer.offline_stream = None
    mc6 = (trainer.gamma ** steps * rewards).float()
    trainer.train_batch(*batch[:6])
    trainer.train_batch(*batch[:8])
    torch.testing.assert_close(seen[1], mc6)
    torch.testing.assert_close(seen[2], mc6)


def test_n_step_0_keeps_the_monte_carlo_target_and_no_target_network(tiny_config):
    config, _ = tiny_config
    trainer = _trainer(config)
    assert trainer.target_net is None
    batch = _nstep_batch(config['control']['batch_size'])
    seen = _capture_q_target(trainer)
    trainer.train_batch(*batch)
    torch.testing.assert_close(seen[0], (trainer.gamma ** batch[3] * batch[4]).float())
    assert trainer.instruments.window.sums['nstep_bootstrapped'] == [0.0, 0]


def test_target_network_is_refreshed_every_target_update_every_steps(tiny_config):
    config, _ = tiny_config
    trainer = _trainer(config, n_step=1, target_update_every=2)
    target = trainer.target_net
    trained = (trainer.mortal, trainer.dqn)
    start = _state(trained)
    assert _same(_state(target), start)  # made from the loaded weights
    # a frozen, independent copy, outside the optimizer
    params = {id(p) for g in trainer.optimizer.param_groups for p in g['params']}
    assert all(id(p) not in params and not p.requires_grad for m in target for p in m.parameters())
    trained_ptrs = {p.data_ptr() for m in trained for p in m.parameters()}
    assert all(p.data_ptr() not in trained_ptrs for m in target for p in m.parameters())
    assert not any(m.training for m in target)
    batch = _nstep_batch(config['control']['batch_size'])
    trainer.train_batch(*batch)  # step 1: the trained weights move, the target stays
    assert not _same(_state(trained), start)
    assert _same(_state(target), start)
    assert not _same(_state(target), _state(trained))
    trainer.train_batch(*batch)  # step 2: refreshed
    assert trainer.steps == 2
    assert _same(_state(target), _state(trained))
    assert not _same(_state(target), start)
    assert trainer.target_net is target and not any(m.training for m in target)


def test_rollback_refreshes_the_target_network(tiny_config):
    config, _ = tiny_config
    trainer = _trainer(config, n_step=1)
    write_baseline(config, config['control']['best_state_file'], seed=7)
    batch = _nstep_batch(config['control']['batch_size'])
    trainer.train_batch(*batch)
    assert trainer.guards.rollback('test')
    assert _same(_state(trainer.target_net), _state((trainer.mortal, trainer.dqn)))
    best = torch.load(config['control']['best_state_file'], weights_only=True)
    assert all(torch.equal(v, trainer.target_net[0].state_dict()[k]) for k, v in best['mortal'].items())


# -- the config ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('key, value', [('n_step', -1), ('target_update_every', 0)])
def test_config_rejects_bad_n_step_settings(tiny_config, key, value):
    from mortal.config import ConfigError, load_config
    config, path = tiny_config
    config['online'][key] = value
    path.write_text(toml.dumps(config), encoding='utf-8')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert key in str(info.value)


def test_config_defaults_and_accepts(tiny_config):
    from mortal.config import load_config, typed
    config, path = tiny_config
    online = typed(load_config(path)).online
    assert (online.n_step, online.target_update_every) == (0, 1000)
    config['online'].update(n_step=3, target_update_every=1)
    path.write_text(toml.dumps(config), encoding='utf-8')
    online = typed(load_config(path)).online
    assert (online.n_step, online.target_update_every) == (3, 1)


# -- the loader ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def gz_logs(tmp_path_factory):
    """The fixture logs (conftest ``fixture_logs``), gzipped as the loader reads them."""
    d = tmp_path_factory.mktemp('nstep_logs')
    out = []
    for i, src in enumerate(FIXTURE_LOGS):
        p = d / f'{i}.json.gz'
        p.write_bytes(gzip.compress(src.read_bytes()))
        out.append(str(p))
    return out


def _check_nstep_batch(batch, unpacked=False):
    obs, actions, masks, steps, rewards, ranks, cf_a, cf_d, next_obs, next_masks, next_discount, has_next = batch
    has_next = np.asarray(has_next)
    next_masks, next_discount = np.asarray(next_masks), np.asarray(next_discount)
    assert has_next.dtype == np.bool_ and next_masks.dtype == np.bool_ and next_discount.dtype == np.float32
    assert np.asarray(next_obs).dtype == np.asarray(obs).dtype and np.asarray(next_obs).shape == np.asarray(obs).shape
    assert has_next.any() and not has_next.all()
    assert next_masks[has_next].any(-1).all()  # a later decision has a legal action
    assert not next_masks[~has_next].any() and not np.asarray(next_obs)[~has_next].any()
    assert (next_discount[has_next] > 0).all() and (next_discount[has_next] <= 1).all()
    assert (next_discount[~has_next] == 0).all()
    # a decision in the same kyoku later on is never closer to the end than 0 steps
    assert (np.asarray(steps)[has_next] >= 0).all()


def test_loader_batch_mode_columns(gz_logs):
    from mortal.model.networks import GRP
    torch.manual_seed(0)
    grp = GRP()
    pts = [6.0, 4.0, 2.0, 0.0]
    with_n = next(iter(FileDatasetsIter(3, gz_logs, pts, grp, batch_size=256, n_step=1, gamma=0.9)))
    without = next(iter(FileDatasetsIter(3, gz_logs, pts, grp, batch_size=256)))
    assert len(with_n) == 12 and len(without) == 8
    assert with_n[8].dtype == np.uint8  # packed like obs
    _check_nstep_batch(with_n)
    # the per-sample mode unpacks next_obs like obs
    sample = next(iter(FileDatasetsIter(3, gz_logs, pts, grp, n_step=2, gamma=0.9)))
    assert len(sample) == 12
    assert sample[0].shape == sample[8].shape == (934, 34) and sample[8].dtype == np.float32


def test_learner_loader_n_step_columns(tiny_config, gz_logs):
    config, _ = tiny_config
    write_grp(config)
    batch = next(iter(learner_loader(config, 3, list(gz_logs), [], batch_size=256, num_workers=0, n_step=1)))
    assert len(batch) == 12
    _check_nstep_batch([t.numpy() for t in batch])
    batch = next(iter(learner_loader(config, 3, list(gz_logs), [], batch_size=256, num_workers=0)))
    assert len(batch) == 8


def test_trainer_loaders_online_and_offline_mix(tiny_config, gz_logs):
    """The trainer's own loader carries the n-step columns; the offline mix's (``offline_loader``) does not."""
    import pathlib
    import shutil
    config, _ = tiny_config
    write_grp(config)
    dataset = pathlib.Path(config['dataset']['globs'][0]).parent
    dataset.mkdir(parents=True, exist_ok=True)
    for f in gz_logs:
        shutil.copy(f, dataset / pathlib.Path(f).name)
    trainer = _trainer(config, n_step=2, offline_batch_size=4)
    assert len(next(iter(trainer.data_loader(list(gz_logs), [], num_workers=0)))) == 12
    assert len(next(iter(trainer.data_loader(list(gz_logs), [], num_workers=0, n_step=0)))) == 8
    assert len(next(trainer.offline_stream)) == 8


def test_replayed_batches_keep_their_n_step_columns(tiny_config):
    """[online] replay_ratio 2: the replay window keeps the 12 columns, and a replayed batch (all 8 rows of the one
    batch in the window, in order) gets the same n-step targets as the fresh one."""
    config, _ = tiny_config
    trainer = _trainer(config, n_step=1, replay_ratio=2, replay_window=1)
    batch = _nstep_batch(config['control']['batch_size'])
    with torch.no_grad():
        brain, dqn = trainer.target_net
        v_next = dqn(brain(batch[8]), batch[9]).max(-1).values
    expected = torch.where(batch[11], batch[10] * v_next, (trainer.gamma ** batch[3] * batch[4]).float())
    seen = _capture_q_target(trainer)
    trainer._train_replays(batch, None)
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], expected)
