"""GameplayLoader on the real fixture logs (tests/data) and on hand-made bad logs."""

import gzip
import json
import logging

import numpy as np
import pytest

from mortal.data.gameplay import augment_event
from mortal.data.gameplay import GameplayLoader
from mortal.data.mjai_log import BadLogError
from mortal.features.obs import UnsupportedVersionError

from conftest import DATA_DIR

RIICHIENV = DATA_DIR / "riichienv_selfplay_hanchan.jsonl"
META = DATA_DIR / "meta_annotated_hanchan.jsonl"


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def loaded():
    loader = GameplayLoader(3)
    return {p.name: loader.load_log(p.read_text(), str(p)) for p in (RIICHIENV, META)}


@pytest.mark.parametrize("path", [RIICHIENV, META], ids=lambda p: p.stem)
def test_every_label_legal_and_array_layout(loaded, path):
    games = loaded[path.name]
    assert [g.player_id for g in games] == [0, 1, 2, 3]
    for g in games:
        n = len(g)
        assert n > 100
        assert g.obs.shape == (n, 934, 34) and g.obs.dtype == np.float32
        assert g.masks.shape == (n, 46) and g.masks.dtype == np.bool_
        assert g.actions.dtype == np.int64 and g.at_kyoku.dtype == np.uint8
        assert g.masks[np.arange(n), g.actions].all()
        np.testing.assert_array_equal(g.apply_gamma, g.actions <= 37)
        # 12 kyoku, the seat acts in each: at_kyoku 0..11 and one done per kyoku, the last one done.
        assert set(g.at_kyoku.tolist()) == set(range(12))
        assert g.dones.sum() == 12 and g.dones[-1]
        ends = np.flatnonzero(g.dones)
        np.testing.assert_array_equal(g.at_kyoku[ends], np.arange(12))


@pytest.mark.parametrize("path", [RIICHIENV, META], ids=lambda p: p.stem)
def test_label_counts_match_the_log(loaded, path):
    events = _events(path)
    for g in loaded[path.name]:
        seat = g.player_id
        own = [e for e in events if e.get("actor") == seat]
        count = lambda t: sum(e["type"] == t for e in own)  # noqa: E731
        a = g.actions
        kans = count("ankan") + count("kakan") + count("daiminkan")
        assert (a == 42).sum() == kans
        # discards: labels 0-36 minus one kan-select sample per kan (always_include_kan_select)
        assert (a <= 36).sum() - kans == count("dahai")
        assert (a == 37).sum() == count("reach")
        assert ((a >= 38) & (a <= 40)).sum() == count("chi")
        assert (a == 41).sum() == count("pon")
        assert (a == 43).sum() == count("hora")


def test_hora_counts_by_hand(loaded):
    # Winners read off the logs: riichienv 9 hora, meta 12 hora.
    assert [int((g.actions == 43).sum()) for g in loaded[RIICHIENV.name]] == [1, 0, 4, 4]
    assert [int((g.actions == 43).sum()) for g in loaded[META.name]] == [2, 7, 1, 2]


def _at(games, seat, event_idx):
    g = games[seat]
    sel = g.event_idx == event_idx
    return g.actions[sel].tolist(), [np.flatnonzero(m).tolist() for m in g.masks[sel]]


def test_specific_decisions(loaded):
    games = loaded[RIICHIENV.name]
    # line 326: chi 5sr with 6s 7s -> called tile lowest -> 38
    assert _at(games, 1, 324)[0] == [38]
    # line 711: chi 6p with 4p 5p -> highest -> 40; line 847: 6m with 5mr 7m -> mid -> 39
    assert _at(games, 1, 709)[0] == [40]
    assert _at(games, 3, 845)[0] == [39]
    # line 720: ankan 7p after tsumo 7p -> kan decision 42 then kan select 7p = id 15,
    # the kan-select mask holding only that tile
    actions, masks = _at(games, 1, 718)
    assert actions == [42, 15] and 42 in masks[0] and masks[1] == [15]
    # line 237: seat 0 could pon 9m, next event is a tsumo -> it declined: pass
    assert _at(games, 0, 236) == ([45], [[41, 45]])
    # line 303: seat 1 could chi but seat 2 pon'd -> no sample (not a real pass)
    assert _at(games, 1, 302) == ([], [])
    # line 1380: seat 1 could call/ron but seat 2 won by ron -> no sample
    assert _at(games, 1, 1379) == ([], [])


def test_seat_filters():
    raw = META.read_text()  # names "0".."3"
    assert [g.player_id for g in GameplayLoader(3, player_names=["2"]).load_log(raw)] == [2]
    assert [g.player_id for g in GameplayLoader(3).load_log(raw)] == [0, 1, 2, 3]
    assert GameplayLoader(3, player_names=["nobody"]).load_log(raw) == []


def test_augmented_swaps_manzu_and_pinzu():
    assert augment_event({"type": "dahai", "actor": 0, "pai": "5mr"})["pai"] == "5pr"
    ev = augment_event({"type": "chi", "pai": "3p", "consumed": ["1p", "2p"], "actor": 1})
    assert ev["pai"] == "3m" and ev["consumed"] == ["1m", "2m"]
    assert augment_event({"type": "dahai", "pai": "7s"})["pai"] == "7s"
    plain = GameplayLoader(3).load_log(RIICHIENV.read_text())
    aug = GameplayLoader(3, augmented=True).load_log(RIICHIENV.read_text())
    swap = np.arange(46)
    swap[0:9], swap[9:18], swap[34], swap[35] = np.arange(9, 18), np.arange(0, 9), 35, 34
    for p, a in zip(plain, aug):
        np.testing.assert_array_equal(swap[p.actions], a.actions)
        assert a.masks[np.arange(len(a)), a.actions].all()


def test_version_errors():
    assert GameplayLoader(4).version == 4  # loaded with mortal.features.obs_v4 (tests/test_v4_wiring.py)
    for bad in (5, 0, True, "4"):
        with pytest.raises(UnsupportedVersionError):
            GameplayLoader(bad)


def test_take_moves_out():
    g = GameplayLoader(1, player_names=["0"]).load_log(META.read_text())[0]
    obs = g.take_obs()
    assert obs.shape[1:] == (938, 34) and g.obs is None


# ----------------------------------------------------------------- bad input

def _lines(path):
    return path.read_text().splitlines()


def _bad_logs(tmp_path):
    """(file name, content bytes, expected words in the message)."""
    lines = _lines(RIICHIENV)
    first_kyoku = lines[1]
    three = json.loads(first_kyoku)
    three["scores"], three["tehais"] = three["scores"][:3], three["tehais"][:3]
    no_deltas = [json.dumps({k: v for k, v in json.loads(x).items() if k != "deltas"})
                 if '"ryukyoku"' in x else x for x in lines]
    # seat 0 draws F at line 3, then discards a 1m it does not hold
    illegal = lines[:3] + ['{"type":"dahai","actor":0,"pai":"9p","tsumogiri":false}'] + lines[4:]
    out_of_turn = lines[:4] + ['{"type":"dahai","actor":2,"pai":"1m","tsumogiri":false}'] + lines[4:]
    cases = [
        ("empty.json.gz", b"", "empty log"),
        ("tenhou.json.gz", b'<mjloggm ver="2.3"><SHUFFLE seed="x"/><GO type="169"/></mjloggm>\n', "XML/HTML"),
        ("majsoul.json.gz", b'{\n  "head": {"uuid": "x"},\n  "data": []\n}\n', "one JSON document"),
        ("three.json.gz", "\n".join([lines[0], json.dumps(three)] + lines[2:]).encode(), "4-player"),
        ("truncated.json.gz", "\n".join(lines[:500]).encode(), "no 'end_game'"),
        ("no_deltas.json.gz", "\n".join(no_deltas).encode(), "deltas"),
        ("no_start_game.json.gz", "\n".join(lines[1:]).encode(), "expected 'start_game'"),
        ("illegal.json.gz", "\n".join(illegal).encode(), "illegal move"),
        ("out_of_turn.json.gz", "\n".join(out_of_turn).encode(), "line 5"),
    ]
    files = []
    for name, content, words in cases:
        p = tmp_path / name
        p.write_bytes(gzip.compress(content))
        files.append((p, words))
    return files


def test_bad_files_skipped_with_one_message_each(tmp_path, caplog):
    bad = _bad_logs(tmp_path)
    good = tmp_path / "good.json.gz"
    good.write_bytes(gzip.compress(META.read_bytes()))
    extra = tmp_path / "extra_fields.json"  # plain text, unknown fields on every event
    extra.write_text("\n".join(json.dumps({**json.loads(x), "x_unknown": [1, {"a": 2}]})
                               for x in _lines(RIICHIENV)))
    # All seats: an out-of-turn move is only noticed by the PlayerState of the seat that made it.
    loader = GameplayLoader(3)
    paths = [p for p, _ in bad] + [good, extra]
    with caplog.at_level(logging.WARNING, logger="mortal"):
        result = loader.load_gz_log_files(paths)
    assert loader.skipped == len(bad)
    assert [len(r) for r in result] == [0] * len(bad) + [4, 4]
    assert [len(g) for g in result[-1]] == [len(g) for g in GameplayLoader(3).load_log(RIICHIENV.read_text())]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == len(bad)
    for (path, words), msg in zip(bad, messages):
        assert str(path) in msg and words in msg, msg


def test_load_log_raises_bad_log_error_with_line():
    lines = _lines(RIICHIENV)
    with pytest.raises(BadLogError) as e:
        GameplayLoader(3).load_log("\n".join(lines[:3] + ['{"type":"dahai","actor":0,"pai":"9p"}'] + lines[4:]),
                                   "x.json")
    assert e.value.line == 4 and "x.json" in str(e.value) and "illegal move" in str(e.value)


# ----------------------------------------------------------------- multi-ron

# Written by mortal.play.arena.OneVsThree (rulebase MjaiBotAgent "rule_a" vs "rule_b", seed (10002,
# 6383090397482475161), split c). E2 1 honba: seat 0 discards 4p at line 359 (event 358), seats 1
# and 2 both ron it (lines 360-361): seat 1 for 7700 + 300 honba + 1000 riichi stick, seat 2 for 1000.
DOUBLE_RON = DATA_DIR / "arena_double_ron_hanchan.json.gz"


def _double_ron_lines():
    return gzip.decompress(DOUBLE_RON.read_bytes()).decode().splitlines()


def test_double_ron_log_is_kept_and_both_winners_labelled(caplog):
    loader = GameplayLoader(3)
    with caplog.at_level(logging.WARNING, logger="mortal"):
        [games] = loader.load_gz_log_files([DOUBLE_RON])
    assert loader.skipped == 0 and not caplog.records
    assert [g.player_id for g in games] == [0, 1, 2, 3]
    # Mortal's Tenhou rule: every winner of the multi-ron gets label 43 at the discard, with ron legal
    for seat in (1, 2):
        actions, masks = _at(games, seat, 358)
        assert actions == [43] and 43 in masks[0] and 45 in masks[0]
    assert _at(games, 0, 358) == ([], []) and _at(games, 3, 358) == ([], [])
    # hora lines per seat: seat 1 wins 6 times, seat 2 once (the double ron), seat 3 twice
    assert [int((g.actions == 43).sum()) for g in games] == [0, 6, 1, 2]
    for g in games:
        assert g.masks[np.arange(len(g)), g.actions].all()
    # GRP: S2 starts at [8600, 53900, 1000, 36500]; seats 1 and 2 riichi (-1000 each), seat 1 rons
    # seat 2 for 2900 + both sticks -> tobi; the E2 double ron is inside the running scores.
    grp = games[0].grp
    assert grp.final_scores.tolist() == [8600, 57800, -2900, 36500]
    assert grp.rank_by_player.tolist() == [2, 0, 3, 1]
    assert len(grp) == 9


def test_double_ron_kyoku_deltas_reach_next_kyoku():
    events = [json.loads(x) for x in _double_ron_lines()]
    assert [e["type"] for e in events[359:362]] == ["hora", "hora", "end_kyoku"]
    start, nxt = events[272], events[362]
    assert start["scores"] == [18200, 30800, 17000, 34000] and start["honba"] == 1
    scores = list(start["scores"])
    scores[1] -= 1000  # seat 1's riichi at event 308
    for e in events[359:361]:
        scores = [s + d for s, d in zip(scores, e["deltas"])]
    assert scores == nxt["scores"] == [9200, 38800, 18000, 34000]


@pytest.mark.parametrize("second, why", [
    ('{"type":"hora","actor":3,"target":0,"deltas":[-1000,0,0,1000],"ura_markers":[]}', "seat 3 could not ron 4p"),
    ('{"type":"hora","actor":1,"target":0,"deltas":[-1000,1000,0,0],"ura_markers":[]}', "seat 1 already won"),
    ('{"type":"hora","actor":0,"target":0,"deltas":[1000,0,0,0],"ura_markers":[]}', "the discarder"),
])
def test_multi_ron_extra_winner_still_checked(second, why):
    lines = _double_ron_lines()
    lines[360] = second  # the second hora, line 361
    with pytest.raises(BadLogError) as e:
        GameplayLoader(3).load_log("\n".join(lines), "x.json")
    assert e.value.line == 361 and "cannot hora" in str(e.value), why
