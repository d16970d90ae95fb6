"""mjai stdin/stdout bot: a real log's player view piped through, every reaction legal and at a decision point."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from mjai.mlibriichi.state import PlayerState

from conftest import DATA_DIR, ROOT, player_view
from mortal import bot as bot_mod
from mortal.play.agent import legal_reaction
from mortal.model.networks import DQN, GRP, Brain
from mortal.features.obs import encode

LOG = DATA_DIR / 'riichienv_selfplay_hanchan.jsonl'
SEAT = 2
TIMESTAMP = 1700000000  # 2023-11-14 22:13 UTC -> tag suffix t23111422


@pytest.fixture
def bot_config(tiny_config, tmp_path):
    """tiny_config plus a random version-3 checkpoint at [control] state_file and a random GRP."""
    config, path = tiny_config
    torch.manual_seed(0)
    torch.save({
        'mortal': Brain(conv_channels=16, num_blocks=1, version=3).state_dict(),
        'current_dqn': DQN(version=3).state_dict(),
        'config': config,
        'timestamp': TIMESTAMP,
    }, config['control']['state_file'])
    torch.save({'model': GRP(hidden_size=64, num_layers=2).state_dict()}, config['grp']['state_file'])
    return config, path


def test_bot_reacts_exactly_at_decision_points_with_legal_reactions(bot_config, monkeypatch):
    config, path = bot_config
    monkeypatch.delenv(bot_mod.REVIEW_ENV, raising=False)
    engine, tag = bot_mod.load_engine(config['control']['state_file'], review_mode=False)
    assert tag == 'mortal3-b1c16-t23111422'
    assert engine.enable_quick_eval and engine.enable_rule_based_agari_guard and engine.name == 'mortal'
    bot = bot_mod.Bot(engine, SEAT)
    ref = PlayerState(SEAT)
    lines = player_view(LOG, SEAT)
    n_decisions = n_meta = 0
    kinds = set()
    for line in lines:
        cans = ref.update(line)
        reaction = bot.react(line)
        if not cans.can_act:
            assert reaction is None, line
            continue
        n_decisions += 1
        assert reaction is not None, line
        r = json.loads(reaction)
        _, mask = encode(ref, 3)
        meta = r.pop('meta', None)
        assert legal_reaction(ref, mask, r), (line, r)
        kinds.add(r['type'])
        if meta is None:
            # quick eval: only when exactly one discard is legal and nothing else
            assert r['type'] == 'dahai' and mask.sum() == 1
        else:
            n_meta += 1
            bits = sum(1 << i for i in np.flatnonzero(mask))
            assert meta['mask_bits'] == bits
            assert len(meta['q_values']) == int(mask.sum())
            assert meta['batch_size'] >= 1 and meta['shanten'] >= 0
    # the README says 212-219 decision points per seat for this log
    assert 200 <= n_decisions <= 230
    assert n_meta > 0 and 'dahai' in kinds and 'none' in kinds


def test_serve_stream_and_can_act_false(bot_config, monkeypatch):
    config, path = bot_config
    monkeypatch.delenv(bot_mod.REVIEW_ENV, raising=False)
    lines = player_view(LOG, SEAT)
    stdin = io.StringIO('\n'.join(['  '] + lines[:400] + ['']) + '\n')  # blank lines are skipped
    ref = PlayerState(SEAT)
    expected = sum(1 for line in lines[:400] if ref.update(line).can_act)
    stdout = io.StringIO()
    assert bot_mod.main(['--config', str(path), str(SEAT)], stdin=stdin, stdout=stdout) == 0
    out = stdout.getvalue().splitlines()
    assert len(out) == expected > 0
    assert all(json.loads(o)['type'] in ('dahai', 'reach', 'chi', 'pon', 'daiminkan', 'ankan', 'kakan', 'hora',
                                         'ryukyoku', 'none') for o in out)

    # "can_act": false only updates the state (Mortal's EventWithCanAct)
    engine, _ = bot_mod.load_engine(config['control']['state_file'], review_mode=False)
    b = bot_mod.Bot(engine, SEAT)
    for line in lines[:2]:
        b.react(line)
    first_tsumo = next(i for i, l in enumerate(lines) if json.loads(l)['type'] == 'tsumo'
                       and json.loads(l)['actor'] == SEAT)
    for line in lines[2:first_tsumo]:
        b.react(line)
    ev = json.loads(lines[first_tsumo])
    ev['can_act'] = False
    assert b.react(json.dumps(ev)) is None


def test_review_mode_prints_every_event_and_phi_matrix(bot_config, monkeypatch):
    config, path = bot_config
    monkeypatch.setenv(bot_mod.REVIEW_ENV, '1')
    lines = player_view(LOG, SEAT)
    stdout = io.StringIO()
    assert bot_mod.main(['--config', str(path), str(SEAT)], stdin=io.StringIO('\n'.join(lines)),
                        stdout=stdout) == 0
    out = stdout.getvalue().splitlines()
    assert len(out) == len(lines) + 1  # one line per event, then the GRP summary
    nones = [o for o in out[:-1] if o == bot_mod.NO_REACTION]
    reactions = [json.loads(o) for o in out[:-1] if o != bot_mod.NO_REACTION]
    # no quick eval in review mode: every reaction carries meta
    assert reactions and all('meta' in r and r['meta']['mask_bits'] > 0 for r in reactions)
    assert len(nones) + len(reactions) == len(lines)
    summary = json.loads(out[-1])
    assert summary['model_tag'] == 'mortal3-b1c16-t23111422'
    n_kyoku = sum(1 for line in lines if json.loads(line)['type'] == 'start_kyoku')
    m = np.asarray(summary['phi_matrix'])
    assert m.shape == (n_kyoku, 4, 4) == (12, 4, 4)
    np.testing.assert_allclose(m.sum(axis=2), 1.0, atol=1e-9)  # each seat's rank distribution
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-9)  # each rank is taken by one seat


def test_bad_input_and_usage(bot_config, monkeypatch, capsys):
    config, path = bot_config
    monkeypatch.delenv(bot_mod.REVIEW_ENV, raising=False)
    stdin = io.StringIO('{"type":"start_game","names":["a","b","c","d"]}\nnot json\n')
    assert bot_mod.main(['--config', str(path), '1'], stdin=stdin, stdout=io.StringIO()) == 1
    assert 'input line 2: not a JSON event' in capsys.readouterr().err
    # a hostile trial: these ended the bot with a traceback, and a 300 MB line was held whole
    start = '{"type":"start_game","names":["a","b","c","d"]}\n'
    for bad, says in (('[' * 100_000 + ']' * 100_000, 'input line 2: not a JSON event (RecursionError: '),
                      ('{"type":"dahai","x":' + '9' * 5000 + '}', 'input line 2: not a JSON event (ValueError: '),
                      (' ' + 'x' * (bot_mod.MAX_LINE + 1), 'input line 2: a line of 1,048,577 characters, over '
                                                          '1,048,576 (an mjai event is under 1,000)')):
        assert bot_mod.main(['--config', str(path), '1'], stdin=io.StringIO(start + bad + '\n'),
                            stdout=io.StringIO()) == 1
        err = capsys.readouterr().err
        assert says in err and 'Traceback' not in err, err[-500:]
    with pytest.raises(SystemExit) as exc:
        bot_mod.main(['--config', str(path), '4'])
    assert exc.value.code == 2
    with pytest.raises(ValueError):
        bot_mod.Bot(object(), 5)


@pytest.mark.slow
def test_script_entry_point(bot_config):
    config, path = bot_config
    lines = player_view(LOG, 0)[:3]  # start_game, start_kyoku, seat 0's first tsumo -> one discard
    proc = subprocess.run([sys.executable, '-m', 'mortal.bot', '--config', str(path), '0'],
                          input='\n'.join(lines) + '\n', capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, 'MORTAL_REVIEW_MODE': '0', 'OMP_NUM_THREADS': '1'})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert len(out) == 1
    r = json.loads(out[0])
    assert r['type'] == 'dahai' and r['actor'] == 0


@pytest.mark.slow
def test_output_into_head_exits_quietly(bot_config, tmp_path):
    # `python -m mortal.bot -c cfg 0 < log | head -n 1`: the reader leaves after one line; the
    # bot must stop with the shell's SIGPIPE status and no BrokenPipeError traceback.
    config, path = bot_config
    log = tmp_path / 'view.jsonl'
    log.write_text('\n'.join(player_view(LOG, 0)) + '\n')
    err = tmp_path / 'err.txt'
    with open(log) as fin, open(err, 'w') as ferr:
        proc = subprocess.Popen([sys.executable, '-m', 'mortal.bot', '-c', str(path), '0'],
                                stdin=fin, stdout=subprocess.PIPE, stderr=ferr, cwd=ROOT,
                                env={**os.environ, 'MORTAL_REVIEW_MODE': '0', 'OMP_NUM_THREADS': '1'})
        first = proc.stdout.readline()
        proc.stdout.close()
        rc = proc.wait(timeout=120)
    assert json.loads(first)['actor'] == 0
    stderr = err.read_text()
    assert rc == bot_mod.SIGPIPE_STATUS == 141, stderr
    assert 'Traceback' not in stderr and 'BrokenPipeError' not in stderr, stderr


def test_bot_logs_what_it_loaded_and_why_it_stopped(bot_config, monkeypatch, caplog):
    # issue 36: mortal-bot did not say which checkpoint it loaded, nor why it stopped
    import logging
    import signal
    from mortal import entry
    config, path = bot_config
    monkeypatch.delenv(bot_mod.REVIEW_ENV, raising=False)
    lines = player_view(LOG, SEAT)[:10]
    with caplog.at_level(logging.INFO, logger='mortal.bot'):
        assert bot_mod.main(['--config', str(path), str(SEAT)], stdin=io.StringIO('\n'.join(lines) + '\n'),
                            stdout=io.StringIO()) == 0

        def terminated():  # stdin that delivers 10 events, then SIGTERM arrives (as entry.stop_on_sigterm raises it)
            yield from lines
            raise entry.Stopped(signal.SIGTERM)

        assert bot_mod.main(['--config', str(path), str(SEAT)], stdin=terminated(), stdout=io.StringIO()) == 143
    said = [r.getMessage() for r in caplog.records if r.name == 'mortal.bot']
    state_file = os.path.abspath(config['control']['state_file'])
    loaded = f'loaded {state_file}: version 3, 1 blocks x 16 channels, tag mortal3-b1c16-t'
    assert said[0].startswith(loaded) and said[0].endswith(', steps ?')  # this checkpoint records no steps
    assert said[1] == 'input ended after 10 events (0 games): stopped'
    assert said[2].startswith(loaded)
    assert said[3] == 'stopped on SIGTERM after 10 events (0 games); nothing is kept'
