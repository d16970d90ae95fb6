"""Arena agents: quick eval, kan-select second pass, meta, agari guard, mjai-bot adapter."""

import json

import numpy as np
import pytest
from mjai.mlibriichi.state import PlayerState

from mortal.play.agent import IllegalReaction, MjaiBotAgent, MortalBatchAgent, Scene, rule_based_agari

UNK = ["?"] * 13


def make_state(seat, events):
    st = PlayerState(seat)
    st.update(json.dumps({"type": "start_game"}))
    for ev in events:
        st.update(json.dumps(ev))
    return st


def start(bakaze, kyoku, oya, scores, tehai0):
    return {"type": "start_kyoku", "bakaze": bakaze, "dora_marker": "9s", "kyoku": kyoku, "honba": 0,
            "kyotaku": 0, "oya": oya, "scores": scores, "tehais": [tehai0, UNK, UNK, UNK]}


TENPAI = ["1m", "2m", "3m", "4m", "5m", "6m", "7m", "8m", "9m", "1p", "2p", "3p", "5p"]


def tsumo_win_state(bakaze, kyoku, scores):
    # seat 0 (not dealer: oya = 3) draws 5p: menzen tsumo, ittsu
    return make_state(0, [start(bakaze, kyoku, 3, scores, TENPAI), {"type": "tsumo", "actor": 0, "pai": "5p"}])


class StubEngine:
    """Records batches; q = index-based preference given per test."""

    engine_type = "mortal"
    is_oracle = False
    version = 3

    def __init__(self, prefer, quick_eval=True, guard=False):
        self.name = "stub"
        self.prefer = np.asarray(prefer, dtype=np.float64)
        self.enable_quick_eval = quick_eval
        self.enable_rule_based_agari_guard = guard
        self.batches = []

    def react_batch(self, obs, masks, invisible_obs=None):
        self.batches.append(len(obs))
        assert all(o.dtype == np.float32 and o.shape == (934, 34) for o in obs)
        m = np.stack(masks)
        q = np.broadcast_to(self.prefer, m.shape).copy()
        q[~m] = -np.inf
        return q.argmax(1).tolist(), q.tolist(), m.tolist(), [True] * len(obs)


# ---------------------------------------------------------------- agari guard


def test_agari_guard_allows_before_all_last():
    st = tsumo_win_state("E", 1, [10000, 32000, 30000, 28000])

    def boom():
        raise AssertionError("not needed before all-last")

    assert rule_based_agari(st, boom) is True


def test_agari_guard_blocks_win_that_ends_game_in_4th():
    st = tsumo_win_state("S", 4, [10000, 32000, 30000, 28000])
    assert rule_based_agari(st, lambda: [13000, 31000, 29000, 27000]) is False
    assert rule_based_agari(st, lambda: [29000, 26000, 24000, 21000]) is True  # leaves 4th
    assert rule_based_agari(st, lambda: [13000, 29900, 29900, 27200]) is True  # West extension


def test_agari_guard_allows_s4_when_nobody_has_30000():
    st = tsumo_win_state("S", 4, [16000, 29000, 29000, 26000])
    assert rule_based_agari(st, lambda: [0, 0, 0, 0]) is True


def test_agent_guard_takes_best_non_agari_action():
    st = tsumo_win_state("S", 4, [10000, 32000, 30000, 28000])
    prefer = np.arange(46, dtype=np.float64)
    prefer[43] = 100.0  # network wants tsumo
    eng = StubEngine(prefer, guard=True)
    agent = MortalBatchAgent(eng)
    (dec,) = agent.react([Scene(0, 0, st, [], lambda: [13000, 31000, 29000, 27000])])
    # best remaining legal index: riichi (37) beats every discard (<= 13)
    assert dec.reaction == {"type": "reach", "actor": 0}
    assert max(dec.meta["q_values"]) == 100.0  # meta keeps the network's q-values
    (dec,) = MortalBatchAgent(StubEngine(prefer, guard=False)).react(
        [Scene(0, 0, st, [], lambda: [13000, 31000, 29000, 27000])])
    assert dec.reaction["type"] == "hora"


# ---------------------------------------------------------------- quick eval, meta, kan select


def riichi_tsumo_state():
    tehai = ["1m", "2m", "3m", "4m", "5m", "6m", "7m", "8m", "9m", "1p", "2p", "3p", "5p"]
    evs = [start("E", 1, 0, [25000] * 4, tehai),
           {"type": "tsumo", "actor": 0, "pai": "N"},
           {"type": "reach", "actor": 0},
           {"type": "dahai", "actor": 0, "pai": "N", "tsumogiri": True},
           {"type": "reach_accepted", "actor": 0}]
    for a in (1, 2, 3):
        evs += [{"type": "tsumo", "actor": a, "pai": "?"}, {"type": "dahai", "actor": a, "pai": "W", "tsumogiri": True}]
    evs.append({"type": "tsumo", "actor": 0, "pai": "S"})
    return make_state(0, evs)


def test_quick_eval_skips_engine_in_riichi():
    st = riichi_tsumo_state()
    eng = StubEngine(np.zeros(46))
    (dec,) = MortalBatchAgent(eng).react([Scene(0, 0, st)])
    assert dec.reaction == {"type": "dahai", "actor": 0, "pai": "S", "tsumogiri": True}
    assert dec.meta is None and eng.batches == []
    eng = StubEngine(np.zeros(46), quick_eval=False)
    (dec,) = MortalBatchAgent(eng).react([Scene(0, 0, st)])
    assert eng.batches == [1] and dec.meta["mask_bits"] == 1 << 28 and dec.meta["q_values"] == [0.0]


def test_meta_fields_and_one_call_per_batch():
    sts = [tsumo_win_state("E", 1, [25000] * 4), make_state(0, [start("E", 1, 0, [25000] * 4, TENPAI),
                                                               {"type": "tsumo", "actor": 0, "pai": "E"}])]
    prefer = -np.arange(46, dtype=np.float64)  # lowest legal index wins
    eng = StubEngine(prefer)
    decs = MortalBatchAgent(eng).react([Scene(0, 0, sts[0]), Scene(1, 0, sts[1])])
    assert eng.batches == [2]
    assert decs[1].reaction == {"type": "dahai", "actor": 0, "pai": "1m", "tsumogiri": False}
    meta = decs[1].meta
    held = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 27, 37]  # 1m-9m 1p 2p 3p 5p E, riichi
    assert meta["mask_bits"] == sum(1 << i for i in held)
    assert meta["q_values"] == [-float(i) for i in held]
    assert meta["batch_size"] == 2 and meta["is_greedy"] is True and meta["shanten"] == 0
    assert meta["at_furiten"] is False and meta["eval_time_ns"] > 0 and "kan_select" not in meta


def test_kan_select_second_pass_in_same_batch():
    tehai = ["1m", "1m", "1m", "1m", "9p", "9p", "9p", "9p", "1s", "2s", "3s", "E", "E"]
    st = make_state(0, [start("E", 1, 0, [25000] * 4, tehai), {"type": "tsumo", "actor": 0, "pai": "W"}])
    prefer = np.arange(46, dtype=np.float64)
    prefer[42] = 1000.0  # kan; among kan tiles the highest id (9p = 17) wins
    eng = StubEngine(prefer)
    (dec,) = MortalBatchAgent(eng).react([Scene(0, 0, st)])
    assert eng.batches == [2]
    assert dec.reaction == {"type": "ankan", "actor": 0, "consumed": ["9p", "9p", "9p", "9p"]}
    ks = dec.meta["kan_select"]
    assert ks["mask_bits"] == (1 << 0) | (1 << 17) and ks["q_values"] == [0.0, 17.0]
    assert set(ks) == {"q_values", "mask_bits", "is_greedy", "shanten", "at_furiten"}


def test_illegal_engine_action_raises_with_place():
    st = tsumo_win_state("E", 1, [25000] * 4)

    class Bad(StubEngine):
        def react_batch(self, obs, masks, invisible_obs=None):
            a, q, m, g = super().react_batch(obs, masks)
            return [45] * len(a), q, m, g

    with pytest.raises(IllegalReaction) as e:
        MortalBatchAgent(Bad(np.zeros(46))).react([Scene(5, 0, st)])
    assert e.value.game == 5 and e.value.seat == 0


# ---------------------------------------------------------------- mjai bots


class ScriptBot:
    def __init__(self, answers):
        self.answers = list(answers)
        self.seen = []

    def react(self, events_json):
        self.seen.append(json.loads(events_json))
        return self.answers.pop(0)


def test_bot_adapter_passes_legal_and_substitutes_illegal():
    st = make_state(0, [start("E", 1, 0, [25000] * 4, TENPAI), {"type": "tsumo", "actor": 0, "pai": "E"}])
    answers = ['{"type":"dahai","actor":0,"pai":"E","tsumogiri":true}',
               '{"type":"dahai","actor":0,"pai":"S","tsumogiri":true}',  # not in hand
               'not json',
               '{"type":"none"}']  # pass on own turn
    bots = {}
    agent = MjaiBotAgent(lambda seat: bots.setdefault(seat, ScriptBot(answers)), name="script")
    decs = [agent.react([Scene(0, 0, st, ['{"type":"start_game"}'])])[0] for _ in range(4)]
    assert decs[0].reaction == {"type": "dahai", "actor": 0, "pai": "E", "tsumogiri": True}
    first = {"type": "dahai", "actor": 0, "pai": "1m", "tsumogiri": False}
    assert [d.reaction for d in decs[1:]] == [first] * 3
    assert agent.substitutions == 3
    assert bots[0].seen[0] == [{"type": "start_game"}]
    agent.end_game(0, 0)
    assert agent.bots == {}


def test_bot_adapter_rejects_kuikae_discard():
    # seat 0 chis 3m with 1m2m from seat 3, then tries to discard 3m (kuikae)
    tehai = ["1m", "2m", "3m", "5p", "6p", "7p", "1s", "2s", "3s", "E", "E", "N", "N"]
    evs = [start("E", 1, 3, [25000] * 4, tehai),
           {"type": "tsumo", "actor": 3, "pai": "?"},
           {"type": "dahai", "actor": 3, "pai": "3m", "tsumogiri": True},
           {"type": "chi", "actor": 0, "target": 3, "pai": "3m", "consumed": ["1m", "2m"]}]
    st = make_state(0, evs)
    agent = MjaiBotAgent(lambda seat: ScriptBot(['{"type":"dahai","actor":0,"pai":"3m","tsumogiri":false}']))
    (dec,) = agent.react([Scene(0, 0, st)])
    assert agent.substitutions == 1 and dec.reaction["pai"] != "3m"


# ---------------------------------------------------------------- the ukeire cache of mjai's bots

def _fresh_cache(monkeypatch):
    # an empty cache for this test (another test may have filled the process's one); monkeypatch restores it
    import mjai.bot.base as base
    from mortal.play.agent import cache_improving_tiles
    current = base.find_improving_tiles
    monkeypatch.setattr(base, 'find_improving_tiles', getattr(current, 'cached_original', current))
    cache_improving_tiles()
    return base.find_improving_tiles


def test_improving_tiles_cache_keeps_mjai_answers_and_hits(monkeypatch):
    import mjai.bot.base as base
    from mortal.play.agent import cache_improving_tiles

    _fresh_cache(monkeypatch)
    cache_improving_tiles()  # idempotent: not wrapped twice
    cached = base.find_improving_tiles
    original = cached.cached_original
    assert getattr(original, 'cached_original', None) is None
    # 13 tiles, 123456789m + 1234p: waits on 1p (index 9, 234p + 1p pair) or 4p (index 12, 123p + 4p pair);
    # 34 = no discard (the hand already has 13 tiles)
    assert cached('123456789m1234p') == [(34, [9, 12])] == original('123456789m1234p')
    # 14 tiles: every discard candidate mjai finds, in mjai's order
    hand = '1269m134p34579s56z'
    before = cached.cache_info()
    first = cached(hand)
    assert first == original(hand) and len(first) > 1
    first[0][1].append(99)  # a caller editing its copy changes neither the cache nor the next answer
    first.clear()
    again = cached(hand)
    assert again == original(hand)
    info = cached.cache_info()
    assert (info.hits - before.hits, info.misses - before.misses) == (1, 1)


def test_rulebase_bot_plays_the_same_discards_with_the_cache(monkeypatch):
    # The same bot on the same events with and without the cache: identical reactions (the cache is transparent).
    import mjai.bot.base as base
    from mjai.bot.rulebase import RulebaseBot

    cached = _fresh_cache(monkeypatch)
    events = [
        {"type": "start_game", "id": 0},
        {"type": "start_kyoku", "bakaze": "E", "dora_marker": "2s", "kyoku": 1, "honba": 0, "kyotaku": 0, "oya": 0,
         "scores": [25000] * 4,
         "tehais": [["1m", "2m", "6m", "9m", "1p", "3p", "4p", "3s", "4s", "5s", "7s", "9s", "P"],
                    ["?"] * 13, ["?"] * 13, ["?"] * 13]},
        {"type": "tsumo", "actor": 0, "pai": "F"},
    ]
    answers = []
    calls = sum(cached.cache_info()[:2])  # hits + misses
    try:
        for fn in (cached.cached_original, cached):
            base.find_improving_tiles = fn
            bot = RulebaseBot(0)
            answers.append(json.loads(bot.react(json.dumps(events))))
    finally:
        base.find_improving_tiles = cached
    assert cached.cache_info().misses > 0 and sum(cached.cache_info()[:2]) > calls  # the second bot used the cache
    assert answers[0] == answers[1]
    assert answers[0]['type'] == 'dahai' and answers[0]['actor'] == 0
    # 3-shanten (345s; 12m, 34p, 79s), no pair: 6m 9m 1p 4p P F keep it (4p leaves the 13p kanchan)
    assert answers[0]['pai'] in ('6m', '9m', '1p', '4p', 'P', 'F')
