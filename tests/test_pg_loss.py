"""mortal/learning/loss.py policy terms ([online] pg_weight, pg_temp, kl_weight) on values worked by hand, their
config keys, and the trainer loading the frozen reference pair for the KL term alone."""

import math
import re

import pytest
import toml
import torch
import torch.nn.functional as F

from mortal.config import ConfigError, load_config
from mortal.learning.loss import LossWeights, kl_term, learner_loss, pg_term

from conftest import FakeWriter, fake_trainer, random_batch, tiny_config_dict, write_baseline

E = math.e


def rows(*values):
    """(len(values), 46) float32 Q rows: the given leading values, -inf (illegal) after them."""
    q = torch.full((len(values), 46), -math.inf)
    for i, v in enumerate(values):
        q[i, :len(v)] = torch.tensor(v)
    return q


# --- the policy-gradient term -------------------------------------------------------------------------------------

def test_pg_term_by_hand():
    q = rows([1.0, 0.0], [0.0, 0.0, 0.0])
    actions = torch.tensor([1, 0])
    q_target = torch.tensor([2.0, -1.0])
    # row 0: pi = [e, 1] / (e + 1), value = e / (e + 1), A = 2 - value, log pi(1) = -log(e + 1)
    a0 = 2 - E / (E + 1)
    loss0 = -a0 * math.log(1 / (E + 1))
    # row 1: pi uniform over 3, value 0, A = -1, log pi(0) = -log 3
    loss1 = -(-1) * math.log(1 / 3)
    assert pg_term(q, actions, q_target).item() == pytest.approx((loss0 + loss1) / 2, abs=1e-5)
    # temperature 2: pi = softmax([0.5, 0]), value = pi(0) * 1
    p0 = math.exp(0.5) / (math.exp(0.5) + 1)
    expected = -(2 - p0) * math.log(1 - p0)
    assert pg_term(q[:1], actions[:1], q_target[:1], temp=2.0).item() == pytest.approx(expected, abs=1e-5)


def test_pg_gradient_raises_the_taken_action_when_the_advantage_is_positive():
    q = rows([1.0, 0.0]).requires_grad_(True)
    actions, q_target = torch.tensor([1]), torch.tensor([2.0])  # A = 2 - e / (e + 1) > 0
    pg_term(q, actions, q_target).backward()
    assert torch.isfinite(q.grad).all() and (q.grad[0, 2:] == 0).all()
    with torch.no_grad():
        stepped = q - 0.1 * q.grad  # one SGD step
    assert (stepped[0, 1] - stepped[0, 0]).item() > (q[0, 1] - q[0, 0]).item()
    # a negative advantage lowers it
    q.grad = None
    pg_term(q, actions, torch.tensor([-2.0])).backward()
    assert q.grad[0, 1].item() > 0 > q.grad[0, 0].item()


def test_pg_advantage_is_detached():
    """Only log pi(taken) carries gradient: d/dq_j = -A * (1[j = taken] - pi_j) (the baseline adds none)."""
    q = rows([1.0, 0.0]).requires_grad_(True)
    pg_term(q, torch.tensor([1]), torch.tensor([2.0])).backward()
    a = 2 - E / (E + 1)
    pi1 = 1 / (E + 1)
    assert q.grad[0, 1].item() == pytest.approx(-a * (1 - pi1), abs=1e-5)
    assert q.grad[0, 0].item() == pytest.approx(a * (1 - pi1), abs=1e-5)


# --- the KL term --------------------------------------------------------------------------------------------------

def test_kl_of_identical_policies_is_zero():
    q = rows([1.0, 0.0], [3.0, -2.0, 0.5])
    assert kl_term(q, q.clone()).item() == pytest.approx(0.0, abs=1e-7)


def test_kl_by_hand():
    q, q_ref = rows([1.0, 0.0]), rows([0.0, 0.0])
    pi = [E / (E + 1), 1 / (E + 1)]
    expected = sum(p * math.log(p / 0.5) for p in pi)
    assert kl_term(q, q_ref).item() == pytest.approx(expected, abs=1e-6)
    # temperature 2 halves the logits of both
    p = math.exp(0.5) / (math.exp(0.5) + 1)
    expected = p * math.log(p / 0.5) + (1 - p) * math.log((1 - p) / 0.5)
    assert kl_term(q, q_ref, temp=2.0).item() == pytest.approx(expected, abs=1e-6)
    # the mean over rows
    both = kl_term(torch.cat([q, q_ref]), torch.cat([q_ref, q_ref]))
    assert both.item() == pytest.approx(kl_term(q, q_ref).item() / 2, abs=1e-6)


def test_kl_over_legal_actions_only_is_finite_with_finite_gradients():
    q = rows([1.0, 0.0, -0.5], [2.0]).requires_grad_(True)  # row 1: a single legal action, KL 0
    q_ref = rows([0.0, 1.0, 0.0], [-7.0])
    loss = kl_term(q, q_ref)
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()
    assert torch.isfinite(q.grad).all()
    assert (q.grad[0, 3:] == 0).all() and (q.grad[1] == 0).all()


# --- learner_loss -------------------------------------------------------------------------------------------------

def _batch():
    torch.manual_seed(0)
    q = torch.randn(4, 46)
    masks = torch.rand(4, 46) < 0.5
    actions = torch.tensor([0, 1, 2, 3])
    masks[torch.arange(4), actions] = True
    q = q.masked_fill(~masks, -math.inf)
    args = (q, torch.randn(4, 4), actions, torch.randn(4), torch.tensor([0, 1, 2, 3]))
    return args, masks


def test_learner_loss_adds_the_weighted_policy_terms_only_when_on():
    (q, logits, actions, q_target, ranks), masks = _batch()
    q_ref = (q[:3] + torch.randn(3, 46)).masked_fill(~masks[:3], -math.inf)  # 3 online rows, 1 offline-mix row
    off = LossWeights.resolve(online=True, min_q_weight=5, online_min_q_weight=0, anchor_weight=0,
                              next_rank_weight=0.2, calibrated=False)
    t_off = learner_loss(q, logits, actions, q_target, ranks, masks=masks, online_rows=3, weights=off, q_ref=q_ref)
    assert t_off.pg_loss is None and t_off.kl_loss is None and t_off.anchor_loss is None
    old = (0.5 * F.mse_loss(q[torch.arange(4), actions], q_target) + F.cross_entropy(logits, ranks) * 0.2
           + t_off.offline_cql_loss * 5)
    assert t_off.total.item() == pytest.approx(old.item(), rel=1e-6)
    assert torch.equal(t_off.total, t_off.dqn_loss + t_off.next_rank_loss * 0.2 + t_off.offline_cql_loss * 5)

    on = LossWeights.resolve(online=True, min_q_weight=5, online_min_q_weight=0, anchor_weight=0,
                             next_rank_weight=0.2, calibrated=False, pg_weight=0.5, kl_weight=2.0, pg_temp=1.5)
    t_on = learner_loss(q, logits, actions, q_target, ranks, masks=masks, online_rows=3, weights=on, q_ref=q_ref)
    pg = pg_term(q[:3], actions[:3], q_target[:3], temp=1.5)  # the online rows only
    kl = kl_term(q[:3], q_ref, temp=1.5)
    assert t_on.anchor_loss is None  # anchor_weight 0: q_ref serves the KL term alone
    assert t_on.pg_loss.item() == pytest.approx(pg.item(), rel=1e-6)
    assert t_on.kl_loss.item() == pytest.approx(kl.item(), rel=1e-6) and kl.item() > 0
    assert t_on.total.item() == pytest.approx((t_off.total + 0.5 * pg + 2.0 * kl).item(), rel=1e-6)
    with pytest.raises(ValueError, match='q_ref'):
        learner_loss(q, logits, actions, q_target, ranks, masks=masks, online_rows=3, weights=on)


def test_policy_terms_are_never_offline():
    w = LossWeights.resolve(online=False, min_q_weight=5, online_min_q_weight=0, anchor_weight=1,
                            next_rank_weight=0.2, calibrated=False, pg_weight=0.5, kl_weight=2.0)
    assert w.pg == 0 and w.kl == 0 and w.anchor == 0


# --- config -------------------------------------------------------------------------------------------------------

def test_config_defaults(tmp_path):
    cfg = tiny_config_dict(tmp_path)
    path = tmp_path / 'c.toml'
    path.write_text(toml.dumps(cfg), encoding='utf-8')
    online = load_config(path)['online']
    assert (online['pg_weight'], online['pg_temp'], online['kl_weight']) == (0.0, 1.0, 0.0)


@pytest.mark.parametrize('key, value, message', [('pg_weight', -0.1, 'must be >= 0'),
                                                 ('kl_weight', -1.0, 'must be >= 0'),
                                                 ('pg_temp', 0.0, 'must be > 0')])
def test_bad_policy_keys_are_named(tmp_path, key, value, message):
    cfg = tiny_config_dict(tmp_path)
    cfg['online'][key] = value
    path = tmp_path / 'c.toml'
    path.write_text(toml.dumps(cfg), encoding='utf-8')
    with pytest.raises(ConfigError, match=re.escape(f'[online] {key} in {path} {message}')):
        load_config(path)


# --- the trainer --------------------------------------------------------------------------------------------------

def test_trainer_loads_the_reference_for_kl_alone_and_logs_the_policy_terms(tiny_config):
    """kl_weight > 0 with anchor_weight 0: the frozen pair is loaded, the anchor term stays off; trainee =
    baseline at the start, so the first KL is 0; loss/pg_loss and loss/kl_loss are written at the save."""
    config, _ = tiny_config
    config['online'].update(anchor_weight=0.0, kl_weight=1.0, pg_weight=0.5)
    write_baseline(config, config['baseline']['train']['state_file'], seed=3)
    write_baseline(config, config['control']['state_file'], seed=3)
    writer = FakeWriter()
    trainer = fake_trainer(config, writer=writer, drop_submits=True)
    assert trainer.anchor is not None
    assert (trainer.loss_weights.anchor, trainer.loss_weights.kl, trainer.loss_weights.pg) == (0.0, 1.0, 0.5)
    seen = []
    backward = trainer._backward
    trainer._backward = lambda *a, **k: seen.append(backward(*a, **k)) or seen[-1]
    args = random_batch(config['control']['batch_size'], 0, gamma_steps=torch.zeros(8, dtype=torch.int64),
                        reward=1.0)
    trainer.train_batch(*args)
    terms = seen[0][1]
    assert terms.anchor_loss is None and terms.pg_loss is not None
    assert terms.kl_loss.item() == pytest.approx(0.0, abs=1e-6)  # identical weights: pi == pi_ref
    for _ in range(config['control']['save_every'] - 1):
        trainer.train_batch(*args)
    tags = {t for t, _, _ in writer.scalars}
    assert {'loss/pg_loss', 'loss/kl_loss'} <= tags and 'loss/anchor_loss' not in tags


def test_trainer_without_policy_terms_loads_no_reference(tiny_config):
    config, _ = tiny_config
    config['online']['anchor_weight'] = 0.0
    write_baseline(config, config['control']['state_file'], seed=3)
    trainer = fake_trainer(config)
    assert trainer.anchor is None and trainer.loss_weights.pg == 0 and trainer.loss_weights.kl == 0


def test_trainer_warns_when_pg_runs_without_the_anchor(tiny_config, caplog):
    """pg_weight > 0 with anchor_weight 0: the warning that nothing bounds the untaken Q; none with the anchor."""
    import logging
    config, _ = tiny_config
    write_baseline(config, config['baseline']['train']['state_file'], seed=3)
    write_baseline(config, config['control']['state_file'], seed=3)
    for anchor, warned in ((0.0, True), (1.0, False)):
        config['online'].update(pg_weight=0.5, anchor_weight=anchor)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            fake_trainer(config)
        assert any('pg_weight 0.5 without anchor_weight' in r.getMessage() for r in caplog.records) == warned
