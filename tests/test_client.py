"""mortal/client.py and mortal/play/player.py: rank reports, seed schedule, one real round against a live server."""

import gzip
import json
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import toml
import torch

from mortal import client as cl
from mortal.net import param_server, replay_store, wire
from mortal.model.checkpoint import load_model_pair
from mortal.play.player import TrainPlayer

from conftest import ROOT, free_port, load_tiny_config, tiny_config_dict, write_baseline



@pytest.mark.parametrize('rankings, rank, pt', [
    ([1, 1, 1, 1], 2.5, 0.0),  # (90 + 45 + 0 - 135) / 4
    ([2, 1, 0, 1], 2.0, 22.5),  # (1+1+2+4)/4; (180 + 45 - 135) / 4
    ([0, 0, 0, 4], 4.0, -135.0),
])
def test_rank_summary_by_hand(rankings, rank, pt):
    assert cl.rank_summary(rankings) == (rank, pt)


def test_history_window_and_report_lines():
    h = cl.RankHistory(3)
    for r in ([4, 0, 0, 0], [2, 1, 0, 1], [0, 0, 0, 4]):
        h.add(r)
    total = h.add([1, 1, 1, 1])  # the first round drops out
    assert total.tolist() == [3, 2, 1, 6] and len(h) == 3
    lines = cl.format_round([1, 1, 1, 1], h, total)
    # window: ranks (3*1 + 2*2 + 1*3 + 6*4) / 12 = 34/12; pt (270 + 90 + 0 - 810) / 12 = -37.5
    assert lines == ('trainee rankings: [1, 1, 1, 1] (2.5, 0.0pt)',
                     f'last 3 sessions: [3, 2, 1, 6] ({34 / 12:.6}, -37.5pt)')


def test_seed_schedule_advances_by_games_over_4_every_repeats(tmp_path):
    config, _ = load_tiny_config(tmp_path, **{'train_play.default': {'games': 8, 'repeats': 2}})
    p = TrainPlayer(config, {}, baseline_engine=object(), train_key=12345)
    assert [p.next_seed() for _ in range(5)] == [
        (10000, 12345), (10000, 12345), (10002, 12345), (10002, 12345), (10004, 12345)]
    keys = {TrainPlayer(config, {}, baseline_engine=object()).train_key for _ in range(3)}
    assert len(keys) == 3 and all(0 <= k < 2 ** 64 for k in keys)


def test_train_play_profile_from_env(tmp_path):
    config, _ = load_tiny_config(tmp_path)
    config['train_play']['fast'] = dict(config['train_play']['default'], games=12, log_dir=str(tmp_path / 'fast'))
    p = TrainPlayer(config, {'TRAIN_PLAY_PROFILE': 'fast'}, baseline_engine=object())
    assert p.seed_count == 3 and p.log_dir == str(tmp_path / 'fast')
    from mortal.config import ConfigError
    with pytest.raises(ConfigError, match=r'train_play.nope'):
        TrainPlayer(config, {'TRAIN_PLAY_PROFILE': 'nope'}, baseline_engine=object())


def test_a_profile_named_with_a_dot(tmp_path):
    # [train_play."a.b"] in the file: the profile a.b, not a table b inside a profile a
    config, _ = load_tiny_config(tmp_path)
    config['train_play']['a.b'] = dict(config['train_play']['default'], games=16, log_dir=str(tmp_path / 'ab'),
                                       speculate_passes=True)
    p = TrainPlayer(config, {'TRAIN_PLAY_PROFILE': 'a.b'}, baseline_engine=object())
    assert (p.seed_count, p.log_dir, p.speculate_passes) == (4, str(tmp_path / 'ab'), True)
    default = TrainPlayer(config, {}, baseline_engine=object())
    assert (default.seed_count, default.speculate_passes) == (1, False)


@pytest.mark.slow
def test_round_against_a_server_that_starts_late(tmp_path, caplog):
    """The server is down at first (client retries), then has no parameters (retries), then a real round."""
    import logging
    port = free_port()
    config, _ = load_tiny_config(tmp_path, port=port)
    write_baseline(config, config['baseline']['train']['state_file'])
    store = replay_store.ReplayStore(tmp_path / 'buffer', tmp_path / 'drain', 8)
    store.reset_dirs()
    servers = []
    sleeps = []
    brain, dqn, _ = load_model_pair(config['baseline']['train']['state_file'])
    remote = wire.Remote('127.0.0.1', port, timeout=10)

    def fake_sleep(sec):
        sleeps.append(sec)
        if len(sleeps) == 2:  # the server comes up
            server = param_server.ParamServer(('127.0.0.1', port), store, timeout=10)
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
            servers.append(server)
        if len(sleeps) == 3:  # the trainer submits its first parameters
            remote.request({'type': 'submit_param', 'mortal': wire.pack_state_dict(brain.state_dict()),
                            'dqn': wire.pack_state_dict(dqn.state_dict()), 'is_idle': True})

    try:
        client = cl.Client(config, env={}, sleep=fake_sleep)
        with caplog.at_level(logging.INFO):
            rankings = client.run_round()
        assert sleeps == [3.0, 3.0, 3.0]
        assert client.param_version == 1 and client.server_id == store.server_id
        assert rankings.sum() == 4 and rankings.dtype == np.int64
        key = client.train_player.train_key
        names = sorted(os.listdir(store.buffer_dir))
        assert names == [f'0_10000_{key}_{s}.json.gz' for s in 'abcd']
        assert store.buffer == {n: 1 for n in names}
        with gzip.open(os.path.join(store.buffer_dir, names[1]), 'rt') as f:
            start = json.loads(f.readline())
        assert start['type'] == 'start_game' and start['names'] == ['baseline', 'trainee', 'baseline', 'baseline']
        assert ('waiting for the trainer (train.py) to submit parameters: the server holds none yet (empty param)'
                in caplog.text)
        assert f'trainee rankings: {rankings.tolist()}' in caplog.text and 'last 1 sessions' in caplog.text
        assert client.train_player.train_seed == 10001
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


@pytest.mark.slow
def test_missing_profile_is_one_line_error_not_traceback(tmp_path):
    # TRAIN_PLAY_PROFILE naming a table the config lacks: exit status 2 and one `error:` line naming it.
    cfg = tmp_path / 'config.toml'
    cfg.write_text(toml.dumps(tiny_config_dict(tmp_path)))
    env = {**os.environ, 'TRAIN_PLAY_PROFILE': 'explore'}
    proc = subprocess.run([sys.executable, '-m', 'mortal.client', '-c', str(cfg)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert proc.returncode == 2
    assert 'Traceback' not in proc.stderr
    assert '[train_play.explore]' in proc.stderr and str(cfg) in proc.stderr


class ScriptedParamRemote:
    """Answers get_param with the next of ``replies``; records submit_replay requests."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.host, self.port = '127.0.0.1', 1
        self.submits = []

    def request(self, msg):
        if msg['type'] == 'submit_replay':
            self.submits.append(msg)
            return {'status': 'ok', 'count': len(msg['logs']), 'submission_id': len(self.submits) - 1}
        assert msg['type'] == 'get_param'
        return self.replies.pop(0)


class RecordingPlayer:
    """Stands in for TrainPlayer: records the trainee's first weight at each round, writes one small log."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.seen = []

    def train_play(self, mortal, dqn, device):
        self.seen.append(float(next(iter(mortal.state_dict().values())).flatten()[0]))
        name = self.tmp_path / f'round{len(self.seen)}.json.gz'
        name.write_bytes(gzip.compress(b'{"type":"start_game"}\n'))
        return np.array([1, 0, 0, 0]), [str(name)]


def params_reply(version, mortal_sd, dqn_sd, server_id='s1'):
    return {'status': 'ok', 'param_version': version, 'server_id': server_id,
            'mortal': wire.pack_state_dict(mortal_sd), 'dqn': wire.pack_state_dict(dqn_sd)}


def filled(module, value):
    return {k: torch.full_like(v, value) if v.is_floating_point() else v for k, v in module.state_dict().items()}


@pytest.mark.slow
def test_parameters_that_cannot_be_loaded_are_kept_out_and_logged_once(tmp_path, caplog):
    import logging
    from mortal.model.networks import DQN, Brain
    config, _ = load_tiny_config(tmp_path)  # a 16-channel 1-block Brain
    good_brain, dqn = Brain(version=3, conv_channels=16, num_blocks=1), DQN(version=3)
    other_brain = Brain(version=3, conv_channels=32, num_blocks=2)
    good = filled(good_brain, 0.25), filled(dqn, 0.25)
    # same keys, one tensor of another shape, every other value 7: load_state_dict would half-load it
    half = filled(good_brain, 7.0)
    first = next(iter(half))
    half[first] = torch.zeros(3)
    remote = ScriptedParamRemote([
        params_reply(1, other_brain.state_dict(), dqn.state_dict()),  # 32x2 against 16x1: nothing loaded yet
        params_reply(1, other_brain.state_dict(), dqn.state_dict()),  # the same version again: not logged again
        {'status': 'ok', 'param_version': 1, 'server_id': 's1', 'mortal': b'junk', 'dqn': b'junk'},
        params_reply(2, *good),
        params_reply(3, half, filled(dqn, 7.0)),  # client holds version 2: plays on with it
        params_reply(3, half, filled(dqn, 7.0)),
        params_reply(4, good[0], {}),  # an empty dqn
        params_reply(5, good[0], filled(dqn, float('nan'))),  # a hostile trial's NaN weights crashed the sampling
    ])
    player = RecordingPlayer(tmp_path)
    sleeps = []
    client = cl.Client(config, train_player=player, remote=remote, sleep=sleeps.append)
    with caplog.at_level(logging.INFO, logger='mortal.client'):
        for _ in range(5):
            client.run_round()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # one line per bad version: v1 (its junk repeat included), v3, v4, v5
    assert len(warnings) == 4, warnings
    assert warnings[0].startswith('cannot load parameters version 1 from the server (waiting for loadable ones): '
                                  'mortal: key ')
    assert re.search(r"mortal: key '[\w.]+' has shape \[32, \d+, 3\], expected \[16, \d+, 3\]$", warnings[0])
    assert warnings[1].startswith('cannot load parameters version 3 from the server (keeping version 2): '
                                  f'mortal: key {first!r} has shape [3], expected ')
    assert warnings[2].startswith('cannot load parameters version 4 from the server (keeping version 2): dqn: key ')
    assert re.fullmatch(r'cannot load parameters version 5 from the server \(keeping version 2\): dqn\.[\w.]+ holds '
                        r'NaN or inf', warnings[3])
    assert sleeps == [3.0, 3.0, 3.0]  # waited while it held nothing loadable, never while it held version 2
    assert player.seen == [0.25] * 5  # every round played with version 2, never half-loaded with 7.0
    assert all(v.unique().tolist() == [0.25] for v in client.mortal.state_dict().values() if v.is_floating_point())
    assert client.param_version == 2 and [m['param_version'] for m in remote.submits] == [2, 2, 2, 2, 2]
    assert remote.replies == []


@pytest.mark.parametrize('flag', [False, True])
def test_speculate_passes_reaches_the_arena_of_train_and_test_play(tmp_path, monkeypatch, flag):
    from mortal.play.player import TestPlayer
    config, _ = load_tiny_config(tmp_path, **{'train_play.default': {'speculate_passes': flag},
                                              'test_play': {'speculate_passes': flag}})
    seen = []

    class Stop(Exception):
        pass

    def arena(**kwargs):
        seen.append(kwargs['speculate_passes'])
        raise Stop

    monkeypatch.setattr('mortal.play.arena.OneVsThree', arena)
    monkeypatch.setattr('mortal.play.engine.MortalEngine', lambda *args, **kwargs: None)
    with pytest.raises(Stop):
        TrainPlayer(config, {}, baseline_engine=object()).train_play(None, None, 'cpu')
    with pytest.raises(Stop):
        TestPlayer(config, baseline_engine=object()).play_units(0, 1, None, None, 'cpu')
    assert seen == [flag, flag]


def test_a_client_without_new_parameters_warns_once_a_minute(tmp_path, caplog):
    # issue 36: the trainer stopped (a typo in its config), the buffer is full: the client logged
    # `waiting for parameters: samples overflow` once, then nothing, forever. Now a WARNING once a minute after
    # [online] no_param_warn_minutes (here 1) without new parameters.
    import logging
    from mortal.model.networks import DQN, Brain
    from mortal.config import put
    config, _ = load_tiny_config(tmp_path)
    put(config, 'online.no_param_warn_minutes', 1.0)
    good = filled(Brain(version=3, conv_channels=16, num_blocks=1), 0.25), filled(DQN(version=3), 0.25)
    now = [0.0]
    sleeps = []

    def sleep(s):  # the clock moves only while the client waits
        sleeps.append(s)
        now[0] += s

    # version 1, then 40 refusals (120 s of waiting at 3 s each), then version 1 again (no news), then version 2
    remote = ScriptedParamRemote([params_reply(1, *good)] + [{'status': 'samples overflow'}] * 40
                                 + [params_reply(1, *good), params_reply(2, *good)])
    client = cl.Client(config, train_player=RecordingPlayer(tmp_path), remote=remote, sleep=sleep,
                       clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger='mortal.client'):
        client.run_round()
        assert now[0] == 0.0
        client.run_round()  # waits 120 s, then gets version 1 again
        client.run_round()  # version 2: the clock restarts
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # the 20th wait starts at 57 s, the 21st at 60 s: the first warning; the next a minute later, at 120 s
    why = ('is the trainer running? (its log says why it stopped or waits; [online] no_param_warn_minutes sets this '
           'warning)')
    assert warnings == [f'no new parameters for 1 min (still version 1): {why}',
                        f'no new parameters for 2 min (still version 1): {why}']
    assert sleeps == [3.0] * 40 and client.param_version == 2 and client.param_since == 120.0


def test_a_client_waiting_for_parameters_says_it_waits_for_the_trainer(tmp_path, caplog):
    # A new user's first client, started before the trainer, logged a bare `waiting for parameters: empty param`:
    # each refusal now names what the client waits for, once per change of reason.
    import logging
    from mortal.model.networks import DQN, Brain
    from mortal.config import put
    config, _ = load_tiny_config(tmp_path)
    put(config, 'online.no_param_warn_minutes', 2.5)
    good = filled(Brain(version=3, conv_channels=16, num_blocks=1), 0.25), filled(DQN(version=3), 0.25)
    remote = ScriptedParamRemote([{'status': 'empty param'}] * 2 + [params_reply(1, *good)]
                                 + [{'status': 'samples overflow'}, {'status': 'trainer is busy'},
                                    params_reply(2, *good)])
    client = cl.Client(config, train_player=RecordingPlayer(tmp_path), remote=remote, sleep=lambda s: None)
    with caplog.at_level(logging.INFO, logger='mortal.client'):
        client.sync_params()
        client.sync_params()
    waits = [r.getMessage() for r in caplog.records if 'waiting' in r.getMessage()]
    then = 'asking again every 3 s, a warning after 2.5 min without new ones ([online] no_param_warn_minutes)'
    assert waits == [
        f'waiting for the trainer (train.py) to submit parameters: the server holds none yet (empty param); {then}',
        f"waiting for the trainer (train.py) to drain the server's full buffer (samples overflow); {then}",
        'waiting for the trainer (train.py) to submit parameters newer than version 1 ([online.server] '
        f'force_sequential) (trainer is busy); {then}',
    ]
    assert client.param_version == 2
