"""Observation v4: row layout (Mortal's obs_repr.rs, version 4), shanten/agari/points, SP values by hand.

Shanten, agari and the SP search are checked by hand on both the compiled core (what the project runs) and the
pure-Python oracle (tests/sp_oracle) that tests/test_sp_core.py compares the core against."""

import json

import numpy as np
import pytest
from mjai.mlibriichi.state import PlayerState

from mortal.features.obs_v4 import OBS_CHANNELS_V4, ROW_TABLE, SP_BEST, SP_REQUIRED, SP_START, SP_TABLE, V4Encoder
from mortal.features.sp.calc import require_core
from sp_oracle import core_py as core
from sp_oracle.core_py import Hand, SPCalculator
from sp_oracle.point import point

from conftest import hand
from sp_oracle import agari as oracle_agari, search as oracle_search
from sp_oracle.shanten import calc_all_py

SHANTEN = {'core': core.calc_all, 'oracle': calc_all_py}
# search_yakus is agari without situational han (a yaku-less hand: None either way)
SEARCH_YAKUS = {'core': lambda h: core.agari(h, 0, 0), 'oracle': oracle_agari.search_yakus}
AGARI = {'core': core.agari, 'oracle': oracle_agari.agari}
SEARCH = {'core': SPCalculator.calc, 'oracle': oracle_search.calc}
BOTH = pytest.mark.parametrize('impl', ['core', 'oracle'])


# ---- layout ----------------------------------------------------------------------------------

def test_row_table_matches_semantics_6_1():
    # v4 counts of blocks 1-23 in Mortal's obs_repr.rs, version 4
    v4_counts = [4, 3, 8, 4, 4, 2, 2, 1, 7, 96, 1, 585, 1, 4, 1, 28, 80, 4, 19, 6, 2, 7, 20]
    assert sum(v4_counts) == 889 and 889 + 123 == OBS_CHANNELS_V4
    starts = np.cumsum([0] + v4_counts)
    # our grouped table starts where the spec's blocks start
    spec_start = {"tehai": 0, "akas_in_hand": 1, "scores": 2, "rank": 3, "kyoku": 4,
                  "honba_kyotaku": 5, "bakaze_jikaze": 6, "grand_kyoku": 7, "dora_indicators": 8,
                  "kawa_and_tiles_left": 9, "doras_owned": 13, "doras_unseen": 14, "rest_v3": 15}
    end = 0
    for name, start, _, n in ROW_TABLE:
        assert start == starts[spec_start[name]], name
        assert start == end
        end = start + n
    assert end == SP_START == 889
    # v3 sources: rank at 47, tiles_left at 751 (spot-checked in the spec), kawa overview at 768
    src = {name: s for name, _, s, _ in ROW_TABLE}
    assert src["rank"] == 47 and src["kawa_and_tiles_left"] + 682 == 751 and src["rest_v3"] == 768
    assert SP_REQUIRED == 891 and SP_BEST == 959 and SP_TABLE == 961 and SP_TABLE + 51 == 1012


def _events(path):
    for line in open(path):
        e = json.loads(line)
        e.pop("meta", None)
        yield e


def test_repack_against_v3_on_real_log(fixture_logs):
    path = [p for p in fixture_logs if "meta_annotated" in p.name][0]
    ps = PlayerState(1)
    checked = 0
    for e in _events(path):
        ps.update(json.dumps(e))
        if e["type"] != "dahai":
            continue
        v3, _ = ps.encode_obs(3, False)
        out = np.zeros((1012, 34), np.float32)
        require_core().repack_v3(v3, tuple(ps.scores), ps.honba, ps.kyotaku, out)
        s = ps.scores
        for p in range(4):
            assert out[7 + 2 * p, 0] == pytest.approx(min(max(s[p], 0), 100000) / 1e5)
            assert out[8 + 2 * p, 0] == pytest.approx(min(max(s[p], 0), 30000) / 3e4)
        assert out[23, 5] == pytest.approx(min(ps.honba, 10) / 10)
        assert out[24, 5] == pytest.approx(min(ps.kyotaku, 10) / 10)
        assert (out[0:7] == v3[0:7]).all() and (out[35:718] == v3[69:752]).all()
        assert out[717, 0] == pytest.approx(v3[751, 0])           # tiles_left/69
        assert (out[718:722, 0] == v3[[752, 755, 758, 761], 0]).all()
        assert (out[723:889] == v3[768:934]).all()
        assert (out[889:] == 0).all()
        checked += 1
    assert checked > 100


# ---- shanten / agari / points -------------------------------------------------------------------

@pytest.mark.parametrize("tiles,len_div3,expected", [
    ("1111m 333p 222s 444z", 4, 1),     # four-copies limit: no 5th 1m for a pair
    ("147m 258p 369s 1234z", 4, 6),
    ("19m 19p 159s 123456z", 4, 1),     # kokushi
    ("9999m 6677p 88s 355z", 4, 2),     # chitoi with a quad
    ("4455s", 1, 0),
    ("55m", 0, -1),
    ("12223456m 78889p 2m", 4, -1),
])
@BOTH
def test_shanten(tiles, len_div3, expected, impl):
    assert SHANTEN[impl](hand(tiles), len_div3) == expected


def _hand(tiles, win, *, ron, menzen=True, chis=(), pons=(), minkans=(), ankans=(), bakaze=27, jikaze=28):
    return Hand(tuple(hand(tiles)), menzen, chis, pons, minkans, ankans, bakaze, jikaze, win, ron)


@BOTH
def test_agari_values(impl):
    search_yakus, agari = SEARCH_YAKUS[impl], AGARI[impl]
    # pinfu + tanyao + iipeikou + sanshoku? 2234455m 234p 234s +3m ron: tanyao, sanshoku 2, iipeikou 1 = 4 han 40 fu
    y = search_yakus(_hand("22334455m 234p 234s", 2, ron=True))
    assert (y.han, y.fu) == (4, 40)
    # chitoi + tanyao = 3 han 25 fu
    y = search_yakus(_hand("2255m 4455p 667788s", 13, ron=True))
    assert (y.han, y.fu) == (3, 25)
    # no yaku: open-less but 1123488p with 234678m, ron 8p -> none; riichi would give 1 han 40 fu
    h = _hand("234678m 11234888p", 16, ron=True, jikaze=27)
    assert search_yakus(h) is None
    assert agari(h, 0, 0) is None
    y = agari(h, 1, 0)
    assert (y.han, y.fu) == (1, 40)
    # daisangen + tsuuiisou + suuankou style stack: 3 yakuman
    y = search_yakus(_hand("11122233344477z", 33, ron=True, jikaze=27))
    assert y.yakuman == 3


def test_points_table():
    assert point(False, 30, 1) == (1000, 300, 500)
    assert point(True, 30, 1).tsumo_total(True) == 1500
    assert point(False, 20, 4).tsumo_total(False) == 5200
    assert point(False, 30, 4).ron == 7700          # no kiriage mangan (Tenhou)
    assert point(False, 0, 5).tsumo_total(False) == 8000
    assert point(False, 0, 6).tsumo_total(False) == 12000


# ---- SP calculator, hand-computed -----------------------------------------------------------------

def _calc(**kw):
    args = dict(tehai_len_div3=4, chis=[], pons=[], minkans=[], ankans=[], bakaze=27, jikaze=28,
                is_menzen=True, num_doras_in_fuuro=0, dora_indicators=[27],
                calc_double_riichi=False, calc_haitei=False, prefer_riichi=True)
    args.update(kw)
    return SPCalculator(**args)


@BOTH
def test_sp_open_tanki_two_draws(impl):
    # 234m 567p 789s 9m + pon of haku: tanki on 9m (3 left of 122 unseen), 30 fu 1 han tsumo = 1100.
    tehai = hand("2349m 567p 789s")
    seen = list(tehai)
    seen[31] += 3   # the pon
    seen[17] += 1   # dora indicator 9p
    calc = _calc(tehai_len_div3=3, pons=[31], is_menzen=False, dora_indicators=[17])
    (c,) = SEARCH[impl](calc, tehai, [False] * 3, seen, [False] * 3, False, 2, 0)
    assert c.tile == 37 and c.required_tiles == [(8, 3)]
    assert c.tenpai_probs == [1.0, 1.0]
    win0 = 3 / 122 + (119 / 122) * (3 / 121)   # = 720 / 14762
    assert c.win_probs[0] == pytest.approx(win0, rel=1e-9)
    assert c.win_probs[1] == pytest.approx(3 / 121, rel=1e-9)
    assert c.exp_values[0] == pytest.approx(1100 * win0, rel=1e-9)
    assert c.exp_values[1] == pytest.approx(1100 * 3 / 121, rel=1e-9)


@BOTH
def test_sp_riichi_ippatsu_and_uradora_one_draw(impl):
    # 123m 456p 789s 34s 99m, menzen, riichi preferred, indicator E (no dora), one draw left.
    # Win on 2s/5s: pinfu + riichi + tsumo = 3 han 20 fu, +1 ippatsu (win on the next draw).
    # Ura: 121 tiles left after the draw; 38 indicator tiles hit one hand tile, 4 (8m) hit the 9m pair.
    tehai = hand("123m 456p 789s 34s 99m")
    seen = list(tehai)
    seen[27] += 1
    (c,) = SEARCH[impl](_calc(), tehai, [False] * 3, seen, [False] * 3, False, 1, 0)
    plain = (79 * 5200 + 38 * 8000 + 4 * 12000) / 121   # 4 / 5 / 6 han tsumo totals
    aka = (79 * 8000 + 38 * 12000 + 4 * 12000) / 121    # red 5s: one more han
    assert c.win_probs == [pytest.approx(8 / 122)]
    assert c.exp_values[0] == pytest.approx((7 * plain + aka) / 122, rel=1e-9)
    assert sorted(c.required_tiles) == [(19, 4), (22, 4)]


# ---- encoder, synthetic kyoku ---------------------------------------------------------------------

def _kyoku(tehai0, dora="E"):
    return {"type": "start_kyoku", "bakaze": "E", "dora_marker": dora, "kyoku": 1, "honba": 0,
            "kyotaku": 0, "oya": 0, "scores": [25000] * 4,
            "tehais": [tehai0] + [["?"] * 13] * 3}


def _feed(events, seat=0):
    ps, enc = PlayerState(seat), V4Encoder(seat)
    for e in [{"type": "start_game", "names": ["a", "b", "c", "d"]}] + events:
        ps.update(json.dumps(e))
        enc.update(e)
    return ps, enc


def test_fallback_tenhou_value():
    # Oya's first tsumo completes the hand: SP tables fail (shanten -1), the 2 EV rows carry the
    # minimal tsumo value (tenhou = oya yakuman, 48000), everything else in the SP block is zero.
    t = "1m 2m 3m 4p 5p 6p 7s 8s 9s 3s 4s 9m 9m".split()
    ps, enc = _feed([_kyoku(t), {"type": "tsumo", "actor": 0, "pai": "2s"}])
    assert ps.last_cans.can_tsumo_agari
    obs, mask = enc.encode(ps)
    assert obs.shape == (1012, 34) and obs.dtype == np.float32
    assert np.allclose(obs[889], 0.48) and np.allclose(obs[890], 1.0)
    assert (obs[891:] == 0).all()
    assert mask.tolist() == ps.encode_obs(3, False)[1].tolist()


def test_simple_path_at_four_plus_shanten():
    t = "1m 4m 7m 2p 5p 8p 3s 6s 9s E S W N".split()
    ps, enc = _feed([_kyoku(t), {"type": "tsumo", "actor": 0, "pai": "P"}])
    obs, _ = enc.encode(ps)
    assert (obs[889:891] == 0).all()          # no EV computed above 3 shanten
    assert (obs[SP_TABLE:] == 0).all()        # no probabilities either
    assert obs[SP_BEST].sum() == 1            # one best discard
    assert obs[SP_REQUIRED:SP_REQUIRED + 68].sum() > 0
    assert (obs[SP_BEST + 1] == 0).all()


def test_riichi_accepted_discard_column():
    # Seat 0 riichis on 123m 456p 789s 34s 99m (waits 2s/5s), then draws N: the only column is N.
    t = "1m 2m 3m 4p 5p 6p 7s 8s 9s 3s 4s 9m 9m".split()
    ev = [_kyoku(t), {"type": "tsumo", "actor": 0, "pai": "W"},
          {"type": "reach", "actor": 0}, {"type": "dahai", "actor": 0, "pai": "W", "tsumogiri": True},
          {"type": "reach_accepted", "actor": 0}]
    for a in (1, 2, 3):
        ev += [{"type": "tsumo", "actor": a, "pai": "?"},
               {"type": "dahai", "actor": a, "pai": "C", "tsumogiri": True}]
    ev.append({"type": "tsumo", "actor": 0, "pai": "N"})
    ps, enc = _feed(ev)
    assert ps.self_riichi_accepted and ps.last_cans.can_discard
    obs, _ = enc.encode(ps)
    n = 30
    assert obs[SP_BEST].tolist() == [float(i == n) for i in range(34)]
    req = np.nonzero(obs[SP_REQUIRED + n])[0].tolist()
    assert req == [19, 22]                     # 2s, 5s
    assert (np.delete(obs[SP_TABLE:], n, axis=1) == 0).all()
    # tenpai prob 1; win prob over T = 66 // 4 = 16 draws with 8 winning tiles among unseen ones
    unseen = 136 - sum(ps.tiles_seen)
    T = enc.tiles_left // 4
    miss = 1.0
    for k in range(T):
        miss *= (unseen - 8 - k) / (unseen - k)
    assert obs[SP_TABLE, n] == 1.0
    assert obs[SP_TABLE + 17, n] == pytest.approx(1 - miss, rel=1e-5)
    assert obs[SP_TABLE + 34, n] == pytest.approx(1.0)   # EV at turn 0 is the max EV


def test_call_decision_is_3n_plus_1_layout():
    # Seat 0 holds 12m 456p 789s 3399s E E; seat 3 discards 3m: chi possible at 3n+1.
    t = "1m 2m 4p 5p 6p 7s 8s 9s 3s 3s 9s E E".split()
    ev = [_kyoku(t), {"type": "tsumo", "actor": 0, "pai": "N"},
          {"type": "dahai", "actor": 0, "pai": "N", "tsumogiri": True}]
    for a in (1, 2):
        ev += [{"type": "tsumo", "actor": a, "pai": "?"},
               {"type": "dahai", "actor": a, "pai": "C", "tsumogiri": True}]
    ev += [{"type": "tsumo", "actor": 3, "pai": "?"}, {"type": "dahai", "actor": 3, "pai": "3m", "tsumogiri": True}]
    ps, enc = _feed(ev)
    assert not ps.last_cans.can_discard and ps.last_cans.can_ron_agari is False
    obs, _ = enc.encode(ps)
    assert (obs[SP_REQUIRED:SP_REQUIRED + 69] == 0).all()
    assert obs[SP_REQUIRED + 69].sum() > 0
    # 3n+1 tables fill whole rows
    for r in range(SP_TABLE, 1012):
        assert obs[r].min() == obs[r].max()
    assert obs[SP_TABLE, 0] > 0
