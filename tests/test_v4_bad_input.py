"""Observation v4 under bad input: the compiled SP core's argument checks, V4Encoder.update's event
checks, and GameplayLoader(4) skipping malformed logs (found by fuzzing the v4 path)."""

import copy
import gzip
import json
import math

import numpy as np
import pytest
from mjai.mlibriichi.state import PlayerState

from mortal.data.gameplay import GameplayLoader
from mortal.features.obs_v4 import MAX_DORA_INDICATORS, SP_EV, V4Encoder
from mortal.features.sp.calc import HAVE_CORE
from sp_oracle import v4_rows
from sp_oracle.core_py import SPCalculator

from conftest import DATA_DIR, hand
from sp_oracle.search import calc as oracle_calc

if HAVE_CORE:
    from mortal.features.sp import _core

needs_core = pytest.mark.skipif(not HAVE_CORE, reason="mortal.features.sp._core is not built (bash scripts/setup.sh)")

# 123m 456p 789s EE SS: tenpai on E or S (shanpon), oya (jikaze E) in an East round.
TENPAI = hand("123m 456p 789s 1122z")


def _sp_args(**kw):
    """sp_calc's 20 arguments for TENPAI at 3n+1, menzen, riichi assumed, 1 dora indicator 1m."""
    args = dict(len_div3=4, chis=b"", pons=b"", minkans=b"", ankans=b"", bakaze=27, jikaze=27, is_menzen=True,
                num_doras_in_fuuro=0, dora_indicators=bytes([0]), calc_double_riichi=False, calc_haitei=False,
                prefer_riichi=True, tehai=bytes(TENPAI), akas_in_hand=0, tiles_seen=bytes(TENPAI), akas_seen=0,
                can_discard=False, tsumos_left=1, cur_shanten=0)
    args.update(kw)
    return tuple(args.values())


def _seen_with_unseen(unseen: dict):
    """tiles_seen where only the tiles in ``unseen`` ({tile id: count}) are left unseen."""
    seen = [4] * 34
    for t, n in unseen.items():
        seen[t] -= n
    return seen


# ---- compiled core: argument checks -----------------------------------------------------------

@needs_core
@pytest.mark.parametrize("value", [-1, 101, 2 ** 31 - 1, -2 ** 31])
def test_core_rejects_num_doras_in_fuuro_out_of_range(value):
    # A negative count reached a negative shift in point.hpp and INT_MAX a signed overflow (UBSan).
    with pytest.raises(ValueError, match=f"num_doras_in_fuuro: expected 0-100, got {value}"):
        _core.sp_calc(*_sp_args(num_doras_in_fuuro=value))


@needs_core
@pytest.mark.parametrize("field,index", [("additional_hans", 10), ("doras", 11)])
@pytest.mark.parametrize("value", [-1, 101, 2 ** 31 - 1])
def test_core_agari_rejects_extra_han_out_of_range(field, index, value):
    # 1 + INT_MAX overflowed int in agari.hpp (UBSan) and negatives gave negative han.
    args = [bytes(hand("123m 456p 789s 111z 22z")), True, b"", b"", b"", b"", 27, 27, 28, False, 0, 0]
    args[index] = value
    with pytest.raises(ValueError, match=f"{field}: expected 0-100, got {value}"):
        _core.agari(*args)
    args[index] = 100  # the bound itself is accepted: 2 han (double E) + 100
    assert _core.agari(*args)[1] == 102


@needs_core
def test_core_rejects_a_wall_too_small_for_the_search():
    # One tile unseen: the drawn E emptied the wall and the 1-indicator uradora estimate
    # divided 0 by 0 (EV came back NaN; the Python reference raised ZeroDivisionError).
    seen = _seen_with_unseen({27: 1})
    with pytest.raises(ValueError, match="tiles_seen: only 1 tiles unseen, at least 5 needed"):
        _core.sp_calc(*_sp_args(tiles_seen=bytes(seen)))


@needs_core
def test_core_smallest_wall_gives_the_hand_computed_value():
    # 5 unseen tiles: one E (a winning tile) and four 9m. One draw: win 1/5. A tsumo on E is
    # double E (2) + riichi and menzen tsumo (2) + dora 2m (1) + ippatsu (1) + one certain
    # uradora (the only indicator left unseen is 9m, showing 1m, which is in hand) = 7 han,
    # oya haneman 6000 all = 18000; EV = 18000 / 5 = 3600.
    seen = _seen_with_unseen({27: 1, 8: 4})
    ((tile, tenpai, win, ev, required, down),) = _core.sp_calc(*_sp_args(tiles_seen=bytes(seen)))
    assert (tile, required, down) == (37, ((27, 1),), False)
    assert tenpai == (1.0,) and win[0] == pytest.approx(0.2) and ev[0] == pytest.approx(3600.0)
    # the pure-Python oracle agrees
    calc = SPCalculator(tehai_len_div3=4, chis=[], pons=[], minkans=[], ankans=[], bakaze=27, jikaze=27,
                        is_menzen=True, num_doras_in_fuuro=0, dora_indicators=[0], calc_double_riichi=False,
                        calc_haitei=False, prefer_riichi=True)
    (c,) = oracle_calc(calc, TENPAI, [False] * 3, seen, [False] * 3, False, 1, 0)
    assert c.exp_values[0] == pytest.approx(3600.0) and c.win_probs[0] == pytest.approx(0.2)


@needs_core
@pytest.mark.parametrize("shanten", [1, 2, 3])
def test_core_lying_shanten_terminates_with_finite_values(shanten):
    # A wrong cur_shanten gives meaningless but finite values; from 2 up (two above the true
    # 0) no draw can reach cur_shanten - 1, so all are 0.
    ((_, tenpai, win, ev, _, _),) = _core.sp_calc(*_sp_args(tsumos_left=17, cur_shanten=shanten))
    assert len(ev) == 17 and all(math.isfinite(v) and v >= 0.0 for v in tenpai + win + ev)
    assert (max(win + ev) == 0.0) == (shanten >= 2)


def _decision_facts():
    """``V4Encoder._facts`` of seat 0's first discard decision of the fixture game."""
    ps, enc = PlayerState(0), V4Encoder(0)
    for ev in _first_kyoku():
        cans = ps.update(json.dumps(ev))
        enc.update(ev)
        if cans.can_discard and ev["type"] == "tsumo":
            return enc._facts(ps)
    raise AssertionError("no discard decision")


@needs_core
def test_core_rows_check_every_decision_and_any_thread_count():
    good = _decision_facts()
    want = np.empty((1, 123, 34), np.float32)
    _core.sp_rows([good], want, 1)
    assert want[0, 0, 0] > 0.0  # an EV was written
    for threads in (0, -5, 1, 3, 1000):
        out = np.empty((3, 123, 34), np.float32)
        assert _core.sp_rows([good, good, good], out, threads) is None
        np.testing.assert_array_equal(out, np.repeat(want, 3, axis=0))
    assert _core.sp_rows([], np.empty((0, 123, 34), np.float32), 4) is None
    out = np.zeros((3, 123, 34), np.float32)
    bad_seen = good[:8] + (bytes(34),) + good[9:]  # fewer tiles seen than in hand
    with pytest.raises(ValueError, match="tiles_seen: tile .* is seen 0 times"):
        _core.sp_rows([good, bad_seen, good], out, 4)
    assert not out.any()  # checked before any search
    with pytest.raises(ValueError, match="dora_indicators: tile id 40"):
        _core.sp_rows([good[:10] + (bytes([40]),) + good[11:]], out[:1], 1)
    with pytest.raises(ValueError, match="an output of"):
        _core.sp_rows([good, good], out, 1)
    with pytest.raises(TypeError, match="item 1 is not a tuple"):
        _core.sp_rows([good, list(good)], out[:2], 4)
    with pytest.raises(TypeError, match="expected a sequence"):
        _core.sp_rows(None, out, 4)


# ---- V4Encoder.update: event checks -----------------------------------------------------------

def _start_kyoku(**kw):
    ev = {"type": "start_kyoku", "bakaze": "E", "dora_marker": "P", "kyoku": 1, "honba": 0, "kyotaku": 0,
          "oya": 0, "scores": [25000] * 4, "tehais": [["1m"] * 13] + [["?"] * 13] * 3}
    ev.update(kw)
    return ev


@pytest.mark.parametrize("event,error,message", [
    ([1, 2], TypeError, "must be a JSON object, got list"),
    ("[1]", TypeError, "must be a JSON object, got list"),
    ("{oops", ValueError, "Expecting property name"),
    ({"type": "tsumo", "pai": "1m"}, ValueError, "tsumo event: missing field 'actor'"),
    ({"type": "dahai", "actor": 7, "pai": "1m"}, ValueError, "dahai event: field 'actor': expected a seat 0-3, got 7"),
    ({"type": "reach", "actor": "0"}, ValueError, "field 'actor': expected a seat 0-3, got '0'"),
    ({"type": "reach_accepted", "actor": True}, ValueError, "expected a seat 0-3, got True"),
    ({"type": "dahai", "actor": 1}, ValueError, "dahai event: missing field 'pai'"),
    ({"type": "dahai", "actor": 1, "pai": "0m"}, ValueError, "dahai event: field 'pai': not an mjai tile name: '0m'"),
    ({"type": "tsumo", "actor": 0, "pai": ["5mr"]}, ValueError, "field 'pai': not an mjai tile name"),
    ({"type": "dora"}, ValueError, "dora event: missing field 'dora_marker'"),
    ({"type": "dora", "dora_marker": "?"}, ValueError, "field 'dora_marker': the masked tile '?'"),
    ({"type": "pon", "actor": 0, "pai": "1m", "consumed": ["?", "?"]}, ValueError,
     "pon event: field 'consumed': the masked tile '?'"),
    ({"type": "chi", "actor": 2, "pai": "1m", "consumed": "2m3m"}, ValueError,
     "chi event: field 'consumed': expected a list of tile names, got str"),
    ({"type": "ankan", "actor": 0}, ValueError, "ankan event: missing field 'consumed'"),
    ({"type": "kakan", "actor": 0, "pai": "?", "consumed": ["1m"] * 3}, ValueError, "kakan event: field 'pai'"),
    (_start_kyoku(tehais=[["1m"] * 13]), ValueError, "start_kyoku event: field 'tehais': expected 4 lists"),
    (_start_kyoku(tehais=[[7] * 13] * 4), ValueError, "field 'tehais[0]': not an mjai tile name: 7"),
    (_start_kyoku(dora_marker="?"), ValueError, "start_kyoku event: field 'dora_marker': the masked tile"),
])
def test_update_rejects_bad_event_and_leaves_encoder_unchanged(event, error, message):
    enc = V4Encoder(0)
    enc.update(_start_kyoku())
    enc.update({"type": "kakan", "actor": 2, "pai": "5mr", "consumed": ["5m"] * 3})  # sets pending_kakan
    before = copy.deepcopy(vars(enc))
    with pytest.raises(error, match=message.replace("?", r"\?").replace("[", r"\[")):
        enc.update(event)
    assert vars(enc) == before
    assert enc.pending_kakan and enc.akas_seen == [True, False, False] and enc.events_seen == 2


def test_update_ignores_unknown_types_and_unread_fields():
    enc = V4Encoder(1)
    enc.update(_start_kyoku())
    for ev in ({"type": "foo"}, {}, {"type": 3}, {"type": "hora", "actor": "x", "pai": "xx"},
               {"type": "tsumo", "actor": 0, "pai": "garbage"},   # another seat's draw is not read
               {"type": "dahai", "actor": 1, "pai": "garbage"}):  # nor one's own discard
        enc.update(ev)
    assert enc.events_seen == 7 and enc.tiles_left == 69 and enc.dora_indicators == [31]


def test_update_refuses_a_sixth_dora_indicator():
    # PlayerState panics on it too; the C++ core would refuse the 6 indicators only at encode time.
    enc = V4Encoder(0)
    enc.update(_start_kyoku())
    for _ in range(MAX_DORA_INDICATORS - 1):
        enc.update({"type": "dora", "dora_marker": "1m"})
    assert len(enc.dora_indicators) == 5
    with pytest.raises(ValueError, match="more than 5 dora indicators in one kyoku"):
        enc.update({"type": "dora", "dora_marker": "1m"})
    enc.update(_start_kyoku())  # a new kyoku starts from its own marker
    assert enc.dora_indicators == [31]


def _chankan_events():
    """Seat 0 pons 5s and adds 5sr (kakan); seat 1 (234m 456p 678p 34s 66s) waits on 2s/5s."""
    def t(a, p="?"):
        return {"type": "tsumo", "actor": a, "pai": p}

    def d(a, p, tg=False):
        return {"type": "dahai", "actor": a, "pai": p, "tsumogiri": tg}
    h1 = ["2m", "3m", "4m", "4p", "5p", "6p", "6p", "7p", "8p", "3s", "4s", "6s", "6s"]
    sk = _start_kyoku(dora_marker="9s", tehais=[["?"] * 13, h1, ["?"] * 13, ["?"] * 13])
    return [{"type": "start_game", "names": ["a", "b", "c", "d"]}, sk,
            t(0), d(0, "N", True), t(1, "S"), d(1, "S", True), t(2), d(2, "2s"), t(3), d(3, "5s"),
            {"type": "pon", "actor": 0, "target": 3, "pai": "5s", "consumed": ["5s", "5s"]},
            d(0, "E"), t(1, "N"), d(1, "N", True), t(2), d(2, "1s"), t(3), d(3, "3s"), t(0),
            {"type": "kakan", "actor": 0, "pai": "5sr", "consumed": ["5s", "5s", "5s"]}]


@pytest.mark.parametrize("tail", [["end_kyoku"], ["end_game"], ["hora", "end_kyoku"]])
def test_kakan_by_another_player_then_immediate_end(tail):
    ps, enc = PlayerState(1), V4Encoder(1)
    for ev in _chankan_events():
        cans = ps.update(json.dumps(ev))
        enc.update(ev)
    assert cans.can_ron_agari and enc.pending_kakan
    obs, mask = enc.encode(ps)
    assert obs.shape == (1012, 34) and mask[43]  # hora is legal (chankan)
    # ron on 5sr: tanyao + pinfu + chankan + aka = 4 han 30 fu; Mortal's value is the tsumo
    # total of that hand for a ko: 2000 + 2000 + 3900 = 7900
    assert 0.0 < obs[SP_EV, 0] <= 1.0  # a search ran (tiles are left): its best EV
    assert v4_rows.min_tsumo_agari(enc, ps, v4_rows.context(enc, ps)) == 7900.0
    # the core's fallback value: the same decision with 3 tiles left (no search; not the last tile)
    facts = enc._facts(ps)
    rows = np.empty((1, 123, 34), np.float32)
    _core.sp_rows([facts[:12] + (3,) + facts[13:]], rows, 1)
    assert rows[0, 0, 0] == np.float32(7900 / 100000) and rows[0, 1, 5] == np.float32(7900 / 30000)
    assert not rows[0, 2:].any()
    for kind in tail:
        ev = {"type": kind}
        if kind == "hora":
            ev = {"type": "hora", "actor": 1, "target": 0, "pai": "5sr", "deltas": [-7700, 7700, 0, 0]}
        ps.update(json.dumps(ev))
        enc.update(ev)
        assert not enc.pending_kakan and not enc.at_ippatsu
    nxt = _start_kyoku(kyoku=2, oya=1, tehais=[["?"] * 13, ["1m"] * 13, ["?"] * 13, ["?"] * 13])
    enc.update(nxt)
    assert enc.dora_indicators == [31] and enc.own_fuuro_tiles == [] and enc.tiles_left == 70


# ---- GameplayLoader(4): a malformed log is skipped and reported -------------------------------

def _first_kyoku():
    """The first kyoku of the meta-annotated fixture game, closed with end_game (a short valid log)."""
    events = [json.loads(line) for line in (DATA_DIR / "meta_annotated_hanchan.jsonl").read_text().splitlines()]
    end = [i for i, e in enumerate(events) if e["type"] == "end_kyoku"][0]
    return events[:end + 1] + [{"type": "end_game"}]


def _write(path, events):
    path.write_bytes(gzip.compress("\n".join(json.dumps(e) for e in events).encode()))
    return str(path)


def test_loader_v4_skips_bad_logs_and_loads_good_ones(tmp_path):
    good = _first_kyoku()
    n = [i for i, e in enumerate(good) if e["type"] == "tsumo"][20]
    # a kakan of 8p by seat 2 out of nowhere, on its own turn when seat 0 has seen all four
    # 8p: the PlayerState of seat 0 takes it (5 seen), the SP core refuses seat 0's next hand
    kakan = copy.deepcopy(good)
    k = [i for i, e in enumerate(good) if e["type"] == "tsumo" and e["actor"] == 2][5]
    kakan.insert(k + 1, {"type": "kakan", "actor": 2, "pai": "8p", "consumed": ["8p"] * 3})
    six_doras = copy.deepcopy(good)
    six_doras[n:n] = [{"type": "dora", "dora_marker": "1m"}] * 6
    bad_actor = copy.deepcopy(good)
    bad_actor[n]["actor"] = 7
    paths = [_write(tmp_path / "good1.json.gz", good), _write(tmp_path / "kakan.json.gz", kakan),
             _write(tmp_path / "six_doras.json.gz", six_doras), _write(tmp_path / "actor.json.gz", bad_actor),
             _write(tmp_path / "good2.json.gz", good)]
    loader = GameplayLoader(4)
    out = loader.load_gz_log_files(paths)
    assert [len(games) for games in out] == [4, 0, 0, 0, 4]
    # sample counts of the first kyoku per seat, the same in both copies
    assert [len(g) for g in out[0]] == [len(g) for g in out[4]] == [17, 15, 16, 18]
    assert all(g.obs.shape[1:] == (1012, 34) for g in out[0])
    assert loader.skipped == 3
    reasons = dict(loader.skipped_files)
    assert sorted(reasons) == sorted(paths[1:4])
    assert "tiles_seen: count 5 of tile 16 is above 4" in reasons[paths[1]]
    assert "dora rejected by PlayerState" in reasons[paths[2]]
    assert "'actor' must be a seat 0-3, got 7" in reasons[paths[3]]


@pytest.mark.parametrize("bad", [True, 0.0, 4, -1, "1"])
def test_encoder_seat_must_be_an_int_0_to_3(bad):
    from mortal.features.obs_v4 import V4Encoder

    with pytest.raises(ValueError, match="player_id"):
        V4Encoder(bad)


# ---- version 4 without the compiled core ------------------------------------------------------

CORE_MISSING = ("observation version 4 needs the compiled single-player core (mortal.features.sp._core), which is "
                "not built here: run bash scripts/setup.sh (needs g++ and the Python headers)")


def test_v4_encoder_without_the_core_names_the_fix(monkeypatch):
    from mortal.features.sp import calc

    monkeypatch.setattr(calc, "_core", None)
    with pytest.raises(calc.SPCoreMissing) as info:
        V4Encoder(0)
    assert str(info.value) == CORE_MISSING
    assert not isinstance(info.value, ValueError)  # no bad-input handler (the loader's) takes it for a bad log


@pytest.mark.parametrize("version", [3, 4])
def test_a_version_4_process_without_the_core_stops_at_start_up_with_one_line(tmp_path, monkeypatch, capsys, version):
    from mortal import entry
    from mortal.config import CLIENT_SECTIONS, SERVER_SECTIONS, train_sections
    from mortal.features.sp import calc
    from mortal.tools.quickstart_config import render_config

    path = tmp_path / "config.toml"
    path.write_text(render_config(tmp_path, preset="short", port=5123, version=version), encoding="utf-8")
    monkeypatch.setattr(calc, "HAVE_CORE", False)
    args = entry.start(entry.parser("test"), ["-c", str(path)], log_level=None)
    assert entry.load_config_or_exit(args, SERVER_SECTIONS)  # the server encodes nothing: it starts
    for required in (CLIENT_SECTIONS, train_sections):
        if version == 3:
            assert entry.load_config_or_exit(args, required)
            continue
        with pytest.raises(SystemExit) as info:
            entry.load_config_or_exit(args, required)
        assert info.value.code == 2
        assert capsys.readouterr().err == f"error: {CORE_MISSING}\n"
