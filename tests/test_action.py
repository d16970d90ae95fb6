"""Action codec: index -> reaction -> validate_reaction, event -> label round trips.

Positions come from the real logs in tests/data (all four seats) and from
riichienv games whose every move is chosen from PlayerState's mask and sent to
the table through ``reaction_from_index`` (so the table accepts our reactions).
"""

import collections
import json
import random

import pytest
from mjai.mlibriichi.state import PlayerState

from mortal.features.action import (
    ACTION_SPACE, CHI_HIGH, CHI_LOW, CHI_MID, HORA, KAN, PASS, PON, RIICHI, RYUKYOKU,
    event_to_label, kan_select_label, reaction_from_index,
)
from mortal.features.tile import tile_id

VERSION = 3
KAN_TYPES = ("daiminkan", "ankan", "kakan")


def legal_indices(mask):
    return [i for i, m in enumerate(mask) if m]


def _is_kan_turn(cans):
    return cans.can_ankan or cans.can_kakan or cans.can_daiminkan


def _raises_value_error(state, i):
    try:
        reaction_from_index(state, i)
    except ValueError as e:
        return f"index {i} " in str(e)
    return False


def check_position(state, stats, check_illegal=True):
    """Every legal index (and kan-select tile) gives a reaction the state accepts.

    Also: label(reaction(i)) == i, and (if ``check_illegal``) the indices that
    the mask rules out raise ValueError naming the index.
    """
    cans = state.last_cans
    mask = state.encode_obs(VERSION, False)[1]
    legal = legal_indices(mask)
    assert legal, state.brief_info()
    for i in legal:
        r = reaction_from_index(state, i)
        state.validate_reaction(json.dumps(r))
        assert event_to_label(r) == i, (i, r)
        if r["type"] not in ("none", "ryukyoku"):
            assert r["actor"] == state.player_id
        stats[r["type"]] += 1
        if any(t.endswith("r") for t in r.get("consumed", [])) or r.get("pai", "").endswith("r"):
            stats["red:" + r["type"]] += 1
    if check_illegal:
        # After a riichi declaration the mask also requires tenpai, which the
        # codec does not recompute (documented), so discards are not checked then.
        skip_discards = state.self_riichi_declared and not state.self_riichi_accepted
        for i in range(0 if not skip_discards else RIICHI, ACTION_SPACE):
            if not mask[i]:
                assert _raises_value_error(state, i), (i, state.brief_info())
    if mask[KAN] and _is_kan_turn(cans):
        kmask = state.encode_obs(VERSION, True)[1]
        ktiles = legal_indices(kmask)
        assert ktiles and max(ktiles) < 34
        for t in ktiles:
            r = reaction_from_index(state, KAN, kan_select=t)
            state.validate_reaction(json.dumps(r))
            assert r["type"] in KAN_TYPES
            assert kan_select_label(r) == t
            stats["kan_select:" + r["type"]] += 1
        if len(ktiles) > 1:
            stats["kan_select_multi"] += 1
    return mask


def _consumed_ok(ours, theirs, state):
    """Same tiles; a red-five difference only where Mortal's agent spends the held red."""
    if ours == theirs:
        return True
    deaka = lambda ts: sorted(t.rstrip("r") for t in ts)  # noqa: E731
    return (deaka(ours) == deaka(theirs) and any(t.endswith("r") for t in ours)
            and not any(t.endswith("r") for t in theirs))


def check_round_trip(state, mask, following, stats):
    """The seat's logged decision maps to a legal label whose reaction matches it."""
    seat = state.player_id
    cans = state.last_cans
    nxt = following[0]
    horas = []
    for e in following:  # multi-ron: consecutive hora events
        if e["type"] != "hora":
            break
        horas.append(e)
    mine = [e for e in horas if e["actor"] == seat]
    if mine:
        ev = mine[0]
    elif nxt.get("actor") == seat and nxt["type"] != "tsumo":
        ev = nxt
    elif nxt["type"] == "ryukyoku" and cans.can_ryukyoku:
        ev = nxt
    else:
        return
    label = event_to_label(ev)
    assert label is not None and mask[label], (ev, legal_indices(mask))
    ks = kan_select_label(ev) if ev["type"] in KAN_TYPES else None
    if ks is not None and ev["type"] != "daiminkan":
        assert state.encode_obs(VERSION, True)[1][ks], ev
    r = reaction_from_index(state, label, kan_select=ks)
    assert r["type"] == ev["type"], (r, ev)
    for key in ("actor", "target", "pai", "tsumogiri"):
        if key in r and key in ev:
            if key == "pai" and ev["type"] == "kakan" and r[key] != ev[key]:
                assert r[key].rstrip("r") == ev[key].rstrip("r"), (r, ev)
                stats["red_diff:kakan"] += 1
            else:
                assert r[key] == ev[key], (key, r, ev)
    if "consumed" in ev:
        assert _consumed_ok(r["consumed"], ev["consumed"], state) or ev["type"] == "kakan", (r, ev)
        if r["consumed"] != ev["consumed"]:
            stats["red_diff:" + ev["type"]] += 1
    stats["round_trip:" + ev["type"]] += 1


def replay_log(lines, seat, stats, full=True):
    """Replay a log for one seat; check every decision point (all indices if ``full``)."""
    events = [json.loads(ln) for ln in lines]
    state = PlayerState(seat)
    for k, ln in enumerate(lines):
        if not state.update(ln).can_act:
            continue
        if full:
            mask = check_position(state, stats)
        else:
            mask = state.encode_obs(VERSION, False)[1]
        check_round_trip(state, mask, events[k + 1:], stats)
        stats["positions"] += 1


def test_real_logs_all_seats(fixture_logs):
    assert len(fixture_logs) == 2
    stats = collections.Counter()
    for path in fixture_logs:
        lines = path.read_text().splitlines()
        for seat in range(4):
            replay_log(lines, seat, stats)
    # README: 212-219 and 150-160 decision points per seat.
    assert 4 * (150 + 212) <= stats["positions"] <= 4 * (160 + 219)
    for ty in ("dahai", "reach", "chi", "pon", "daiminkan", "ankan", "hora", "none"):
        assert stats[ty] > 0, (ty, stats)
    for ty in ("dahai", "reach", "hora", "chi", "pon", "ankan"):
        assert stats["round_trip:" + ty] > 0, (ty, stats)


# --- generated games --------------------------------------------------------

# Biased random policy: calls and kans are taken often so that the positions
# cover every call kind and the red-five branches.
_PREFER = [(HORA, 0.95), (KAN, 0.9), (PON, 0.3), (CHI_LOW, 0.2), (CHI_MID, 0.2),
           (CHI_HIGH, 0.2), (RIICHI, 0.8), (RYUKYOKU, 0.5)]


def _tenhou(counts):
    """34 tile counts -> tenhou hand string ("123m55z") for tools.calc_shanten."""
    parts = []
    for k, suit in enumerate("mpsz"):
        n = 7 if suit == "z" else 9
        digits = "".join(str(j + 1) * counts[9 * k + j] for j in range(n))
        if digits:
            parts.append(digits + suit)
    return "".join(parts)


def _greedy_discard(rng, state, legal):
    """A discard that keeps shanten lowest (ties broken at random), so hands win."""
    from mjai.mlibriichi.tools import calc_shanten

    discards = [i for i in legal if i < 37]
    if not discards:
        return None
    tehai = list(state.tehai)
    best, scores = None, {}
    for i in discards:
        p = i if i < 34 else {34: 4, 35: 13, 36: 22}[i]
        tehai[p] -= 1
        scores[i] = calc_shanten(_tenhou(tehai))
        tehai[p] += 1
    best = min(scores.values())
    return rng.choice([i for i, v in scores.items() if v == best])


def _choose(rng, state, mask):
    legal = legal_indices(mask)
    for i, p in _PREFER:
        if mask[i] and rng.random() < p:
            break
    else:
        i = _greedy_discard(rng, state, legal) if rng.random() < 0.9 else None
        if i is None:
            i = rng.choice(legal)
    kan_select = None
    if i == KAN and _is_kan_turn(state.last_cans) and not state.last_cans.can_daiminkan:
        kan_select = rng.choice(legal_indices(state.encode_obs(VERSION, True)[1]))
    return i, kan_select


def play_game(seed, stats, max_steps=5000):
    from riichienv import GameRule, RiichiEnv

    rng = random.Random(seed)
    env = RiichiEnv(game_mode="4p-red-half", seed=seed, rule=GameRule.default_tenhou())
    obs = env.reset()
    states = [PlayerState(s) for s in range(4)]
    for _ in range(max_steps):
        if env.done():
            break
        actions = {}
        for seat, o in obs.items():
            state = states[seat]
            for e in o.new_events():
                state.update(e)
            assert state.last_cans.can_act, state.brief_info()
            mask = check_position(state, stats, check_illegal=rng.random() < 0.2)
            i, ks = _choose(rng, state, mask)
            reaction = reaction_from_index(state, i, kan_select=ks)
            action = o.select_action_from_mjai(json.dumps(reaction))
            assert action is not None, (seed, reaction)
            actions[seat] = action
            stats["positions"] += 1
        obs = env.step(actions)
        assert obs or env.done(), f"table stopped answering, game seed {seed}"
    if env.done():
        return [json.dumps(e) for e in env.mjai_log]
    raise AssertionError(f"game seed {seed} did not finish in {max_steps} steps")


@pytest.mark.slow
def test_generated_games():
    stats = collections.Counter()
    trips = collections.Counter()
    for seed in range(4):
        log = play_game(seed, stats)
        # The table logged what our reactions asked for: the round trip over its
        # log reproduces every call exactly, red fives included.
        for seat in range(4):
            replay_log(log, seat, trips, full=False)
    for ty in ("chi", "pon", "daiminkan", "ankan", "kakan", "hora", "reach", "none",
               "kan_select:ankan", "kan_select:kakan", "red:chi", "red:pon", "red:dahai"):
        assert stats[ty] > 0, (ty, stats)
    for ty in ("dahai", "chi", "pon", "daiminkan", "ankan", "kakan", "hora", "reach"):
        assert trips["round_trip:" + ty] > 0, (ty, trips)
    assert not any(k.startswith("red_diff") for k in trips), trips


# --- hand-made positions ------------------------------------------------------

def _state(seat, tehai, events, oya=0):
    """PlayerState for ``seat`` after start_kyoku with its 13 tiles and ``events``."""
    tehais = [["?"] * 13 for _ in range(4)]
    tehais[seat] = tehai
    state = PlayerState(seat)
    state.update(json.dumps({"type": "start_game", "names": list("abcd")}))
    state.update(json.dumps({
        "type": "start_kyoku", "bakaze": "E", "dora_marker": "N", "kyoku": oya + 1,
        "honba": 0, "kyotaku": 0, "oya": oya, "scores": [25000] * 4, "tehais": tehais}))
    for e in events:
        state.update(json.dumps(e))
    return state


def _t(actor, pai="?"):
    return {"type": "tsumo", "actor": actor, "pai": pai}


def _d(actor, pai, tsumogiri=False):
    return {"type": "dahai", "actor": actor, "pai": pai, "tsumogiri": tsumogiri}


HAND_CHI = ["4m", "5mr", "7m", "8m", "1p", "2p", "3p", "7p", "8p", "9p", "E", "E", "S"]


@pytest.mark.parametrize("called, index, consumed", [
    ("3m", CHI_LOW, ["4m", "5mr"]),   # 3m with 4m,5mr held -> the red five is spent
    ("6m", CHI_HIGH, ["4m", "5mr"]),
    ("6m", CHI_MID, ["5mr", "7m"]),
    ("9m", CHI_HIGH, ["7m", "8m"]),
])
def test_chi_spends_held_red(called, index, consumed):
    state = _state(1, HAND_CHI, [_t(0), _d(0, called)])
    r = reaction_from_index(state, index)
    assert r == {"type": "chi", "actor": 1, "target": 0, "pai": called, "consumed": consumed}
    state.validate_reaction(json.dumps(r))
    assert event_to_label(r) == index


def test_chi_called_red_five():
    hand = ["4p", "6p", "7p", "3p", "1s", "2s", "3s", "7s", "8s", "9s", "E", "E", "S"]
    state = _state(1, hand, [_t(0), _d(0, "5pr")])
    mask = state.encode_obs(VERSION, False)[1]
    assert legal_indices(mask) == [CHI_LOW, CHI_MID, CHI_HIGH, PASS]
    assert reaction_from_index(state, CHI_MID)["consumed"] == ["4p", "6p"]
    assert reaction_from_index(state, CHI_LOW)["consumed"] == ["6p", "7p"]
    assert reaction_from_index(state, CHI_HIGH)["consumed"] == ["3p", "4p"]
    assert event_to_label({"type": "chi", "pai": "5pr", "consumed": ["4p", "6p"]}) == CHI_MID


@pytest.mark.parametrize("hand5, called, consumed", [
    (["5p", "5pr"], "5p", ["5pr", "5p"]),   # plain five called, red held -> red spent
    (["5p", "5p"], "5p", ["5p", "5p"]),
    (["5p", "5p"], "5pr", ["5p", "5p"]),    # red five called -> two plain
])
def test_pon_red_choice(hand5, called, consumed):
    hand = hand5 + ["1m", "2m", "3m", "7m", "8m", "9m", "E", "S", "W", "N", "C"][:13 - len(hand5)]
    state = _state(0, hand, [_t(0, "P"), _d(0, "P", True), _t(1), _d(1, "1s"),
                             _t(2), _d(2, called)])
    assert state.last_cans.can_pon
    r = reaction_from_index(state, PON)
    assert r == {"type": "pon", "actor": 0, "target": 2, "pai": called, "consumed": consumed}
    state.validate_reaction(json.dumps(r))


def test_daiminkan_plain_five_assumes_red():
    hand = ["5s", "5s", "5sr", "1m", "2m", "3m", "7m", "8m", "9m", "E", "S", "W", "N"]
    state = _state(0, hand, [_t(0, "P"), _d(0, "P", True), _t(1), _d(1, "5s")])
    r = reaction_from_index(state, KAN)
    assert r == {"type": "daiminkan", "actor": 0, "target": 1, "pai": "5s",
                 "consumed": ["5sr", "5s", "5s"]}
    state.validate_reaction(json.dumps(r))
    assert kan_select_label(r) == 22
    # The forced tile is accepted from a kan-select pass; another tile is not.
    assert reaction_from_index(state, KAN, kan_select=22) == r
    with pytest.raises(ValueError, match="index 42"):
        reaction_from_index(state, KAN, kan_select=0)


def _kakan_state(pai, pon_consumed, draw):
    """Seat 0 pons ``pai`` (with ``pon_consumed``) from seat 3, then draws ``draw``."""
    hand = pon_consumed + ["1m", "2m", "3m", "7m", "8m", "9m", "1p", "2p", "3p", "E", "E"]
    return _state(0, hand, [
        _t(0, "N"), _d(0, "N", True), _t(1), _d(1, "1s"), _t(2), _d(2, "2s"),
        _t(3), _d(3, pai),
        {"type": "pon", "actor": 0, "target": 3, "pai": pai, "consumed": pon_consumed},
        _d(0, "E"), _t(1), _d(1, "1s"), _t(2), _d(2, "2s"), _t(3), _d(3, "3s"), _t(0, draw)])


@pytest.mark.parametrize("pon_pai, pon_consumed, draw, pai, consumed", [
    # The red five is in the meld (called or consumed): the added tile is plain.
    ("5sr", ["5s", "5s"], "5s", "5s", ["5sr", "5s", "5s"]),
    ("5s", ["5sr", "5s"], "5s", "5s", ["5sr", "5s", "5s"]),
    # The red five is drawn: it is the added tile.
    ("5s", ["5s", "5s"], "5sr", "5sr", ["5s", "5s", "5s"]),
])
def test_kakan_red_choice(pon_pai, pon_consumed, draw, pai, consumed):
    state = _kakan_state(pon_pai, pon_consumed, draw)
    assert state.kakan_candidates() == ["5s"]
    assert legal_indices(state.encode_obs(VERSION, True)[1]) == [22]
    expected = {"type": "kakan", "actor": 0, "pai": pai, "consumed": consumed}
    assert reaction_from_index(state, KAN) == expected
    assert reaction_from_index(state, KAN, kan_select=22) == expected
    state.validate_reaction(json.dumps(expected))
    assert kan_select_label(expected) == 22 and event_to_label(expected) == KAN


def test_ankan_red_and_kan_select():
    hand = ["5m", "5m", "5mr", "E", "E", "E", "E", "1p", "2p", "3p", "9s", "9s", "N"]
    state = _state(0, hand, [_t(0, "5m")])
    assert sorted(state.ankan_candidates()) == ["5m", "E"]
    kmask = state.encode_obs(VERSION, True)[1]
    assert legal_indices(kmask) == [4, 27]
    # Default: Mortal takes the first ankan candidate.
    first = reaction_from_index(state, KAN)
    assert kan_select_label(first) == tile_id(state.ankan_candidates()[0])
    r = reaction_from_index(state, KAN, kan_select=4)
    assert r == {"type": "ankan", "actor": 0, "consumed": ["5mr", "5m", "5m", "5m"]}
    state.validate_reaction(json.dumps(r))
    r = reaction_from_index(state, KAN, kan_select=27)
    assert r == {"type": "ankan", "actor": 0, "consumed": ["E", "E", "E", "E"]}
    assert kan_select_label(r) == 27
    with pytest.raises(ValueError, match="not a kan candidate"):
        reaction_from_index(state, KAN, kan_select=9)


def test_tsumogiri_is_red_sensitive():
    hand = ["5m", "1m", "2m", "3m", "7m", "8m", "9m", "1p", "2p", "3p", "E", "E", "S"]
    state = _state(0, hand, [_t(0, "5mr")])
    assert reaction_from_index(state, 34) == {"type": "dahai", "actor": 0, "pai": "5mr",
                                              "tsumogiri": True}
    assert reaction_from_index(state, 4)["tsumogiri"] is False
    hand[0] = "5mr"
    state = _state(0, hand, [_t(0, "5m")])
    assert reaction_from_index(state, 4)["tsumogiri"] is True
    assert reaction_from_index(state, 34)["tsumogiri"] is False
    # Only one five, the red one: the plain id is not held.
    hand[0] = "5mr"
    state = _state(0, hand, [_t(0, "S")])
    with pytest.raises(ValueError, match="index 4 .*5m is not in hand"):
        reaction_from_index(state, 4)
    assert reaction_from_index(state, 27)["tsumogiri"] is False


def test_hora_target_and_pass():
    hand = ["1m", "2m", "3m", "4m", "5m", "6m", "7m", "8m", "9m", "1p", "2p", "3p", "E"]
    ron = _state(0, hand, [_t(0, "N"), _d(0, "N", True), _t(1), _d(1, "1s"), _t(2),
                           _d(2, "2s"), _t(3), _d(3, "E")])
    assert ron.last_cans.can_ron_agari
    assert reaction_from_index(ron, HORA) == {"type": "hora", "actor": 0, "target": 3}
    assert reaction_from_index(ron, PASS) == {"type": "none"}
    tsumo = _state(0, hand, [_t(0, "E")])
    assert reaction_from_index(tsumo, HORA) == {"type": "hora", "actor": 0, "target": 0}
    tsumo.validate_reaction(json.dumps({"type": "hora", "actor": 0, "target": 0}))
    # A pass on one's own turn would stall the board.
    with pytest.raises(ValueError, match="index 45"):
        reaction_from_index(tsumo, PASS)


def test_kyuushu_ryukyoku():
    hand = ["1m", "9m", "1p", "9p", "1s", "9s", "E", "S", "W", "N", "2m", "3m", "4m"]
    state = _state(0, hand, [_t(0, "P")])
    mask = state.encode_obs(VERSION, False)[1]
    assert mask[RYUKYOKU]
    r = reaction_from_index(state, RYUKYOKU)
    assert r == {"type": "ryukyoku"}
    state.validate_reaction(json.dumps(r))
    assert event_to_label({"type": "ryukyoku", "actor": 0}) == RYUKYOKU


def test_kyuushu_accepted_by_table():
    """riichienv takes Mortal's actor-less ``{"type": "ryukyoku"}`` as kyuushu kyuuhai."""
    from riichienv import ActionType, GameRule, RiichiEnv

    # riichienv 0.4.11: the seed-412 deal gives the dealer nine terminal/honor kinds.
    env = RiichiEnv(game_mode="4p-red-half", seed=412, rule=GameRule.default_tenhou())
    o = env.reset()[0]
    state = PlayerState(0)
    for e in o.new_events():
        state.update(e)
    assert state.last_cans.can_ryukyoku, "seed 412 no longer deals a kyuushu hand"
    action = o.select_action_from_mjai(json.dumps(reaction_from_index(state, RYUKYOKU)))
    assert action.action_type == ActionType.KYUSHU_KYUHAI
    env.step({0: action})
    kinds = [e["type"] for e in env.mjai_log]
    assert kinds[-4:-2] == ["ryukyoku", "end_kyoku"] and env.mjai_log[-2]["honba"] == 1


def test_bad_indices():
    state = _state(0, HAND_CHI, [_t(0, "P")])
    for bad in (-1, 46):
        with pytest.raises(ValueError, match=f"index {bad} outside"):
            reaction_from_index(state, bad)
    with pytest.raises(ValueError, match="index 41 .*cannot pon"):
        reaction_from_index(state, PON)
    with pytest.raises(ValueError, match="index 37 .*cannot riichi"):
        reaction_from_index(state, RIICHI)


def test_event_to_label():
    assert event_to_label({"type": "dahai", "actor": 0, "pai": "5pr", "tsumogiri": False}) == 35
    assert event_to_label({"type": "dahai", "actor": 0, "pai": "C", "tsumogiri": True}) == 33
    assert event_to_label({"type": "reach", "actor": 2}) == RIICHI
    assert event_to_label({"type": "chi", "pai": "3m", "consumed": ["4m", "5mr"]}) == CHI_LOW
    assert event_to_label({"type": "chi", "pai": "5mr", "consumed": ["6m", "4m"]}) == CHI_MID
    assert event_to_label({"type": "chi", "pai": "7s", "consumed": ["5sr", "6s"]}) == CHI_HIGH
    assert event_to_label({"type": "pon", "pai": "E", "consumed": ["E", "E"]}) == PON
    for ty in KAN_TYPES:
        assert event_to_label({"type": ty}) == KAN
    assert event_to_label({"type": "hora", "actor": 1, "target": 2}) == HORA
    assert event_to_label({"type": "none"}) == PASS
    for ty in ("tsumo", "start_kyoku", "dora", "end_kyoku", "reach_accepted"):
        assert event_to_label({"type": ty}) is None
    with pytest.raises(ValueError, match="'pai'"):
        event_to_label({"type": "dahai", "actor": 0})
    with pytest.raises(ValueError, match="not an mjai tile"):
        event_to_label({"type": "dahai", "actor": 0, "pai": "0m"})


def test_kan_select_label():
    assert kan_select_label({"type": "ankan", "consumed": ["5pr", "5p", "5p", "5p"]}) == 13
    assert kan_select_label({"type": "kakan", "pai": "5sr", "consumed": ["5s"] * 3}) == 22
    assert kan_select_label({"type": "daiminkan", "pai": "C", "consumed": ["C"] * 3}) == 33
    with pytest.raises(ValueError, match="not a kan event"):
        kan_select_label({"type": "pon", "pai": "C"})

