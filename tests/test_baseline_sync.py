"""The baseline served by the server: the trainer submits ``[baseline.train]``, a client without that file (another
machine) fetches and installs it, and follows a rotation by its digest (``[baseline.train] from_server``)."""

import glob
import hashlib
import logging
import os
import struct

import pytest
import torch

from mortal import client as cl
from mortal.net import replay_store, signature, wire
from mortal.model.checkpoint import load_model_pair

from conftest import fake_trainer, load_tiny_config, start_param_server, stop_server, write_baseline

ARCH = {'version': 3, 'conv_channels': 16, 'num_blocks': 1}  # tiny_config's model


def test_baseline_digest_by_hand():
    mortal = {'w': torch.tensor([1.0, 2.0])}
    dqn = {'b': torch.tensor([3])}
    expected = hashlib.sha256(b'mortal/w:torch.float32:[2];' + struct.pack('<2f', 1.0, 2.0)
                              + b'dqn/b:torch.int64:[1];' + struct.pack('<q', 3)).hexdigest()
    assert wire.baseline_digest(mortal, dqn) == expected
    # the values decide, not the storage: another key order, a non-contiguous view
    wide = torch.tensor([[1.0, 9.0], [2.0, 9.0]])[:, 0]
    assert not wide.is_contiguous()
    assert wire.baseline_digest({'w': wide}, dqn) == expected
    assert wire.baseline_digest({'w': torch.tensor([1.0, 2.5])}, dqn) != expected
    assert wire.baseline_digest(dqn, mortal) != expected  # which part a tensor belongs to counts too


def test_arch_and_digest_checks_name_the_field():
    assert wire.check_baseline_arch({**ARCH, 'extra': 1}) == ARCH
    for bad, field in (({**ARCH, 'version': 5}, 'arch.version'), ({**ARCH, 'num_blocks': True}, 'arch.num_blocks'),
                       ({'version': 3}, 'arch.conv_channels'), ([], "'arch'")):
        with pytest.raises(ValueError, match=field):
            wire.check_baseline_arch(bad)
    assert wire.check_digest('0f' * 32) == '0f' * 32
    for bad in ('0F' * 32, '0f' * 31, 7, 'g' * 64):
        with pytest.raises(ValueError, match='baseline_digest'):
            wire.check_digest(bad)


def _submission(mortal=None, dqn=None, **fields):
    mortal = mortal if mortal is not None else {'w': torch.ones(2)}
    dqn = dqn if dqn is not None else {'b': torch.zeros(1)}
    return {'type': 'submit_baseline', 'mortal': wire.pack_state_dict(mortal), 'dqn': wire.pack_state_dict(dqn),
            'arch': dict(ARCH), 'baseline_version': 2, 'baseline_digest': wire.baseline_digest(mortal, dqn),
            **fields}


def test_server_stores_serves_and_names_the_baseline(tmp_path):
    store = replay_store.ReplayStore(tmp_path / 'buffer', tmp_path / 'drain', 4)
    store.reset_dirs()
    assert store.handle({'type': 'get_baseline'}) == {'status': 'empty baseline'}
    msg = _submission()
    assert store.handle(msg) == {'status': 'ok', 'baseline_version': 2}
    got = store.handle({'type': 'get_baseline'})
    assert got == {'status': 'ok', **{k: msg[k] for k in ('mortal', 'dqn', 'arch', 'baseline_version',
                                                          'baseline_digest')}}
    m = wire.pack_state_dict({'w': torch.ones(1)})
    store.handle({'type': 'submit_param', 'mortal': m, 'dqn': m})
    reply = store.handle({'type': 'get_param', 'param_version': -1})
    assert reply['baseline_digest'] == msg['baseline_digest'] and reply['baseline_version'] == 0  # play settings
    # invalid submissions are bad requests naming the field, and leave the stored baseline alone
    for bad, reason in (({'arch': {**ARCH, 'conv_channels': 0}}, 'arch.conv_channels'),
                        ({'baseline_digest': 'AB' * 32}, 'baseline_digest'),
                        ({'baseline_version': -1}, "'baseline_version' must be >= 0"),
                        ({'mortal': b'junk'}, 'invalid safetensors'),
                        ({'dqn': wire.pack_state_dict({})}, "'dqn' is an empty state dict")):
        with pytest.raises((replay_store.BadRequest, wire.ProtocolError), match=reason):
            store.handle({**msg, **bad})
    assert store.handle({'type': 'get_baseline'}) == got


class Served:
    """A live server, and a trainer (fake test player) that submits to it."""

    def __init__(self, tmp_path):
        # the server binds any free port first and the config names it: a port picked free and bound later could
        # be taken meanwhile (tests run in parallel)
        self.server = start_param_server(tmp_path, 64, timeout=10)
        self.port = self.server.server_address[1]
        self.config, _ = load_tiny_config(tmp_path, port=self.port)
        self.baseline = self.config['baseline']['train']['state_file']
        write_baseline(self.config, self.baseline, seed=0)
        self.store = self.server.store
        self.remote = wire.Remote('127.0.0.1', self.port, timeout=10)
        self.trainer = fake_trainer(self.config, remote=self.remote)

    def remote_config(self, tmp_path):
        """The config of a client on another machine: its own (not yet existing) baseline file."""
        other = {**self.config, 'baseline': {**self.config['baseline'],
                                             'train': {**self.config['baseline']['train'],
                                                       'state_file': str(tmp_path / 'remote' / 'baseline.pth')}}}
        return other

    def param_reply(self):
        return self.remote.request({'type': 'get_param', 'param_version': -1, 'server_id': None})


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    yield s
    stop_server(s.server)


def weights_of(state_file):
    state = torch.load(state_file, weights_only=True)
    return state['mortal'], state['current_dqn']


@pytest.mark.slow
def test_a_client_on_another_machine_fetches_the_baseline_and_follows_a_rotation(tmp_path, served, caplog,
                                                                                 monkeypatch):
    trainer = served.trainer
    with caplog.at_level(logging.INFO):
        trainer.sync_baseline()
    first = wire.baseline_digest(*weights_of(served.baseline))
    assert served.store.baseline['baseline_digest'] == first == trainer.guard['baseline_digest']
    assert served.store.baseline['arch'] == ARCH and served.store.baseline['baseline_version'] == 0
    trainer.save()  # a learner that has run: its state_file holds the guard entry
    trainer.submit_param(is_idle=True)
    config = served.remote_config(tmp_path)
    mine = config['baseline']['train']['state_file']
    assert not os.path.exists(mine)
    fetches = []
    real_fetch = cl.fetch_baseline
    monkeypatch.setattr(cl, 'fetch_baseline', lambda *a, **k: fetches.append(k['wait']) or real_fetch(*a, **k))
    with caplog.at_level(logging.INFO):
        client = cl.Client(config, env={}, sleep=lambda s: None)
        # installed before the first round: the same weights, loadable as any baseline
        assert fetches == [True] and cl.file_digest(mine) == first
        assert all(torch.equal(a, b) for a, b in zip(weights_of(mine)[0].values(),
                                                     weights_of(served.baseline)[0].values()))
        load_model_pair(mine)
        engine = client.train_player.baseline_engine
        client.baseline.apply_play_settings(served.param_reply(), client.train_player)
        assert client.baseline.digest == first and fetches == [True]  # the file is it already: no reload
        assert client.train_player.baseline_engine is engine
        # the trainer's baseline is replaced by hand, then the trainer restarts: version 1, a new digest
        write_baseline(served.config, served.baseline, seed=1)
        trainer.sync_baseline()
        second = wire.baseline_digest(*weights_of(served.baseline))
        assert trainer.guard['baseline_version'] == 1 and served.store.baseline['baseline_digest'] == second
        assert torch.load(trainer.state_file, weights_only=True)['guard']['baseline_version'] == 1
        trainer.submit_param(is_idle=True)
        client.baseline.apply_play_settings(served.param_reply(), client.train_player)
        assert fetches == [True, False] and client.baseline.digest == second == cl.file_digest(mine)
        new = client.train_player.baseline_engine
        assert new is not engine
        assert all(torch.equal(new.brain.state_dict()[k], v) for k, v in weights_of(served.baseline)[0].items())
        backups = glob.glob(f'{mine}.*.bak')
        assert len(backups) == 1 and cl.file_digest(backups[0]) == first  # the old one kept as .bak
        client.baseline.apply_play_settings(served.param_reply(), client.train_player)  # nothing new: nothing fetched
        assert fetches == [True, False]
    assert 'has changed since it was last submitted (rotated by hand?): baseline version 1' in caplog.text
    assert 'the baseline was rotated (version 0 -> 1): reloading it' in caplog.text


def test_a_served_baseline_that_fails_its_checks_is_refused_once(tmp_path, served, caplog):
    config = served.remote_config(tmp_path)
    mine = config['baseline']['train']['state_file']
    os.makedirs(os.path.dirname(mine))
    write_baseline(config, mine, seed=5)
    before = open(mine, 'rb').read()
    mortal, dqn = weights_of(served.baseline)
    tampered = _submission(mortal, dqn, arch=dict(ARCH), baseline_version=1)
    tampered['baseline_digest'] = wire.baseline_digest({**mortal, next(iter(mortal)): torch.zeros(1)}, dqn)
    assert served.remote.request(tampered)['status'] == 'ok'
    served.trainer.submit_param(is_idle=True)
    client = cl.Client(config, env={}, sleep=lambda s: None)
    engine = client.train_player.baseline_engine
    with caplog.at_level(logging.WARNING, logger='mortal.client'):
        client.baseline.apply_play_settings(served.param_reply(), client.train_player)
        client.baseline.apply_play_settings(served.param_reply(), client.train_player)
    assert caplog.text.count("cannot use the trainer's baseline from the server") == 1
    assert 'do not match their digest' in caplog.text
    assert open(mine, 'rb').read() == before and client.train_player.baseline_engine is engine
    assert client.baseline.bad_digest == tampered['baseline_digest'] and client.baseline.digest is None
    # another architecture than its arch says: refused the same way
    other = dict(_submission(mortal, dqn, arch={**ARCH, 'num_blocks': 2}, baseline_version=1))
    assert served.remote.request(other)['status'] == 'ok'
    client.baseline.apply_play_settings(served.param_reply(), client.train_player)
    assert client.baseline.bad_digest == other['baseline_digest'] and open(mine, 'rb').read() == before


def test_from_server_false_keeps_the_clients_own_file(tmp_path, served):
    served.trainer.sync_baseline()
    served.trainer.submit_param(is_idle=True)
    config = served.remote_config(tmp_path)
    config['baseline']['train']['from_server'] = False
    mine = config['baseline']['train']['state_file']
    os.makedirs(os.path.dirname(mine))
    write_baseline(config, mine, seed=7)
    before = open(mine, 'rb').read()
    client = cl.Client(config, env={}, sleep=lambda s: None)
    client.baseline.apply_play_settings(served.param_reply(), client.train_player)
    assert open(mine, 'rb').read() == before and client.baseline.digest is None and client.baseline.version == 0


def test_a_client_started_before_the_trainer_waits_for_its_baseline(tmp_path, served, caplog):
    config = served.remote_config(tmp_path)
    sleeps = []

    def sleep(seconds):  # the trainer starts while the client waits
        sleeps.append(seconds)
        if len(sleeps) == 2:
            served.trainer.sync_baseline()

    with caplog.at_level(logging.INFO, logger='mortal.client'):
        client = cl.Client(config, env={}, sleep=sleep)
    assert sleeps == [3.0, 3.0]
    assert caplog.text.count("waiting for the trainer's baseline: empty baseline") == 1
    assert cl.file_digest(config['baseline']['train']['state_file']) == served.store.baseline['baseline_digest']
    assert client.train_player.baseline_engine is not None


@pytest.mark.slow
def test_hostile_baselines_are_refused_without_building_them(tmp_path, served, caplog):
    from mortal.model.checkpoint import CheckpointError, read_baseline
    from mortal.model.networks import Brain, DQN
    brain, dqn = Brain(version=3, conv_channels=16, num_blocks=1), DQN(version=3)
    mortal_sd, dqn_sd = brain.state_dict(), dqn.state_dict()
    # an arch at the wire's bounds (4096 channels, 1024 blocks: ~400 GB of weights) with tiny weights: refused by
    # shape, the networks only built on the meta device
    huge = _submission(mortal_sd, dqn_sd, arch={'version': 3, 'conv_channels': 4096, 'num_blocks': 1024})
    with pytest.raises(CheckpointError, match=r"baseline mortal: key 'encoder.net.0.weight' has shape \[16, "):
        cl.unpack_baseline(huge)
    # refused once per digest, also when asked again (a client waiting at start asks every 3 s)
    assert served.remote.request(huge)['status'] == 'ok'
    config = served.remote_config(tmp_path)
    os.makedirs(os.path.dirname(config['baseline']['train']['state_file']))
    write_baseline(config, config['baseline']['train']['state_file'], seed=3)
    client = cl.Client(config, env={}, sleep=lambda s: None)
    with caplog.at_level(logging.WARNING, logger='mortal.client'):
        assert client.baseline.install() is None and client.baseline.install() is None
    assert caplog.text.count("cannot use the trainer's baseline from the server") == 1
    # a checkpoint whose weights are not tensors has no digest: a CheckpointError, not an AttributeError
    odd = tmp_path / 'odd.pth'
    torch.save({'mortal': {'a': 5}, 'current_dqn': {}, 'config': {'control': {'version': 3},
                                                                  'resnet': {'conv_channels': 16, 'num_blocks': 1}}},
               odd)
    with pytest.raises(CheckpointError, match=r"mortal\['a'\] is a int, not a tensor"):
        read_baseline(str(odd))
    assert cl.file_digest(str(odd)) is None


def test_a_deeply_nested_safetensors_header_is_a_bad_request(tmp_path):
    nested = b'[' * 100000 + b']' * 100000
    data = struct.pack('<Q', len(nested)) + nested
    with pytest.raises(wire.ProtocolError, match='invalid safetensors'):
        signature.state_dict_signature(data)
    store = replay_store.ReplayStore(tmp_path / 'buffer', tmp_path / 'drain', 4)
    store.reset_dirs()
    with pytest.raises(wire.ProtocolError):
        store.handle({**_submission(), 'mortal': data})
    assert store.baseline is None


def client_without_its_baseline(tmp_path, served):
    """A client on another machine that has fetched the trainer's baseline once, then lost the file: ``(client,
    its state_file, the baseline's digest)``."""
    served.trainer.sync_baseline()
    config = served.remote_config(tmp_path)
    mine = config['baseline']['train']['state_file']
    client = cl.Client(config, env={}, sleep=lambda s: None)
    digest = cl.file_digest(mine)
    os.remove(mine)
    return client, mine, digest


@pytest.mark.slow
def test_clients_sharing_a_baseline_file_write_it_once(tmp_path, served, caplog):
    """A fleet's actors on one node share [baseline.train] state_file: under its lock, one writes the served
    baseline and the others find it there (no second write, so no .bak of an identical file)."""
    import threading
    client, mine, digest = client_without_its_baseline(tmp_path, served)
    results = []
    barrier = threading.Barrier(3)

    def install():
        barrier.wait()
        results.append(client.baseline.install())

    with caplog.at_level(logging.INFO):
        threads = [threading.Thread(target=install) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert results == [digest] * 3 and cl.file_digest(mine) == digest
    assert glob.glob(f'{mine}*.bak') == []
    assert caplog.text.count(f'is already in {mine}') == 2


@pytest.mark.slow
def test_a_baseline_lock_held_too_long_is_reported_and_the_install_tried_again(tmp_path, served, caplog,
                                                                              monkeypatch):
    """A stuck holder of <state_file>.lock (e.g. a hung network filesystem) does not stall a client silently: it
    gives up after BASELINE_LOCK_SECONDS with a warning, writes nothing, and installs once the lock is free."""
    from filelock import FileLock
    client, mine, digest = client_without_its_baseline(tmp_path, served)
    monkeypatch.setattr(cl, 'BASELINE_LOCK_SECONDS', 0.2)
    with caplog.at_level(logging.INFO), FileLock(mine + '.lock'):  # another process's lock (flock: per open file)
        assert client.baseline.install() is None
    assert not os.path.exists(mine)
    assert (f'cannot write the baseline to {mine}: its lock {mine}.lock has been held by another process for '
            '0.2 s') in caplog.text
    assert client.baseline.install() == digest == cl.file_digest(mine)
