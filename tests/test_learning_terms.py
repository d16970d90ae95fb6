"""mortal/learning/loss.py extras (Cal-QL, anchor) and mortal/learning/diagnostics.py instruments, on values
worked by hand."""

import math

import pytest
import torch

from mortal.learning.diagnostics import BATCH_KEYS, Instruments, Probe, batch_q_stats
from mortal.learning.loss import anchor_term, cql_term

from conftest import FakeWriter, fake_trainer, random_batch, write_baseline

INF = math.inf


def small_batch():
    q = torch.tensor([[1.0, 2.0, -INF], [0.0, 0.0, 3.0]])
    masks = torch.isfinite(q)
    actions = torch.tensor([1, 2])
    return q, masks, actions


def test_cql_term_by_hand():
    q, _, actions = small_batch()
    # row 0: log(e + e^2) - 2; row 1: log(2 + e^3) - 3
    expected = ((math.log(math.e + math.e ** 2) - 2) + (math.log(2 + math.e ** 3) - 3)) / 2
    assert cql_term(q, actions).item() == pytest.approx(expected, rel=1e-6)


def test_calibrated_cql_clamps_push_down_at_the_return():
    q, _, actions = small_batch()
    g = torch.tensor([1.5, 3.5])
    # row 0: max(q, 1.5) = [1.5, 2] (the illegal action stays out); row 1: [3.5, 3.5, 3.5]; minus the taken q
    expected = ((math.log(math.exp(1.5) + math.exp(2)) - 2) + (3.5 + math.log(3) - 3)) / 2
    assert cql_term(q, actions, g, calibrated=True).item() == pytest.approx(expected, rel=1e-6)
    # a return below every Q changes nothing
    assert cql_term(q, actions, torch.tensor([-9.0, -9.0]), calibrated=True).item() == pytest.approx(
        cql_term(q, actions).item(), rel=1e-6)


def test_anchor_term_only_on_untaken_legal_actions():
    q, masks, actions = small_batch()
    q_ref = torch.tensor([[0.0, 50.0, 7.0], [2.0, 0.5, 9.0]])
    # untaken legal: (0,0): (1-0)^2 = 1; (1,0): (0-2)^2 = 4; (1,1): (0-0.5)^2 = 0.25; taken and illegal ignored
    assert anchor_term(q, q_ref, masks, actions).item() == pytest.approx((1 + 4 + 0.25) / 3)
    only_taken = torch.tensor([[False, True, False], [False, False, True]])
    assert anchor_term(q, q_ref, only_taken, actions).item() == 0.0


def test_anchor_gradient_leaves_the_taken_action_alone():
    q, masks, actions = small_batch()
    q = q.clone().requires_grad_(True)
    anchor_term(q, torch.zeros(2, 3), masks, actions).backward()
    assert q.grad[0, 1] == 0 and q.grad[1, 2] == 0
    assert q.grad[0, 0].item() == pytest.approx(2 * 1 / 3)  # d/dq (q^2)/3 at q = 1


def test_batch_q_stats_by_hand():
    q = torch.tensor([[1.0, 2.0, -INF], [0.0, 0.0, 3.0], [5.0, -INF, -INF]])
    masks = torch.isfinite(q)
    actions = torch.tensor([1, 0, 0])
    target = torch.tensor([1.5, 1.0, 4.0])
    stacked = batch_q_stats(q, masks, actions, target)  # sums, then counts, in BATCH_KEYS order
    s = dict(zip(BATCH_KEYS, zip(*stacked.tolist())))
    assert s['q_minus_target'] == pytest.approx((0.5 - 1 + 1, 3))
    assert s['q_minus_target_greedy'] == pytest.approx((1.5, 2))  # rows 0 and 2 took their argmax
    assert s['taken_greedy'] == pytest.approx((2, 3))
    assert s['q_gap'] == pytest.approx((1 + 3, 2))  # the one-action row is left out
    assert s['q_spread'] == pytest.approx((0.5 + math.sqrt(2), 2))  # std of [1, 2] and of [0, 0, 3]
    inst = Instruments(save_every=2, batch_size=3, device='cpu')
    inst.add(stacked, q[[0, 1, 2], actions], target, 3)
    inst.add(stacked, q[[0, 1, 2], actions], target, 3)
    writer = FakeWriter()
    inst.write(writer, 7, trained=(), device='cpu')
    assert inst.last['q_gap'] == pytest.approx(2.0) and ('diag/q_gap', pytest.approx(2.0), 7) in writer.scalars
    assert inst.last['taken_greedy'] == pytest.approx(2 / 3)
    inst.write(writer, 8, trained=(), device='cpu')
    assert inst.last == {}


def test_probe_builds_caches_and_measures_drift(tmp_path, fixture_logs):
    from mortal.model.networks import DQN, GRP, Brain
    files = [str(f) for f in fixture_logs]
    torch.manual_seed(0)
    grp = GRP(hidden_size=8, num_layers=1).eval()
    probe_file = str(tmp_path / 'probe.pth')
    probe = Probe.load_or_build(probe_file, version=3, globs=files, size=64)
    assert probe is not None and 0 < len(probe) <= 64
    assert probe.obs().shape[1:] == (934, 34) and probe.masks.shape[1:] == (46,)
    # built with no GRP, stored packed (13,900 bytes a row at v3, against 127,024 as floats); unpacked, every row is
    # one of the GRP-reward loader's float rows bit for bit (the loader shuffles: compared as a set)
    from mortal.data.dataloader import FileDatasetsIter
    loaded = {s[0].tobytes() for s in FileDatasetsIter(3, sorted(files), [6, 4, 2, 0], grp, file_batch_size=len(files))}
    expected = probe.obs()
    assert all(row.numpy().tobytes() in loaded for row in expected) and torch.equal(probe.obs(2, 5), expected[2:5])
    assert probe.packed.dtype == torch.uint8 and probe.packed.shape == (len(probe), 13900)
    again = Probe.load_or_build(probe_file, version=3, globs=[], size=64)
    assert torch.equal(again.packed, probe.packed) and torch.equal(again.ranks, probe.ranks)  # read back, not rebuilt
    # a probe file of float rows (before they were packed) is read, packed and written again, with the same rows
    torch.save({'version': 3, 'obs': expected, 'masks': probe.masks, 'ranks': probe.ranks}, probe_file)
    old = Probe.load_or_build(probe_file, version=3, globs=[], size=64)
    assert torch.equal(old.obs(), expected) and 'obs' not in torch.load(probe_file)

    brain, dqn = Brain(version=3, conv_channels=16, num_blocks=1).eval(), DQN(version=3).eval()
    probe.set_baseline(brain, dqn, torch.device('cpu'))
    assert probe.measure(brain, dqn, None, torch.device('cpu')) == (0.0, None)
    # plant k disagreements: drift is exactly k / N
    k = 5
    probe.baseline_greedy[:k] = (probe.baseline_greedy[:k] + 1) % 46
    assert probe.measure(brain, dqn, None, torch.device('cpu'))[0] == pytest.approx(k / len(probe))
    from mortal.model.networks import AuxNet
    aux = AuxNet((4,))
    with torch.no_grad():
        for p in aux.parameters():
            p.zero_()
    # zero logits: cross entropy ln 4 whatever the labels
    drift, loss = probe.measure(brain, dqn, aux, torch.device('cpu'))
    assert drift == pytest.approx(k / len(probe)) and loss == pytest.approx(math.log(4), rel=1e-6)


@pytest.mark.parametrize('field, bad', [
    ('ranks', lambda t: torch.full_like(t, 9)),  # a rank out of 0..3: cross entropy's IndexError at a save
    ('ranks', lambda t: t.float()),
    ('ranks', lambda t: t[:-1]),
    ('packed', lambda t: t[:, :10]),  # another row width: unpack's ValueError, the drift switched off for good
    ('packed', lambda t: t[:0]),
    ('masks', lambda t: t[:, :40]),
    ('masks', lambda t: torch.zeros_like(t)),  # no legal action: argmax of all -inf
])
def test_a_probe_with_a_damaged_field_is_rebuilt_and_named(tmp_path, fixture_logs, caplog, field, bad):
    files = [str(f) for f in fixture_logs]
    probe_file = str(tmp_path / 'probe.pth')
    good = Probe.load_or_build(probe_file, version=3, globs=files, size=64)
    data = torch.load(probe_file)
    data[field] = bad(data[field])
    torch.save(data, probe_file)
    with caplog.at_level('WARNING', logger='mortal.diagnostics'):
        again = Probe.load_or_build(probe_file, version=3, globs=files, size=64)
    assert f'probe {probe_file} unreadable ({field}: expected' in caplog.text
    # rebuilt from the logs (the loader shuffles, so another sample of them) and written again
    assert len(again) == len(good) and again.packed.shape[1] == 13900 and again.masks.shape == (len(good), 46)
    assert set(again.ranks.tolist()) <= {0, 1, 2, 3} and bool(again.masks.any(-1).all())
    assert torch.equal(torch.load(probe_file)['ranks'], again.ranks)


def test_probe_without_logs_is_none(tmp_path):
    assert Probe.load_or_build(str(tmp_path / 'p.pth'), version=3, globs=[str(tmp_path / 'none*.gz')],
                               size=8) is None


def _random_batch(n, seed=0):
    """A train_batch argument tuple of ``n`` random v3 samples: reward 1, done at once, ranks 0-3 in turn."""
    return random_batch(n, seed, gamma_steps=torch.zeros(n, dtype=torch.int64), reward=1.0)


def test_online_trainer_with_anchor_and_calibrated_cql_logs_every_term(tiny_config):
    """Trainee = baseline at the start, so the first anchor loss is exactly 0; the configured CQL weight is kept
    online; the diag/* tags and loss/anchor_loss are written at each save."""
    config, _ = tiny_config
    config['online']['anchor_weight'] = 1.0
    config['online']['counterfactual_weight'] = 0.5
    config['cql'].update(online_min_q_weight=0.5, calibrated=True)
    config['optim']['scheduler'].update(peak=1e-2, final=1e-2)
    write_baseline(config, config['baseline']['train']['state_file'], seed=3)
    write_baseline(config, config['control']['state_file'], seed=3)
    writer = FakeWriter()
    trainer = fake_trainer(config, writer=writer, drop_submits=True)
    assert trainer.anchor is not None and trainer.loss_weights.cql == 0.5
    assert trainer.loss_weights.counterfactual == 0.5
    args = _random_batch(config['control']['batch_size'])
    n = config['control']['batch_size']
    # the counterfactual columns: every other row has a branch whose alternative is a legal action not taken
    cf_actions = torch.full((n,), -1, dtype=torch.int64)
    for i in range(0, n, 2):
        cf_actions[i] = next(a for a in torch.nonzero(args[2][i]).flatten().tolist() if a != int(args[1][i]))
    args = (*args, cf_actions, torch.full((n,), 0.5))
    trainer.train_batch(*args)
    assert trainer.stats['anchor_loss'] == 0.0  # identical weights: q == q_ref
    assert trainer.stats['cql_loss'] > 0
    assert trainer.stats['counterfactual_loss'] > 0
    for _ in range(config['control']['save_every'] - 1):
        trainer.train_batch(*args)
    tags = {t for t, _, _ in writer.scalars}
    assert {'loss/anchor_loss', 'loss/cql_loss', 'loss/counterfactual_loss', 'diag/q_minus_target', 'diag/q_gap',
            'diag/q_spread', 'diag/taken_greedy'} <= tags
    anchor = [v for t, v, _ in writer.scalars if t == 'loss/anchor_loss']
    assert anchor[0] > 0  # the trainee has moved away from the frozen baseline after the first step


def test_summarize_pairs_deals_by_nonce():
    from mortal.play.evaluation import SUMMARY_FIELDS, format_summary, summarize
    units = {11: [1, 2, 3, 4], 10: [1, 1, 2, 2]}
    assert set(summarize(units)) == set(SUMMARY_FIELDS)  # the fields bench/learning.py's report checks
    ref = {10: [4, 4, 4, 4], 11: [2, 2, 3, 3]}
    s = summarize(units, ref)
    # per-deal mean ranks: nonce 10: 1.5 vs 4.0, nonce 11: 2.5 vs 2.5 -> diffs -2.5, 0
    assert s['deals'] == 2 and s['games'] == 8
    assert s['avg_rank'] == pytest.approx(2.0)
    assert s['paired_diff'] == pytest.approx(-1.25)
    assert s['paired_diff_ci'] == pytest.approx(1.959963984540054 * math.sqrt(2 * 1.25 ** 2) / math.sqrt(2))
    # display pts 90/45/0/-135: nonce 10 -> (90+90+45+45)/4 = 67.5, nonce 11 -> 0
    assert s['avg_pt'] == pytest.approx(33.75)
    assert format_summary(s).startswith('2.000 ± ') and format_summary(s).endswith('(8 games; unreliable: 2 sets)')
    # a deal the reference lacks (its deal dropped for a failed game) is left out of the pairing and counted
    s = summarize(units, {10: [4, 4, 4, 4]})
    assert s['deals'] == 2 and s['paired_diff'] == pytest.approx(-2.5) and s['unpaired'] == 1
    assert '(1 deals unpaired)' in format_summary(s)
    with pytest.raises(KeyError):
        summarize(units, {12: [1, 1, 1, 1]})


@pytest.mark.slow
def test_offline_mix_appends_offline_rows_with_the_offline_loss(tiny_config, fixture_logs, monkeypatch):
    """[online] offline_batch_size: the offline rows share the MSE (one mean over all rows) and carry the offline
    CQL term at [cql] min_q_weight; the online-only instruments see the online rows alone."""
    from mortal import train as tr
    config, _ = tiny_config
    from mortal.model.networks import GRP
    config['control']['batch_size'] = 32  # the 32 online rows below
    config['online']['offline_batch_size'] = 8
    config['dataset']['globs'] = [str(f) for f in fixture_logs]
    torch.save({'model': GRP(**config['grp']['network']).state_dict()}, config['grp']['state_file'])
    write_baseline(config, config['control']['state_file'], seed=4)
    writer = FakeWriter()
    trainer = fake_trainer(config, writer=writer, drop_submits=True)
    online, offline = _random_batch(config['control']['batch_size'], seed=1), _random_batch(8, seed=2)
    # reward 1 online, 3 offline: a model whose Q is the same c everywhere would have MSE mean((c - t)^2) over 40
    offline = offline[:4] + (torch.full((8,), 3.0, dtype=torch.float64), offline[5])
    trainer.offline_stream = iter([offline])
    seen = []
    monkeypatch.setattr(tr, 'batch_q_stats', lambda q_out, masks, actions, q_target: seen.append(
        (q_out.shape[0], q_target.clone())) or torch.zeros(2, 5))
    with torch.no_grad():
        trainer.mortal.eval(), trainer.dqn.eval()
        all_obs = torch.cat((online[0], offline[0]))
        all_masks = torch.cat((online[2], offline[2]))
        q_out = trainer.dqn(trainer.mortal(all_obs), all_masks)
        all_actions = torch.cat((online[1], offline[1]))
        q = q_out[torch.arange(40), all_actions]
        target = torch.cat((torch.ones(32), torch.full((8,), 3.0)))
        want_mse = 0.5 * ((q - target) ** 2).mean().item()
        want_cql = (q_out[32:].logsumexp(-1) - q[32:]).mean().item()
    trainer.mortal.train(), trainer.dqn.train()
    trainer.mortal.freeze_bn(True)
    trainer.train_batch(*online)
    assert trainer.stats['dqn_loss'] == pytest.approx(want_mse, rel=1e-4)
    assert trainer.stats['offline_cql_loss'] == pytest.approx(want_cql, rel=1e-4)
    assert trainer.stats['cql_loss'] == 0.0  # no online CQL (Mortal)
    assert len(seen) == 1 and seen[0][0] == 32 and torch.equal(seen[0][1], torch.ones(32))


@pytest.mark.slow
def test_offline_batches_loop_over_the_offline_logs(tiny_config, fixture_logs):
    """The stream yields full batches of offline_batch_size from the real logs and starts a new pass when one
    ends; a dataset without one full batch is a ValueError naming the key."""
    from mortal.data.dataloader import iter_full_batches
    from mortal.model.networks import GRP
    config, _ = tiny_config
    config['online']['offline_batch_size'] = 64
    config['dataset']['globs'] = [str(fixture_logs[0])]
    torch.save({'model': GRP(**config['grp']['network']).state_dict()}, config['grp']['state_file'])
    write_baseline(config, config['control']['state_file'], seed=4)
    trainer = fake_trainer(config)
    first_pass = sum(1 for _ in iter_full_batches(iter(trainer.data_loader(
        [str(fixture_logs[0])], [], batch_size=64, num_workers=0)), 64))
    assert first_pass >= 1
    batches = [next(trainer.offline_stream) for _ in range(first_pass + 1)]  # crosses into a second pass
    for obs, actions, masks, steps_to_done, rewards, ranks, cf_actions, cf_deltas in batches:
        assert (cf_actions == -1).all() and (cf_deltas == 0).all()  # offline logs: no counterfactual branch
        assert obs.shape == (64, 13900) and obs.dtype == torch.uint8  # packed rows (mortal.features.packed_obs)
        assert masks.shape == (64, 46) and ranks.shape == (64,)
        assert masks[torch.arange(64), actions].all()

    # too few samples for one batch: the Trainer fails at start-up, naming the key and the file index
    config['online']['offline_batch_size'] = 60000
    with pytest.raises(ValueError, match=r'offline_batch_size = 60000: the logs of \[dataset\] file_index'):
        fake_trainer(config)


def test_file_index_errors_name_the_key_and_an_empty_list_is_not_cached(tmp_path):
    from mortal.data.offline_data import build_file_list, load_player_names
    from mortal.config_schema import Dataset
    # the typed [dataset] with the two keys the index reads
    ds = Dataset.model_construct(file_index=str(tmp_path / 'index.pth'), globs=[str(tmp_path / 'none' / '*.json.gz')])
    assert build_file_list(ds, set()) == []
    assert not (tmp_path / 'index.pth').exists()  # fixing the globs later takes effect
    (tmp_path / 'index.pth').write_bytes(b'not a torch file')
    with pytest.raises(ValueError, match=r'\[dataset\] file_index .*index.pth is not a file index'):
        build_file_list(ds, set())
    torch.save({'other': 1}, tmp_path / 'index.pth')
    with pytest.raises(ValueError, match='is not a file index'):
        build_file_list(ds, set())
    with pytest.raises(ValueError, match=r'player_names_files: cannot read .*missing.txt'):
        load_player_names([str(tmp_path / 'missing.txt')])


def test_a_copied_work_dirs_file_index_is_rebuilt_from_its_own_globs(tmp_path, caplog):
    """A work dir copied with every path of the config rewritten: its cached file index still lists the original's
    logs, and is rebuilt from the copy's globs (issue 35, case 7); the same for [grp.dataset]."""
    import logging
    import shutil
    from mortal.config_schema import Dataset
    from mortal.data.offline_data import build_file_list
    from mortal.train_grp import build_file_index
    original = tmp_path / 'original'
    (original / 'logs').mkdir(parents=True)
    for name in ('a.json.gz', 'b.json.gz'):
        (original / 'logs' / name).write_bytes(b'x')

    def dataset(root):
        return Dataset.model_construct(file_index=str(root / 'index.pth'), globs=[str(root / 'logs' / '*.json.gz')])

    assert build_file_list(dataset(original), set()) == [str(original / 'logs' / n) for n in ('b.json.gz',
                                                                                              'a.json.gz')]
    build_file_index([str(original / 'logs' / 'a*')], [str(original / 'logs' / 'b*')], str(original / 'grp.pth'))
    copy = tmp_path / 'copy'
    shutil.copytree(original, copy)
    with caplog.at_level(logging.INFO):
        files = build_file_list(dataset(copy), set())
        grp_files = build_file_index([str(copy / 'logs' / 'a*')], [str(copy / 'logs' / 'b*')], str(copy / 'grp.pth'))
    assert files == [str(copy / 'logs' / 'b.json.gz'), str(copy / 'logs' / 'a.json.gz')]
    assert grp_files == ([str(copy / 'logs' / 'a.json.gz')], [str(copy / 'logs' / 'b.json.gz')])
    assert f'file_index {copy / "index.pth"} is rebuilt: it was built from globs' in caplog.text
    assert torch.load(copy / 'index.pth')['globs'] == [str(copy / 'logs' / '*.json.gz')]
    # the same globs: the cache is read, not rebuilt
    (copy / 'logs' / 'c.json.gz').write_bytes(b'x')
    assert build_file_list(dataset(copy), set()) == files
