"""The compiled single-player core (mortal.features.sp._core) against the pure-Python oracle (tests/sp_oracle).

Both were checked by hand (tests/test_obs_v4.py); here the core must give the oracle's numbers on
generated hands and on every decision of two real games.
"""

import json
import random
import time

import numpy as np
import pytest
from mjai.mlibriichi.state import PlayerState

import mortal.features.sp.calc as calc_mod
from mortal.features.obs_v4 import V4Encoder
from mortal.features.sp.calc import HAVE_CORE
from sp_oracle.core_py import Hand, SPCalculator
from sp_oracle import v4_rows

from conftest import hand
from sp_oracle.agari import agari
from sp_oracle.search import calc as oracle_calc
from sp_oracle.shanten import calc_all_py

if HAVE_CORE:
    from mortal.features.sp import _core

LOGS = ("tests/data/meta_annotated_hanchan.jsonl", "tests/data/riichienv_selfplay_hanchan.jsonl")


def test_core_is_built():
    # scripts/setup.sh builds it; without it version 4 does not run.
    assert HAVE_CORE, "mortal.features.sp._core is not built: run bash scripts/setup.sh"


def _random_hand(rng, n_tiles):
    counts = [0] * 34
    pool = [t for t in range(34) for _ in range(4)]
    for t in rng.sample(pool, n_tiles):
        counts[t] += 1
    return counts


def _clustered_hand(rng, n_tiles):
    # tiles drawn from one or two suits make many more near-complete shapes than a uniform draw
    suits = rng.sample(range(4), rng.choice((1, 2)))
    pool = [t for t in range(34) if (t // 9 if t < 27 else 3) in suits for _ in range(4)]
    counts = [0] * 34
    for t in rng.sample(pool, min(n_tiles, len(pool))):
        counts[t] += 1
    return counts


@pytest.mark.parametrize("tiles,len_div3,expected", [
    ("1111m 333p 222s 444z", 4, 1),
    ("147m 258p 369s 1234z", 4, 6),
    ("19m 19p 159s 123456z", 4, 1),
    ("9999m 6677p 88s 355z", 4, 2),
    ("4455s", 1, 0),
    ("55m", 0, -1),
    ("12223456m 78889p 2m", 4, -1),
    ("1122m 3344p 5566s 77z", 4, -1),  # chitoi complete
    ("19m 19p 19s 12345677z", 4, -1),   # kokushi complete
])
def test_core_shanten_known_values(tiles, len_div3, expected):
    assert _core.shanten(bytes(hand(tiles)), len_div3) == expected


@pytest.mark.slow
def test_core_shanten_matches_python():
    rng = random.Random(7)
    checked = 0
    for _ in range(4000):
        len_div3 = rng.randint(0, 4)
        n = 3 * len_div3 + rng.choice((1, 2))
        counts = (_clustered_hand if rng.random() < 0.5 else _random_hand)(rng, n)
        n = sum(counts)
        if n % 3 == 0:
            continue
        assert _core.shanten(bytes(counts), len_div3) == calc_all_py(counts, len_div3), counts
        checked += 1
    assert checked > 3000


def test_core_shanten_rejects_bad_counts():
    with pytest.raises(ValueError, match="tehai: expected 34"):
        _core.shanten(bytes(33), 4)
    with pytest.raises(ValueError, match="above 4"):
        _core.shanten(bytes([5] + [0] * 33), 4)
    with pytest.raises(ValueError, match="len_div3"):
        _core.shanten(bytes(34), 5)


# ---- agari ----------------------------------------------------------------------------------

def _winning_counts(rng, n_melds):
    """Concealed counts of n_melds pungs/chows plus a pair, or None if a tile would exceed 4."""
    counts = [0] * 34
    for _ in range(n_melds):
        if rng.random() < 0.6:
            suit, start = rng.randrange(3), rng.randrange(7)
            for k in range(3):
                counts[9 * suit + start + k] += 1
        else:
            counts[rng.randrange(34)] += 3
    counts[rng.randrange(34)] += 2
    return counts if max(counts) <= 4 else None


def _agari_case(rng):
    n_calls = rng.choice((0, 0, 0, 1, 2, 4))
    calls = {"chis": [], "pons": [], "minkans": [], "ankans": []}
    used = [0] * 34
    for _ in range(n_calls):
        kind = rng.choice(list(calls))
        t = rng.randrange(34)
        if kind == "chis":
            t = 9 * rng.randrange(3) + rng.randrange(7)
            for k in range(3):
                used[t + k] += 1
        else:
            used[t] += 4 if kind.endswith("kans") else 3
        calls[kind].append(t)
    special = rng.random()
    if n_calls == 0 and special < 0.08:
        pairs = rng.sample(range(34), 7)
        counts = [2 if t in pairs else 0 for t in range(34)]
    elif n_calls == 0 and special < 0.12:
        counts = [1 if t in (0, 8, 9, 17, 18, 26) or t >= 27 else 0 for t in range(34)]
        counts[rng.choice((0, 8, 9, 17, 18, 26, 27, 33))] += 1
    else:
        counts = _winning_counts(rng, 4 - n_calls)
        if counts is None:
            return None
        if rng.random() < 0.15:  # near miss: swap one tile
            src = rng.choice([t for t in range(34) if counts[t]])
            counts[src] -= 1
            counts[rng.randrange(34)] += 1
    if any(c + u > 4 for c, u in zip(counts, used)):
        return None
    win = rng.choice([t for t in range(34) if counts[t]])
    menzen = not (calls["chis"] or calls["pons"] or calls["minkans"])
    h = Hand(tuple(counts), menzen, tuple(calls["chis"]), tuple(calls["pons"]), tuple(calls["minkans"]),
             tuple(calls["ankans"]), rng.randrange(27, 31), rng.randrange(27, 31), win, rng.random() < 0.5)
    return h, rng.choice((0, 0, 1, 2, 3)), rng.choice((0, 0, 1, 2, 5))


def test_core_agari_matches_python():
    rng = random.Random(11)
    seen = {"none": 0, "yaku": 0, "yakuman": 0}
    n = 0
    while n < 3000:
        case = _agari_case(rng)
        if case is None:
            continue
        h, extra, doras = case
        want = agari(h, extra, doras)
        got = _core.agari(bytes(h.tehai), h.is_menzen, bytes(h.chis), bytes(h.pons), bytes(h.minkans),
                          bytes(h.ankans), h.bakaze, h.jikaze, h.winning_tile, h.is_ron, extra, doras)
        assert got == (None if want is None else tuple(want)), (h, extra, doras)
        seen["none" if want is None else "yakuman" if want.yakuman else "yaku"] += 1
        n += 1
    # the generator reaches every outcome often enough for the comparison to mean something
    assert min(seen.values()) >= 50, seen


def test_core_agari_known_values():
    # chitoi + tanyao ron = 3 han 25 fu; riichi-only yaku-less ron = 1 han 40 fu (+0 when no han)
    t = hand("2255m 4455p 667788s")
    assert _core.agari(bytes(t), True, b"", b"", b"", b"", 27, 28, 13, True, 0, 0) == (0, 3, 25)
    t = hand("234678m 11234888p")
    assert _core.agari(bytes(t), True, b"", b"", b"", b"", 27, 27, 16, True, 0, 0) is None
    assert _core.agari(bytes(t), True, b"", b"", b"", b"", 27, 27, 16, True, 1, 0) == (0, 1, 40)


# ---- the search -----------------------------------------------------------------------------

def _decisions(path, seat):
    """(SPCalculator, calc args) of every SP search while seat's V4Encoder replays path."""
    out = []
    ps, enc = PlayerState(seat), V4Encoder(seat)
    with open(path) as f:
        events = [json.loads(line) for line in f]
    for ev in events:
        ev.pop("meta", None)
        cans = ps.update(json.dumps(ev))
        enc.update(ev)
        if ev["type"] not in ("hora", "ryukyoku", "end_kyoku", "end_game") and cans.can_act:
            job = v4_rows.sp_job(enc, ps, v4_rows.context(enc, ps))
            if job is not None:
                out.append(job[:2])
    return out


def _same(got, want):
    assert len(got) == len(want)
    if want[0].exp_values:
        assert got[0].exp_values[0] == pytest.approx(want[0].exp_values[0], rel=1e-9)
    # exact EV ties may sort either way after float rounding; compare by discard tile
    by_tile = {c.tile: c for c in got}
    for w in want:
        g = by_tile[w.tile]
        assert g.required_tiles == w.required_tiles and g.shanten_down == w.shanten_down
        for a, b in ((g.tenpai_probs, w.tenpai_probs), (g.win_probs, w.win_probs), (g.exp_values, w.exp_values)):
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("path", LOGS)
def test_core_search_matches_python_on_real_games(path):
    compared = with_values = 0
    for seat in (0, 2):
        for calc, args in _decisions(path, seat):
            t0 = time.perf_counter()
            got = calc.calc(*args)
            if time.perf_counter() - t0 > 3e-4:
                continue  # the Python reference would take seconds on this hand
            _same(got, oracle_calc(calc, *args))
            compared += 1
            with_values += bool(got[0].exp_values and got[0].exp_values[0] > 0)
    assert compared >= 60 and with_values >= 20, (compared, with_values)


def test_core_search_rejects_bad_input():
    calc = SPCalculator(tehai_len_div3=4, chis=[], pons=[], minkans=[], ankans=[], bakaze=27, jikaze=28,
                        is_menzen=True, num_doras_in_fuuro=0, dora_indicators=[27], calc_double_riichi=False,
                        calc_haitei=False, prefer_riichi=True)
    tehai = hand("123m 456p 789s 34s 99m")
    seen = list(tehai)
    with pytest.raises(ValueError, match="tsumos_left"):
        calc.calc(tehai, [False] * 3, seen, [False] * 3, False, 18, 0)
    seen[0] = 0
    with pytest.raises(ValueError, match="tiles_seen: tile 0"):
        calc.calc(tehai, [False] * 3, seen, [False] * 3, False, 5, 0)
    with pytest.raises(ValueError, match="tehai: 13 tiles with 0 calls, expected 14"):
        calc.calc(tehai, [False] * 3, list(tehai), [False] * 3, True, 5, 0)
    with pytest.raises(ValueError, match="cannot start a chi"):
        _core.agari(bytes(hand("123m 456p 99s")), False, bytes([8]), b"", b"", b"", 27, 27, 0, True, 0, 0)
    assert calc_mod.HAVE_CORE


def test_sort_key_orders_as_mortal_comparator():
    # sort_candidates must give the order of the column-by-column comparator (_cmp), ties included
    from functools import cmp_to_key

    from sp_oracle.core_py import Candidate, _cmp, sort_candidates

    rng = random.Random(3)
    for _ in range(300):
        tiles = rng.sample(range(37), rng.randint(2, 8))
        cands = [Candidate(t, [rng.choice((0.5, 1.0))], [rng.choice((0.1, 0.2))], [rng.choice((100.0, 200.0))],
                           [(0, rng.randint(1, 3))], rng.random() < 0.3) for t in tiles]
        for by_ev, by in ((True, 0), (False, 3)):
            want = sorted(cands, key=cmp_to_key(lambda l, r: _cmp(r, l, by)))
            assert [c.tile for c in sort_candidates(cands, by_ev)] == [c.tile for c in want]


@pytest.mark.slow
def test_encode_batch_threads_and_kan_select_reuse_match_one_by_one():
    # Replay a real game twice: in one, each acting seat encodes alone; in the other, all acting seats
    # (plus a kan-select pass and a repeated row) go through one encode_batch on 2 threads.
    import numpy as np

    from mortal.features.obs_v4 import encode_batch

    with open(LOGS[1]) as f:
        events = [json.loads(line) for line in f]
    solo = [(PlayerState(s), V4Encoder(s)) for s in range(4)]
    batch = [(PlayerState(s), V4Encoder(s)) for s in range(4)]
    batches = rows = 0
    for ev in events:
        ev.pop("meta", None)
        acting = []
        for seat in range(4):
            for ps, enc in (solo[seat], batch[seat]):
                cans = ps.update(json.dumps(ev))
                enc.update(ev)
            if ev["type"] not in ("hora", "ryukyoku", "end_kyoku", "end_game") and cans.can_act:
                acting.append(seat)
        if not acting:
            continue
        items = [(batch[s][1], batch[s][0], False) for s in acting]
        items += [(batch[acting[0]][1], batch[acting[0]][0], True), items[0]]
        got = encode_batch(items, threads=2)
        for (enc, _, kan), (obs, mask) in zip(items, got):
            ps_solo, enc_solo = solo[enc.player_id]
            want_obs, want_mask = enc_solo.encode(ps_solo, kan)
            np.testing.assert_array_equal(obs, want_obs)
            np.testing.assert_array_equal(mask, want_mask)
        batches += len(acting) > 1
        rows += len(items)
    assert batches >= 5 and rows >= 1000, (batches, rows)


def _facts(path, seat, limit):
    """``V4Encoder._facts`` of the first ``limit`` decisions of ``seat`` replaying ``path``."""
    out = []
    ps, enc = PlayerState(seat), V4Encoder(seat)
    with open(path) as f:
        for line in f:
            ev = json.loads(line)
            ev.pop("meta", None)
            cans = ps.update(json.dumps(ev))
            enc.update(ev)
            if ev["type"] not in ("hora", "ryukyoku", "end_kyoku", "end_game") and cans.can_act:
                out.append(enc._facts(ps))
                if len(out) == limit:
                    break
    return out


def test_sp_rows_batch_on_threads_equals_single_calls():
    from mortal.features.obs_v4 import sp_rows

    facts = _facts(LOGS[0], 1, 80)
    got = sp_rows(facts, threads=3)
    assert got.shape == (80, 123, 34)
    for f, rows in zip(facts, got):
        np.testing.assert_array_equal(rows, sp_rows([f], threads=1)[0])
    assert (got[:, 0] > 0).any() and (got[:, 72] > 0).any()  # EVs and tenpai tables were written
    bad = facts[1][:12] + (-1,) + facts[1][13:]  # tiles left below zero: no search, nothing to win
    with pytest.raises(ValueError, match="tiles_seen"):
        sp_rows([facts[0], facts[1][:8] + (bytes(34),) + facts[1][9:]], threads=2)
    assert not sp_rows([bad], threads=1).any()


def test_sp_threads_from_the_environment(monkeypatch, caplog):
    import os

    import mortal.features.obs_v4 as obs_v4
    from mortal.entry import apply_env  # what every entry point runs at start-up

    monkeypatch.setattr(obs_v4, "SP_THREADS", None)  # restored after the test
    monkeypatch.setenv("MORTAL_SP_THREADS", "3")
    apply_env()
    assert obs_v4.sp_threads() == 3
    monkeypatch.setenv("MORTAL_SP_THREADS", "0")
    apply_env()
    assert obs_v4.sp_threads() == max(1, min(8, os.cpu_count() or 1))
    assert "MORTAL_SP_THREADS='0' is not a positive integer" in caplog.text
    monkeypatch.delenv("MORTAL_SP_THREADS")
    monkeypatch.setattr(obs_v4, "SP_THREADS", 2)
    assert obs_v4.sp_threads() == 2


def test_prepare_sp_searches_each_decision_once(monkeypatch):
    from collections import OrderedDict

    import mortal.features.obs_v4 as obs_v4

    calls = []
    real = obs_v4.sp_rows
    monkeypatch.setattr(obs_v4, "sp_rows", lambda facts, threads, **kw: calls.append(len(facts)) or real(facts, threads, **kw))
    monkeypatch.setattr(obs_v4, "_RECENT", OrderedDict())  # no search of another test
    with open(LOGS[0]) as f:
        events = [json.loads(line) for line in f]
    ps, enc, twin = PlayerState(0), V4Encoder(0), V4Encoder(0)  # twin: another table's seat, the same game
    for ev in events:
        ev.pop("meta", None)
        cans = ps.update(json.dumps(ev))
        enc.update(ev)
        twin.update(json.dumps(ev))
        if ev["type"] == "tsumo" and cans.can_discard and ev["actor"] == 0 and enc.tiles_left < 60:
            break
    obs_v4.prepare_sp([(enc, ps), (enc, ps), (twin, ps)])  # the same decision three times: one search
    assert calls == [1]
    first = obs_v4.encode_batch([(enc, ps, False)])[0][0]
    assert calls == [1]                               # prepared: encode searches nothing
    enc.update({"type": "none"})                      # any event makes the encoder's rows stale,
    again = obs_v4.encode_batch([(enc, ps, False)])[0][0]
    assert calls == [1]                               # but the same facts are a recent search
    obs_v4._RECENT.clear()
    enc.update({"type": "none"})
    assert (obs_v4.encode_batch([(enc, ps, False)])[0][0] == again).all() and calls == [1, 1]
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, obs_v4.encode_batch([(twin, ps, False)])[0][0])
    assert first[obs_v4.SP_START:].any()
    with pytest.raises(ValueError):                   # a recent search's rows are not to be written
        obs_v4._RECENT.popitem()[1][0, 0] = 1.0
