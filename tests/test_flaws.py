"""The planted flaws (mortal/play/flaws.py), their plumbing into the bootstrap's games, and the arithmetic of the
planted-flaw benchmark (bench/learning_flaw.py)."""

import gzip
import json
import math

import pytest

from conftest import load_script

from mortal.play.flaws import FLAWS, deal_in_after_riichi, flaw_function, no_fold, no_riichi, overcall, \
    statistic_counts

flaw_bench = load_script('bench/learning_flaw.py', 'bench_learning_flaw')

U = '?'


def _bot_after(events):
    """A RulebaseBot at seat 0 fed ``events``; returns ``(bot, its reaction to the last one)``."""
    from mjai.bot.rulebase import RulebaseBot
    bot = RulebaseBot(0)
    reaction = None
    for ev in events:
        reaction = bot.react(json.dumps([ev]))
    return bot, reaction


def _kyoku(oya, tehai0):
    tehais = [[U] * 13 for _ in range(4)]
    tehais[0] = tehai0
    return [{'type': 'start_game', 'names': ['a', 'b', 'c', 'd'], 'id': 0},
            {'type': 'start_kyoku', 'bakaze': 'E', 'dora_marker': '1s', 'kyoku': oya + 1, 'honba': 0,
             'kyotaku': 0, 'oya': oya, 'scores': [25000] * 4, 'tehais': tehais}]


# seat 0 has 1m 2m (a chi of 3m) and a pair of 9p, no call yet: RulebaseBot passes on both (neither is yakuhai)
HAND = ['1m', '2m', '4p', '5p', '6p', '9p', '9p', '7s', '8s', 'E', 'S', 'W', 'N']


def _discard_by_kamicha(tile):
    return _kyoku(3, HAND) + [{'type': 'tsumo', 'actor': 3, 'pai': U},
                              {'type': 'dahai', 'actor': 3, 'pai': tile, 'tsumogiri': True}]


def test_overcall_chis_what_the_teacher_passes():
    bot, decision = _bot_after(_discard_by_kamicha('3m'))
    assert json.loads(decision) == {'type': 'none'}
    assert json.loads(overcall(bot, decision)) == {'type': 'chi', 'actor': 0, 'target': 3, 'pai': '3m',
                                                   'consumed': ['1m', '2m']}


def test_overcall_pons_what_the_teacher_passes():
    bot, decision = _bot_after(_discard_by_kamicha('9p'))
    assert json.loads(decision) == {'type': 'none'}
    assert json.loads(overcall(bot, decision)) == {'type': 'pon', 'actor': 0, 'target': 3, 'pai': '9p',
                                                   'consumed': ['9p', '9p']}


def test_overcall_passes_where_no_call_is_offered():
    bot, decision = _bot_after(_discard_by_kamicha('5s'))  # no 4s/6s, 3s/4s nor 6s/7s... 7s 8s: no 5s chi
    assert json.loads(decision) == {'type': 'none'}
    assert overcall(bot, decision) == decision


def test_no_riichi_discards_the_tile_that_keeps_tenpai_instead_of_declaring():
    # 123m 456p 789s SS W + tsumo N: discarding W leaves a SS/NN shanpon wait, the only tenpai discard
    hand = ['1m', '2m', '3m', '4p', '5p', '6p', '7s', '8s', '9s', 'S', 'S', 'W', 'N']
    bot, decision = _bot_after(_kyoku(0, hand) + [{'type': 'tsumo', 'actor': 0, 'pai': 'N'}])
    assert json.loads(decision) == {'type': 'reach', 'actor': 0}
    assert json.loads(no_riichi(bot, decision)) == {'type': 'dahai', 'pai': 'W', 'actor': 0, 'tsumogiri': False}
    assert no_fold(bot, decision) == decision  # RulebaseBot never folds: nothing to plant


def test_flaw_function_names_the_known_flaws():
    assert flaw_function('') is None and flaw_function(None) is None
    assert flaw_function('overcall') is overcall
    with pytest.raises(ValueError, match=r"unknown flaw 'overcal': one of \['no-fold', 'no-riichi', 'overcall'\]"):
        flaw_function('overcal')


def test_the_schema_accepts_exactly_the_registered_flaws():
    from mortal.config_schema import BOOTSTRAP_FLAWS
    assert set(BOOTSTRAP_FLAWS) == set(FLAWS) | {''}


def _hora(actor, target):
    return {'type': 'hora', 'actor': actor, 'target': target, 'deltas': [0] * 4}


def test_deal_in_after_riichi_counts_kyoku_with_an_opponents_riichi():
    start = {'type': 'start_kyoku'}
    events = [
        start, {'type': 'reach_accepted', 'actor': 1}, _hora(1, 0),  # riichi of 1, seat 0 deals in: counted
        start, _hora(2, 0),  # no riichi: not counted at all
        start, {'type': 'reach_accepted', 'actor': 2}, {'type': 'reach_accepted', 'actor': 3}, _hora(2, 3),
        start, {'type': 'reach_accepted', 'actor': 0}, _hora(1, 0),  # own riichi only: not counted
    ]
    assert deal_in_after_riichi(events, 0) == (1, 2)
    # seat 3: kyoku 1 (riichi of 1), 3 (riichi of 2, dealt in; its own riichi too) and 4 (riichi of 0)
    assert deal_in_after_riichi(events, 3) == (1, 3)


def test_statistic_counts_are_the_stat_fields_of_a_real_log():
    from conftest import DATA_DIR
    from mortal.stat import Stat
    events = [json.loads(line) for line in (DATA_DIR / 'meta_annotated_hanchan.jsonl').read_text().splitlines()
              if line.strip()]
    for seat in range(4):
        st = Stat.from_log(events, seat)
        assert statistic_counts('overcall', events, seat) == (st.fuuro, st.round)
        assert statistic_counts('no-riichi', events, seat) == (st.riichi, st.round)


def test_ratio_ci_clusters_by_deal():
    # R = 4 / 8 = 0.5; residuals 1 - 2 = -1 and 3 - 2 = 1; var = 2 / (2 * 1 * 4^2) = 1/16; half-width 1.96 * 0.25
    r, ci = flaw_bench.ratio_ci({1: (1, 4), 2: (3, 4)})
    assert r == 0.5 and ci == pytest.approx(1.959964 * 0.25)
    assert math.isnan(flaw_bench.ratio_ci({1: (1, 4)})[1])
    assert math.isnan(flaw_bench.ratio_ci({1: (0, 0)})[0])


def test_removed_fraction_and_control_steps():
    assert flaw_bench.removed_fraction(0.95, 0.55, 0.15) == pytest.approx(0.5)
    assert flaw_bench.removed_fraction(0.95, 0.99, 0.15) == pytest.approx(-0.05)
    assert math.isnan(flaw_bench.removed_fraction(0.3, 0.2, 0.3))
    assert flaw_bench.control_steps(5400, 64, 64) == 5400
    assert flaw_bench.control_steps(101, 32, 64) == 50  # 50.5 rounds to the even 50


def test_statistic_by_deal_reads_the_challengers_seat(tmp_path):
    def game(nonce, split, names, riichi_actor):
        events = [{'type': 'start_game', 'names': names},
                  {'type': 'start_kyoku', 'bakaze': 'E', 'dora_marker': '1s', 'kyoku': 1, 'honba': 0, 'kyotaku': 0,
                   'oya': 0, 'scores': [25000] * 4, 'tehais': [[U] * 13] * 4},
                  {'type': 'reach_accepted', 'actor': riichi_actor}, _hora(riichi_actor, 2),
                  {'type': 'end_kyoku'}, {'type': 'end_game'}]
        with gzip.open(tmp_path / f'{nonce}_5_{split}.json.gz', 'wt') as f:
            f.write('\n'.join(json.dumps(e) for e in events))
    game(7, 'a', ['challenger', 'x', 'x', 'x'], 1)  # the challenger (seat 0) saw a riichi, no deal-in
    game(7, 'c', ['x', 'x', 'challenger', 'x'], 1)  # the challenger (seat 2) dealt in
    game(8, 'a', ['challenger', 'x', 'x', 'x'], 0)  # its own riichi: no kyoku counted
    assert flaw_bench.statistic_by_deal(tmp_path, 'no-fold') == {7: (1, 2), 8: (0, 0)}


def test_budgeted_training_stops_and_snapshots(tmp_path):
    learning = load_script('bench/learning_arms.py', 'bench_learning_budget')

    class FakeTrainer:
        steps = 10
        state_file = tmp_path / 'mortal.pth'

        def save(self):
            self.state_file.write_text(f'steps {self.steps}')

    trainer = FakeTrainer()

    def train_batch(*batch):
        trainer.steps += 1

    step = learning._budgeted(trainer, train_batch, 10, 5, 2, tmp_path)
    for _ in range(5):
        step('batch')
    with pytest.raises(learning._StepBudget):
        step('batch')
    assert trainer.steps == 15
    assert sorted(p.name for p in tmp_path.glob('step_*')) == ['step_000002.pth', 'step_000004.pth']
    assert (tmp_path / 'step_000004.pth').read_text() == 'steps 14'


def test_vacuous_flaw_is_refused(tmp_path):
    with pytest.raises(SystemExit, match='RulebaseBot never folds'):
        flaw_bench.run(tmp_path, 'no-fold', games=4, sets=[], steps=1, minutes=0, snapshot_every=0, eval_sets=1,
                       curve_sets=0, teacher_sets=0, workers=1, key=1, eval_only=False, log=print)


def test_eval_only_without_a_start_says_so(tmp_path):
    with pytest.raises(SystemExit, match=r'flaw overcall: no start in .*start to evaluate: run it with --minutes'):
        flaw_bench.run(tmp_path, 'overcall', games=4, sets=[], steps=0, minutes=0, snapshot_every=0, eval_sets=1,
                       curve_sets=0, teacher_sets=0, workers=1, key=1, eval_only=True, log=print)


@pytest.mark.slow
def test_bootstrap_bots_carry_the_flaw(tmp_path):
    """One deal of four deterministic RulebaseBots (epsilon 0): the teacher declares riichi in it, the no-riichi
    bots never do, and the overcalling bots call more."""
    from mortal.tools.rulebase_games import play_set
    from mortal.stat import Stat
    counts = {}
    for flaw in ('', 'no-riichi', 'overcall'):
        d = tmp_path / (flaw or 'teacher')
        d.mkdir()
        assert play_set((str(d), 0, 77, 0.0, flaw))[2] is None
        events = [json.loads(line) for line in gzip.open(d / '0_77_a.json.gz', 'rt')]
        st = sum((Stat.from_log(events, seat) for seat in range(4)), Stat())
        counts[flaw] = (st.riichi, st.fuuro, st.round)
    assert counts[''][0] > 0 and counts['no-riichi'][0] == 0
    assert counts['overcall'][1] / counts['overcall'][2] > 2 * counts[''][1] / counts[''][2]


def test_flaw_decisions_find_the_rows_where_the_flaw_acts():
    import numpy as np
    masks = np.zeros((4, 46), dtype=bool)
    masks[0, [45, 38]] = True  # a chi or the pass: overcall's decision
    masks[1, [45, 41, 43]] = True  # a pon, a ron or the pass: overcall's decision
    masks[2, [45, 43]] = True  # a ron or the pass: no call offered
    masks[3, [37, 3, 5]] = True  # riichi or two discards: no-riichi's decision
    rows, flawed, correct = flaw_bench.flaw_decisions('overcall', masks)
    assert rows.tolist() == [0, 1] and correct == 45 and np.flatnonzero(flawed).tolist() == [38, 39, 40, 41]
    rows, flawed, correct = flaw_bench.flaw_decisions('no-riichi', masks)
    assert rows.tolist() == [3] and correct == 37 and np.flatnonzero(flawed).tolist() == list(range(37))
    with pytest.raises(ValueError, match='no-fold'):
        flaw_bench.flaw_decisions('no-fold', masks)


def test_q_margin_of_a_model_that_always_prefers_the_pass(tmp_path, tiny_config):
    """The advantage head's output layer zeroed but for a bias of +10 on the pass: at every call decision the best call is valued
    exactly 10 below the pass (the dueling mean shifts all legal actions alike), the pass is greedy and Boltzmann
    at T 0.05 picks it with probability 1."""
    import torch
    from conftest import DATA_DIR, write_baseline
    config, _ = tiny_config
    state_file = tmp_path / 'model.pth'
    write_baseline(config, state_file)
    state = torch.load(state_file, weights_only=False)
    dqn = state['current_dqn']
    last = max(k for k in dqn if k.startswith('a_head') and k.endswith('.bias')).rsplit('.', 1)[0]
    dqn[f'{last}.weight'].zero_()  # the advantage head's output layer: a constant, its bias
    dqn[f'{last}.bias'].zero_()
    dqn[f'{last}.bias'][45] = 10.0
    torch.save(state, state_file)
    out = flaw_bench.q_margin(state_file, [DATA_DIR / 'arena_double_ron_hanchan.json.gz'], 'overcall')
    assert out['decisions'] > 0
    assert out['margin'] == pytest.approx(-10.0, abs=1e-4)
    assert out['greedy_correct'] == 1.0
    assert out['p_correct@0.05'] == pytest.approx(1.0)


def test_an_unknown_bootstrap_flaw_is_named_with_the_choices(tmp_path):
    from mortal.config import ConfigError, load_config
    path = tmp_path / 'c.toml'
    path.write_text("[bootstrap]\nflaw = 'nofold'\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert (f"[bootstrap] flaw in {path} must be one of '', overcall, no-riichi, no-fold, got 'nofold'"
            in str(err.value))
