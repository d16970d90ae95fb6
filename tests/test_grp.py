"""GRP records: hand-computed rows, final scores, rankings; scores rebuilt from rows reproduce the deltas."""

import gzip
import json

import numpy as np
import pytest

from mortal.data.grp import Grp, grand_kyoku, rank_by_player
from mortal.data.mjai_log import BadLogError, parse_log

from conftest import DATA_DIR

RIICHIENV = DATA_DIR / "riichienv_selfplay_hanchan.jsonl"
META = DATA_DIR / "meta_annotated_hanchan.jsonl"


def test_rankings_ties_go_to_lower_seat():
    # Examples of Mortal's rankings.rs tests.
    assert rank_by_player([25000, 25000, 30000, 20000]) == [1, 2, 0, 3]
    assert rank_by_player([18000, 32000, 32000, 18000]) == [2, 0, 1, 3]


def test_grand_kyoku():
    assert [grand_kyoku("E", 1), grand_kyoku("E", 4), grand_kyoku("S", 1), grand_kyoku("S", 4),
            grand_kyoku("W", 4)] == [0, 3, 4, 7, 11]


def test_riichienv_rows_and_final_by_hand():
    g = Grp.load_log(RIICHIENV.read_text())
    f = g.take_feature()
    assert f.shape == (12, 7) and f.dtype == np.float64
    assert f[:, 0].tolist() == [0, 1, 2, 2, 2, 3, 3, 4, 5, 5, 6, 7]
    assert f[:, 1].tolist() == [0, 0, 0, 1, 2, 0, 1, 2, 0, 1, 0, 1]
    assert f[:, 2].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]
    assert f[0, 3:].tolist() == [2.5, 2.5, 2.5, 2.5]
    # S4 starts 10700/14900/29500/43900 with 1 stick; seat 0 declares riichi and deals in
    # on the declaration tile (no reach_accepted): hora deltas [-8300, 0, 9300, 0].
    assert np.allclose(f[11, 3:], [1.07, 1.49, 2.95, 4.39])
    assert g.take_final_scores().tolist() == [2400, 14900, 38800, 43900]
    assert g.take_rank_by_player().tolist() == [3, 2, 1, 0]


def test_meta_final_by_hand():
    g = Grp.load_log(META.read_text())
    # S4 starts 8200/54300/24500/13000, seat 1 rons seat 3 for 1300.
    assert g.final_scores.tolist() == [8200, 55600, 24500, 11700]
    assert g.rank_by_player.tolist() == [3, 0, 1, 2]


def _mini_log(extra_events, scores=(25000, 25000, 25000, 25000), kyotaku=0):
    hands = [["1m"] * 13] * 4
    evs = [{"type": "start_game", "names": ["a", "b", "c", "d"]},
           {"type": "start_kyoku", "bakaze": "S", "kyoku": 2, "honba": 3, "kyotaku": kyotaku, "oya": 1,
            "dora_marker": "1s", "scores": list(scores), "tehais": hands},
           *extra_events, {"type": "end_kyoku"}, {"type": "end_game"}]
    return "\n".join(json.dumps(e) for e in evs)


def test_leftover_deposit_goes_to_top_after_ranking():
    # seat 0 riichi (-1000), draw with no payments: 24000/25000/25000/25000 sums to 99000.
    # Ranking first ([3, 0, 1, 2], ties to the lower seat), then the 1000 goes to seat 1.
    raw = _mini_log([{"type": "reach_accepted", "actor": 0},
                     {"type": "ryukyoku", "deltas": [0, 0, 0, 0]}])
    g = Grp.load_log(raw)
    assert g.rank_by_player.tolist() == [3, 0, 1, 2]
    assert g.final_scores.tolist() == [24000, 26000, 25000, 25000]
    assert g.feature.tolist() == [[5.0, 3.0, 0.0, 2.5, 2.5, 2.5, 2.5]]


def test_multi_ron_adds_every_hora_and_kyotaku_raw():
    raw = _mini_log([{"type": "hora", "actor": 1, "target": 0, "deltas": [-8000, 8000, 0, 0]},
                     {"type": "hora", "actor": 2, "target": 0, "deltas": [-2000, 0, 2000, 0]}],
                    scores=(30000, 20000, 25000, 23000), kyotaku=2)
    g = Grp.load_log(raw)
    assert g.feature[0, 2] == 2.0  # kyotaku not scaled
    # 20000/28000/27000/23000 sums to 98000 -> +2000 to the top (seat 1)
    assert g.final_scores.tolist() == [20000, 30000, 27000, 23000]
    assert g.rank_by_player.tolist() == [3, 0, 1, 2]


def test_missing_deltas_rejected():
    with pytest.raises(BadLogError, match="deltas"):
        Grp.load_log(_mini_log([{"type": "ryukyoku"}]))


@pytest.mark.parametrize("path", [RIICHIENV, META], ids=lambda p: p.stem)
def test_scores_rebuilt_from_rows_reproduce_recorded_deltas(path):
    """Rows x 1e4 (then final scores) must step by exactly the recorded deltas and riichi sticks.

    A wrong scale (x1e5, Mortal's old bug) or seat order breaks every step.
    """
    events = [json.loads(x) for x in path.read_text().splitlines()]
    g = Grp.load_log(path.read_text())
    seq = np.concatenate((np.rint(g.feature[:, 3:] * 1e4), [g.final_scores]))
    steps = []  # per kyoku: sum of deltas - 1000 per reach_accepted
    for ev in events:
        if ev["type"] == "start_kyoku":
            steps.append(np.zeros(4))
        elif ev["type"] in ("hora", "ryukyoku"):
            steps[-1] += ev["deltas"]
        elif ev["type"] == "reach_accepted":
            steps[-1][ev["actor"]] -= 1000
    assert len(steps) == len(g.feature) == 12
    diffs = seq[1:] - seq[:-1]
    np.testing.assert_array_equal(diffs[:-1], np.array(steps[:-1]))
    leftover = 100000 - (seq[-2] + steps[-1]).sum()
    expect_last = np.array(steps[-1])
    expect_last[np.argmin(g.rank_by_player)] += leftover
    np.testing.assert_array_equal(diffs[-1], expect_last)
    assert seq.sum(axis=1)[-1] == 100000


def test_load_gz_log_files_skips_bad(tmp_path, caplog):
    good = tmp_path / "good.json.gz"
    good.write_bytes(gzip.compress(META.read_bytes()))
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b"<html></html>"))
    skipped = []
    out = Grp.load_gz_log_files([bad, good], skipped=skipped)
    assert len(out) == 1 and out[0].final_scores.tolist() == [8200, 55600, 24500, 11700]
    assert len(skipped) == 1 and skipped[0][0] == str(bad) and "XML/HTML" in skipped[0][1]
    assert sum("bad.json.gz" in r.getMessage() for r in caplog.records) == 1


def test_parse_log_keeps_lines_and_line_numbers():
    log = parse_log('\n{"type":"start_game"}\n\n' + "\n".join(RIICHIENV.read_text().splitlines()[1:]))
    assert log.line_numbers[:2] == [2, 4] and log.lines[0] == '{"type":"start_game"}'


def test_double_ron_adds_each_hora_deltas():
    # arena log (see tests/test_gameplay.py): E2-1 double ron, seats 1 and 2 both ron seat 0's 4p.
    path = DATA_DIR / "arena_double_ron_hanchan.json.gz"
    skipped = []
    [g] = Grp.load_gz_log_files([path], skipped)
    assert skipped == []
    # final: S2 start [8600, 53900, 1000, 36500], riichi seats 1+2, seat 1 rons seat 2 (+2900 + 2 sticks)
    assert g.final_scores.tolist() == [8600, 57800, -2900, 36500]
    assert g.rank_by_player.tolist() == [2, 0, 3, 1]
    # the row after the double ron holds E2-2's scores: [18200, 30800, 17000, 34000] - 1000 (seat 1
    # riichi) + [-8000, 9000, 0, 0] + [-1000, 0, 1000, 0]
    f = g.take_feature()
    assert f[3].tolist() == [1, 2, 0, 0.92, 3.88, 1.8, 3.4]
