"""Tests of mortal.model.networks: Mortal key layout, freeze_bn, dueling DQN, GRP."""

from itertools import permutations

import pytest
import torch
from torch import nn

from mortal.model.networks import DQN, GRP, AuxNet, Brain

C = 16  # conv_channels of the small test config; channel attention hidden = 16 // 16 = 1
B = 2  # num_blocks
IN = {1: 938, 2: 942, 3: 934, 4: 1012}  # obs channels per version (Mortal consts.rs)


def _bn(prefix):
    return {
        f"{prefix}.weight": (C,),
        f"{prefix}.bias": (C,),
        f"{prefix}.running_mean": (C,),
        f"{prefix}.running_var": (C,),
        f"{prefix}.num_batches_tracked": (),
    }


def _ca(prefix):
    return {
        f"{prefix}.ca.shared_mlp.0.weight": (1, C),
        f"{prefix}.ca.shared_mlp.0.bias": (1,),
        f"{prefix}.ca.shared_mlp.2.weight": (C, 1),
        f"{prefix}.ca.shared_mlp.2.bias": (C,),
    }


def mortal_brain_keys(version, in_channels=None):
    """Key -> shape of Mortal's Brain(conv_channels=16, num_blocks=2, version), written out
    from Mortal's mortal/model.py: ResNet.net = Sequential(stem conv, [BN, act,] blocks,
    [BN, act,] conv(C->32, bias), act, Flatten, Linear(1088, 1024))."""
    in_ch = IN[version] if in_channels is None else in_channels
    keys = {"encoder.net.0.weight": (C, in_ch, 3)}
    if version == 1:
        # 0 conv, 1 BN, 2 ReLU, 3-4 blocks, 5 conv, 6 ReLU, 7 Flatten, 8 Linear
        keys.update(_bn("encoder.net.1"))
        for b in ("encoder.net.3", "encoder.net.4"):
            keys[f"{b}.res_unit.0.weight"] = (C, C, 3)
            keys.update(_bn(f"{b}.res_unit.1"))
            keys[f"{b}.res_unit.3.weight"] = (C, C, 3)
            keys.update(_bn(f"{b}.res_unit.4"))
            keys.update(_ca(b))
    else:
        # 0 conv, 1-2 blocks, 3 BN, 4 Mish, 5 conv, 6 Mish, 7 Flatten, 8 Linear
        for b in ("encoder.net.1", "encoder.net.2"):
            keys.update(_bn(f"{b}.res_unit.0"))
            keys[f"{b}.res_unit.2.weight"] = (C, C, 3)
            keys.update(_bn(f"{b}.res_unit.3"))
            keys[f"{b}.res_unit.5.weight"] = (C, C, 3)
            keys.update(_ca(b))
        keys.update(_bn("encoder.net.3"))
    keys.update({
        "encoder.net.5.weight": (32, C, 3),
        "encoder.net.5.bias": (32,),
        "encoder.net.8.weight": (1024, 32 * 34),
        "encoder.net.8.bias": (1024,),
    })
    if version == 1:
        keys.update({
            "latent_net.0.weight": (512, 1024),
            "latent_net.0.bias": (512,),
            "mu_head.weight": (512, 512),
            "mu_head.bias": (512,),
            "logsig_head.weight": (512, 512),
            "logsig_head.bias": (512,),
        })
    return keys


MORTAL_DQN_KEYS = {
    1: {"v_head.weight": (1, 512), "v_head.bias": (1,), "a_head.weight": (46, 512), "a_head.bias": (46,)},
    2: {"v_head.0.weight": (512, 1024), "v_head.0.bias": (512,), "v_head.2.weight": (1, 512), "v_head.2.bias": (1,),
        "a_head.0.weight": (512, 1024), "a_head.0.bias": (512,), "a_head.2.weight": (46, 512), "a_head.2.bias": (46,)},
    3: {"v_head.0.weight": (256, 1024), "v_head.0.bias": (256,), "v_head.2.weight": (1, 256), "v_head.2.bias": (1,),
        "a_head.0.weight": (256, 1024), "a_head.0.bias": (256,), "a_head.2.weight": (46, 256), "a_head.2.bias": (46,)},
    4: {"net.weight": (47, 1024), "net.bias": (47,)},
}


def _random_state(layout, seed):
    """A state dict with Mortal's names/shapes and recognisable random values."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in layout.items():
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(123, dtype=torch.int64)
        elif name.endswith("running_var"):
            state[name] = torch.rand(shape, generator=gen) + 0.5
        else:
            state[name] = torch.randn(shape, generator=gen)
    return state


def _assert_loaded(module, state):
    own = module.state_dict()
    for name, value in state.items():
        assert torch.equal(own[name], value.to(own[name].dtype)), name


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_brain_loads_mortal_layout_strict(version):
    layout = mortal_brain_keys(version)
    brain = Brain(conv_channels=C, num_blocks=B, version=version)
    got = {k: tuple(v.shape) for k, v in brain.state_dict().items()}
    assert got == layout
    state = _random_state(layout, seed=version)
    brain.load_state_dict(state, strict=True)
    _assert_loaded(brain, state)


@pytest.mark.parametrize("version,oracle_ch", [(1, 211), (3, 217), (4, 217)])
def test_oracle_brain_input_channels(version, oracle_ch):
    layout = mortal_brain_keys(version, in_channels=IN[version] + oracle_ch)
    brain = Brain(conv_channels=C, num_blocks=B, version=version, is_oracle=True)
    brain.load_state_dict(_random_state(layout, seed=7), strict=True)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_dqn_and_aux_load_mortal_layout_strict(version):
    dqn = DQN(version=version)
    assert {k: tuple(v.shape) for k, v in dqn.state_dict().items()} == MORTAL_DQN_KEYS[version]
    state = _random_state(MORTAL_DQN_KEYS[version], seed=10 + version)
    dqn.load_state_dict(state, strict=True)
    _assert_loaded(dqn, state)

    aux = AuxNet((4,))
    aux_state = {"net.weight": torch.randn(4, 1024)}
    aux.load_state_dict(aux_state, strict=True)
    _assert_loaded(aux, aux_state)


def test_grp_loads_mortal_layout_strict():
    h = 64
    layout = {}
    for layer, in_size in ((0, 7), (1, h)):
        layout[f"rnn.weight_ih_l{layer}"] = (3 * h, in_size)
        layout[f"rnn.weight_hh_l{layer}"] = (3 * h, h)
        layout[f"rnn.bias_ih_l{layer}"] = (3 * h,)
        layout[f"rnn.bias_hh_l{layer}"] = (3 * h,)
    layout.update({"fc.0.weight": (128, 128), "fc.0.bias": (128,), "fc.2.weight": (24, 128), "fc.2.bias": (24,)})
    grp = GRP(hidden_size=64, num_layers=2)
    own = grp.state_dict()
    assert {k: tuple(v.shape) for k, v in own.items()} == {**layout, "perms": (24, 4), "perms_t": (4, 24)}
    state = {k: torch.randn(s, dtype=torch.float64) for k, s in layout.items()}
    state["perms"] = torch.tensor(list(permutations(range(4))))
    state["perms_t"] = state["perms"].t()
    grp.load_state_dict(state, strict=True)
    _assert_loaded(grp, state)
    assert all(p.dtype == torch.float64 for p in grp.parameters())


@pytest.mark.parametrize("version,bn_eps,actv", [(1, 1e-5, nn.ReLU), (2, 1e-5, nn.Mish), (3, 1e-3, nn.Mish),
                                                  (4, 1e-3, nn.Mish)])
def test_brain_version_hyperparameters(version, bn_eps, actv):
    brain = Brain(conv_channels=C, num_blocks=B, version=version)
    bns = [m for m in brain.modules() if isinstance(m, nn.BatchNorm1d)]
    assert len(bns) == 1 + 2 * B
    assert all(m.eps == bn_eps and m.momentum == 0.01 for m in bns)
    assert isinstance(brain.encoder.net[2 if version == 1 else 4], actv)


@pytest.mark.parametrize("version,out", [(1, None), (2, 1024), (3, 1024), (4, 1024)])
def test_brain_output_shapes(version, out):
    torch.manual_seed(0)
    brain = Brain(conv_channels=C, num_blocks=B, version=version).eval()
    obs = torch.randn(3, IN[version], 34)
    with torch.no_grad():
        res = brain(obs)
    if version == 1:
        mu, logsig = res
        assert mu.shape == (3, 512) and logsig.shape == (3, 512)
        phi = mu
    else:
        assert res.shape == (3, out) and res.dtype == torch.float32
        phi = res
    q = DQN(version=version)(phi, torch.ones(3, 46, dtype=torch.bool))
    assert q.shape == (3, 46) and torch.isfinite(q).all()


def test_brain_rejects_bad_version_and_missing_oracle():
    with pytest.raises(ValueError):
        Brain(conv_channels=C, num_blocks=B, version=5)
    brain = Brain(conv_channels=C, num_blocks=1, version=3, is_oracle=True)
    with pytest.raises(ValueError, match="invisible_obs"):
        brain(torch.zeros(1, 934, 34))


def _bn_stats(brain):
    return {k: v.clone() for k, v in brain.state_dict().items()
            if "running_" in k or "num_batches_tracked" in k}


def _bn_params(brain):
    return [(m.weight.detach().clone(), m.bias.detach().clone())
            for m in brain.modules() if isinstance(m, nn.BatchNorm1d)]


def _one_step(brain, seed=0):
    torch.manual_seed(seed)
    obs = torch.randn(4, 934, 34)
    opt = torch.optim.AdamW(brain.parameters(), lr=1e-2)
    loss = brain(obs).square().mean()
    loss.backward()
    opt.step()


@pytest.mark.parametrize("frozen", [True, False])
def test_freeze_bn_keeps_running_stats_but_trains_affine(frozen):
    torch.manual_seed(1)
    brain = Brain(conv_channels=C, num_blocks=B, version=3)
    brain.freeze_bn(frozen)
    brain.train()
    bns = [m for m in brain.modules() if isinstance(m, nn.BatchNorm1d)]
    assert all(m.training is (not frozen) for m in bns)
    assert brain.training and brain.encoder.net[0].training
    stats_before, params_before = _bn_stats(brain), _bn_params(brain)
    _one_step(brain)
    stats_after, params_after = _bn_stats(brain), _bn_params(brain)
    stats_same = all(torch.equal(stats_before[k], stats_after[k]) for k in stats_before)
    assert stats_same is frozen  # the unfrozen control shows the check can fail
    for (w0, b0), (w1, b1) in zip(params_before, params_after):
        assert not torch.equal(w0, w1) and not torch.equal(b0, b1)


def test_freeze_bn_survives_train_call_and_can_be_released():
    brain = Brain(conv_channels=C, num_blocks=1, version=2).freeze_bn(True)
    brain.eval().train()
    bns = [m for m in brain.modules() if isinstance(m, nn.BatchNorm1d)]
    assert not any(m.training for m in bns)
    # a parent container's .train() recurses into Brain.train
    nn.Sequential(brain).train()
    assert not any(m.training for m in bns)
    brain.freeze_bn(False)
    assert all(m.training for m in bns)


def test_dqn_dueling_masked_mean_by_hand():
    dqn = DQN(version=4)
    with torch.no_grad():
        dqn.net.weight.zero_()
        bias = torch.full((47,), 100.0)  # illegal advantages are huge: must not enter the mean
        bias[0] = 1.0  # v
        bias[1 + 0] = 2.0  # a[0]
        bias[1 + 3] = 4.0  # a[3]
        bias[1 + 45] = -3.0  # a[45] (pass)
        dqn.net.bias.copy_(bias)
    mask = torch.zeros(1, 46, dtype=torch.bool)
    mask[0, [0, 3, 45]] = True
    q = dqn(torch.randn(1, 1024), mask)[0]
    # mean over legal a = (2 + 4 - 3) / 3 = 1; q = v + a - 1
    assert q[0].item() == 2.0 and q[3].item() == 4.0 and q[45].item() == -3.0
    illegal = torch.ones(46, dtype=torch.bool)
    illegal[[0, 3, 45]] = False
    assert torch.all(q[illegal] == -torch.inf)


def test_dqn_v1_masked_mean_by_hand():
    dqn = DQN(version=1)
    with torch.no_grad():
        for lin in (dqn.v_head, dqn.a_head):
            lin.weight.zero_()
        dqn.v_head.bias.fill_(-0.5)
        dqn.a_head.bias.copy_(torch.arange(46, dtype=torch.float32))
    mask = torch.zeros(2, 46, dtype=torch.bool)
    mask[0, [10, 20]] = True  # mean 15
    mask[1, 44] = True  # a single legal action gets exactly v
    q = dqn(torch.zeros(2, 512), mask)
    assert q[0, 10].item() == -5.5 and q[0, 20].item() == 4.5
    assert q[1, 44].item() == -0.5
    assert torch.isinf(q[0, 0]) and q[0, 0] < 0 and (q[1] == -torch.inf).sum() == 45


def test_aux_net_splits_dims():
    aux = AuxNet((4, 2))
    out = aux(torch.randn(3, 1024))
    assert [o.shape for o in out] == [(3, 4), (3, 2)]


def test_grp_forward_padding_does_not_leak():
    torch.manual_seed(5)
    grp = GRP()
    short = torch.randn(2, 7, dtype=torch.float64)
    long = torch.randn(6, 7, dtype=torch.float64)
    batched = grp([short, long])
    assert batched.shape == (2, 24) and batched.dtype == torch.float64
    assert torch.allclose(batched[0], grp([short])[0], atol=1e-12)
    assert torch.allclose(batched[1], grp([long])[0], atol=1e-12)


def test_grp_calc_matrix_is_doubly_stochastic():
    torch.manual_seed(6)
    grp = GRP()
    m = grp.calc_matrix(torch.randn(5, 24, dtype=torch.float64) * 3)
    assert m.shape == (5, 4, 4) and m.dtype == torch.float64
    ones = torch.ones(5, 4, dtype=torch.float64)
    assert torch.allclose(m.sum(-1), ones) and torch.allclose(m.sum(-2), ones)
    # all mass on permutation 16 = (2, 3, 0, 1): seat 0 third, seat 1 fourth, seat 2 first, seat 3 second
    logits = torch.full((1, 24), -1e4, dtype=torch.float64)
    logits[0, 16] = 0.0
    expected = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.float64)
    assert torch.allclose(grp.calc_matrix(logits)[0], expected)
    # uniform logits: every seat has every rank with 6/24
    assert torch.allclose(grp.calc_matrix(torch.zeros(1, 24, dtype=torch.float64)), torch.full((1, 4, 4), 0.25,
                                                                                              dtype=torch.float64))


def test_grp_get_label_by_hand():
    grp = GRP()
    ranks = torch.tensor([[0, 1, 2, 3], [1, 0, 2, 3], [2, 3, 0, 1], [3, 2, 1, 0]])
    # lexicographic permutation index, worked by hand: 0, 1*6 + 0 = 6, 2*6 + 2*2 = 16, 23
    assert grp.get_label(ranks).tolist() == [0, 6, 16, 23]
    perms = list(permutations(range(4)))
    assert [perms.index(tuple(r)) for r in ranks.tolist()] == [0, 6, 16, 23]
    assert grp.get_label(ranks.to(torch.uint8)).dtype == torch.int64
    with pytest.raises(ValueError, match="permutation"):
        grp.get_label(torch.tensor([[0, 0, 1, 2]]))
