"""1v3 CLI: duplicate-set confidence interval (hand-computed) and an end-to-end run with cheap players."""

import gzip
import json
import math

import pytest
import toml
import torch

from mortal import one_vs_three as ovt
from mortal.play import duplicate


def test_mean_ci_by_hand():
    # [1, 2, 3, 4]: mean 2.5; sample variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3;
    # half-width 1.959964 * sqrt(5/3) / sqrt(4) = 1.265151
    mean, half = duplicate.mean_ci([1, 2, 3, 4])
    assert mean == 2.5
    assert half == pytest.approx(1.265151, abs=1e-6)
    mean, half = duplicate.mean_ci([3.0])
    assert mean == 3.0 and math.isnan(half)
    with pytest.raises(ValueError):
        duplicate.mean_ci([])


def test_duplicate_ci_uses_unit_means():
    # unit rank means 2.5, 1.5, 3.5 -> mean 2.5, sd 1 -> half-width 1.96 / sqrt(3) = 1.131586
    # unit pt means (90+45+0-135)/4 = 0, (90+90+45+45)/4 = 67.5, (-135-135+0+0)/4 = -67.5
    #   -> mean 0, sd 67.5 -> half-width 1.96 * 67.5 / sqrt(3) = 76.382037
    s = ovt.duplicate_ci([[1, 2, 3, 4], [1, 1, 2, 2], [4, 4, 3, 3]])
    assert (s.n_units, s.n_games) == (3, 12)
    assert s.avg_rank == 2.5
    assert s.avg_rank_ci == pytest.approx(1.131586, abs=1e-6)
    assert s.avg_pt == 0.0
    assert s.avg_pt_ci == pytest.approx(76.382037, abs=1e-6)
    # the naive per-game interval would be different (12 games, sd of ranks 1.168) -> 0.661;
    # units, not games, are the independent samples
    assert s.avg_rank_ci != pytest.approx(0.661, abs=1e-2)
    with pytest.raises(ValueError, match='rank must be 1-4'):
        ovt.duplicate_ci([[0, 1]])
    with pytest.raises(ValueError):
        ovt.duplicate_ci([])


def test_complete_challenger_units_and_rank_summary():
    games = [  # (nonce, key, split, final scores, 0-based rank_by_player)
        (5, 9, 'a', None, [0, 1, 2, 3]),  # challenger seat 0 -> 1st
        (5, 9, 'b', None, [0, 3, 1, 2]),  # seat 1 -> 4th
        (6, 9, 'c', None, [0, 3, 1, 2]),  # seat 2 -> 2nd
        (5, 9, 'c', None, [0, 3, 1, 2]),  # seat 2 -> 2nd
        (6, 9, 'd', None, [0, 3, 1, 2]),  # seat 3 -> 3rd
        (5, 9, 'd', None, [0, 3, 1, 2]),  # seat 3 -> 3rd
    ]
    assert duplicate.complete_challenger_units(games) == {5: [1, 4, 2, 3]}  # deal 6 is incomplete: dropped
    assert ovt.rank_summary([1, 1, 1, 1]) == (2.5, 0.0)
    assert ovt.rank_summary([2, 0, 0, 2]) == (2.5, (2 * 90 - 2 * 135) / 4)


def test_a_side_is_typed_by_its_type():
    from mortal.config import typed
    from mortal.config_schema import MortalSide, RulebaseSide
    mortal = {'name': 'm', 'device': 'cpu', 'state_file': 'x.pth', 'stochastic_latent': False, 'enable_compile': False,
              'enable_amp': False, 'enable_rule_based_agari_guard': True}
    table = {'games_per_iter': 4, 'iters': 1, 'log_dir': '', 'challenger': mortal,
             'champion': {'type': 'rulebase', 'name': 'rb'}}
    cfg = typed({'1v3': table}).one_vs_three
    assert isinstance(cfg.challenger, MortalSide) and cfg.challenger.type == 'mortal'  # the default
    assert isinstance(cfg.champion, RulebaseSide) and cfg.champion.name == 'rb'


def test_build_side_rulebase():
    from mortal.config_schema import RulebaseSide
    agent = ovt.build_side(RulebaseSide(type='rulebase', name='rb'), '1v3.champion')
    assert agent.name == 'rb' and hasattr(agent, 'react')


class FirstLegal:
    """A cheap deterministic arena agent: always the lowest legal action index."""

    def __init__(self, name):
        self.name = name

    def react(self, scenes):
        from mortal.play.agent import Decision, first_legal
        from mortal.features.obs import encode
        return [Decision(first_legal(sc.state, encode(sc.state, 1)[1])) for sc in scenes]

    def end_game(self, game, seat):
        pass


def write_config(path, log_dir, chal_type):
    """A [1v3] config of 4 games x 1 iter (seed_key 7): challenger 'chal' of ``chal_type``, rulebase champion."""
    side = {'device': 'cpu', 'state_file': 'unused', 'stochastic_latent': False, 'enable_compile': False,
            'enable_amp': False, 'enable_rule_based_agari_guard': True}
    path.write_text(toml.dumps({'1v3': {
        'seed_key': 7, 'games_per_iter': 4, 'iters': 1, 'log_dir': str(log_dir),
        'challenger': {'type': chal_type, 'name': 'chal', **side},
        'champion': {'type': 'rulebase', 'name': 'champ', **side}}}))


@pytest.mark.parametrize('flag', ['--config', '-c'])
def test_cli_rejects_bad_side_type(tmp_path, capsys, flag):
    cfg = tmp_path / 'c.toml'
    write_config(cfg, tmp_path / 'logs', 'akochan')
    assert ovt.main([flag, str(cfg), '--no-progress']) == 2  # the config was read: -c is --config
    err = capsys.readouterr().err
    assert "[1v3.challenger] type in" in err and "got 'akochan'" in err


def test_cli_end_to_end_identical_players_rank_2_5(tmp_path, capsys, monkeypatch):
    # Identical deterministic players on duplicate deals: the 4 rotations of a nonce are the same
    # game with the challenger in a different seat, so it takes each rank once -> [1, 1, 1, 1].
    built = []

    def fake_build(side, section):
        built.append((section, side.type, side.name))
        return FirstLegal(side.name)

    monkeypatch.setattr(ovt, 'build_side', fake_build)
    log_dir = tmp_path / 'logs'
    cfg = tmp_path / 'c.toml'
    write_config(cfg, log_dir, 'rulebase')
    assert ovt.main(['--config', str(cfg), '--no-progress']) == 0
    out = capsys.readouterr().out
    assert built == [('1v3.challenger', 'rulebase', 'chal'), ('1v3.champion', 'rulebase', 'champ')]
    assert '# 0' in out
    assert 'challenger rankings: [1, 1, 1, 1] (2.500000, 0.000000pt)' in out
    assert 'total: avg rank 2.5000 ± nan, avg pt 0.000 ± nan (95% CI over 1 duplicate sets, 4 games; unreliable: 1 sets)' in out
    # Mortal's log names: nonce 10000 (first iteration), key 7, split a-d
    names = sorted(p.name for p in log_dir.iterdir())
    assert names == [f'10000_7_{s}.json.gz' for s in 'abcd']
    with gzip.open(log_dir / '10000_7_b.json.gz', 'rt') as f:
        first = json.loads(f.readline())
    assert first['names'] == ['champ', 'chal', 'champ', 'champ']
    # the final Stat table is over the challenger's seats only
    assert 'Games            4' in out
    assert '1st (rate)       1 (0.250000)' in out
    assert 'Total Δscore     0' in out



@pytest.mark.slow
def test_mortal_side_from_checkpoint_plays_end_to_end(tiny_config, tmp_path, capsys, monkeypatch,
                                                       one_torch_thread):
    from mortal.play.engine import MortalEngine
    from mortal.model.networks import DQN, Brain

    config, _ = tiny_config
    from mortal.config import section
    chal = section(config, '1v3.challenger')
    torch.manual_seed(0)
    torch.save({'mortal': Brain(conv_channels=16, num_blocks=1, version=3).state_dict(),
                'current_dqn': DQN(version=3).state_dict(), 'config': config, 'timestamp': 0},
               chal.state_file)
    engine = ovt.build_side(chal, '1v3.challenger')
    assert isinstance(engine, MortalEngine)
    assert (engine.name, engine.version, engine.enable_rule_based_agari_guard) == ('mortal', 3, True)

    real_build = ovt.build_side
    monkeypatch.setattr(ovt, 'build_side', lambda side, section: (
        real_build(side, section) if section == '1v3.challenger' else FirstLegal(side.name)))
    summary = ovt.run(config, disable_progress_bar=True)
    out = capsys.readouterr().out
    assert (summary.n_units, summary.n_games) == (1, 4)
    assert 1.0 <= summary.avg_rank <= 4.0 and math.isnan(summary.avg_rank_ci)
    assert 'challenger rankings: [' in out and 'Games            4' in out
    logs = sorted(p.name for p in (tmp_path / '1v3').iterdir())
    assert logs == [f'10000_0_{s}.json.gz' for s in 'abcd']
    with gzip.open(tmp_path / '1v3' / '10000_0_c.json.gz', 'rt') as f:
        events = [json.loads(line) for line in f]
    assert events[0]['names'] == ['baseline', 'baseline', 'mortal', 'baseline']
    # the challenger's non-quick-eval reactions carry Mortal's meta
    assert any('meta' in e for e in events if e.get('actor') == 2 and e['type'] == 'dahai')


def test_a_panic_in_a_worker_becomes_an_error_naming_the_deals(monkeypatch):
    """pyo3's PanicException (a BaseException, as an mjai PlayerState overflow raised in an evaluation) must reach
    the caller as an Exception: a pool worker that dies on a BaseException loses its chunk and the pool hangs."""
    from mortal.play import arena, evaluation

    class PanicException(BaseException):
        pass

    def panic(self, *a, **k):
        raise PanicException('ArrayVec::push> capacity overflow!')

    monkeypatch.setattr(arena.OneVsThree, 'py_vs_py', panic)
    monkeypatch.setattr(evaluation, '_side', lambda side, role: None)
    with pytest.raises(RuntimeError, match=r'nonces 100\.\.103 \(key 7\) failed: PanicException: ArrayVec'):
        evaluation.play_chunk((('rulebase', None), ('rulebase', None), 100, 4, 7))


def test_every_ci_of_fewer_than_10_sets_says_unreliable():
    # issue 36: `scripts/evaluate.py --sets 2` printed `2.5000 ± 0.0000` with no warning (two identical sets)
    from mortal.learning.gate import Verdict
    from mortal.play.duplicate import duplicate_ci
    two = duplicate_ci([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert str(two) == ('avg rank 2.5000 ± 0.0000, avg pt 0.000 ± 0.000 '
                        '(95% CI over 2 duplicate sets, 8 games; unreliable: 2 sets)')
    ten = duplicate_ci([[1, 2, 3, 4]] * 10)
    assert str(ten).endswith('(95% CI over 10 duplicate sets, 40 games)')
    verdict = Verdict(rule='paired', games=16, diff=-0.5, ci=0.447, better=True, worse=False,
                      units={n: [1, 1, 2, 2] for n in range(4)})
    assert verdict.describe() == 'paired diff to best.pth -0.500 ± 0.447 (16 games; unreliable: 4 sets): better'
