"""The arena's log lines built from the seats' own events (``mortal.play.log_writer.kyoku_lines``): by hand on a
short kyoku, and line for line against the table's full ``mjai_log`` on played games."""

import json

import pytest

import mortal.play.game as game_mod
from mortal.play.arena import OneVsThree
from mortal.play.log_writer import dumps, kyoku_lines, kyoku_results, render_line

from test_arena import PriorityEngine

HIDDEN = ["?"] * 13


def _start(seat):
    """Seat ``seat``'s view of a start_kyoku: its own hand, the others hidden (riichienv's compact, sorted JSON)."""
    tehais = [[f"{s + 1}m"] * 13 if s == seat else HIDDEN for s in range(4)]
    return dumps({"bakaze": "E", "dora_marker": "1p", "honba": 0, "kyoku": 1, "kyotaku": 0, "oya": 0,
                  "scores": [25000] * 4, "tehais": tehais, "type": "start_kyoku"})


def _views():
    """Four seats' views of: start_game, start_kyoku, seat 0 draws 5s and discards it, a ryukyoku, end_game; the
    drawer's seat 0 lacks the last two (as riichienv's ron winner does), so another seat's view leads."""
    views = []
    for s in range(4):
        views.append([
            '{"id":%d,"names":["a","b","c","d"],"type":"start_game"}' % s,
            _start(s),
            '{"actor":0,"pai":"%s","type":"tsumo"}' % ("5s" if s == 0 else "?"),
            '{"actor":0,"pai":"5s","tsumogiri":true,"type":"dahai"}',
            '{"deltas":[0,0,0,0],"reason":"exhaustive_draw","type":"ryukyoku"}',
            '{"type":"end_kyoku"}',
            '{"type":"end_game"}',
        ])
    views[0] = views[0][:5]
    return views


def test_kyoku_lines_by_hand():
    meta = {"q_values": [0.5, -1.25], "mask_bits": 3}
    lines, results = kyoku_lines(_views(), [[({"type": "dahai", "pai": "5s", "actor": 0}, meta)], [], [], []])
    start = json.loads(lines[0])
    assert start["tehais"] == [["1m"] * 13, ["2m"] * 13, ["3m"] * 13, ["4m"] * 13]  # the four hands merged
    assert lines[0].startswith('{"bakaze":"E","dora_marker":"1p",')  # keys stay in the table's order
    assert lines[1:] == [
        '{"actor":0,"pai":"5s","type":"tsumo"}',  # the drawer's own view
        '{"actor":0,"pai":"5s","tsumogiri":true,"type":"dahai","meta":{"q_values":[0.5,-1.25],"mask_bits":3}}',
        '{"deltas":[0,0,0,0],"reason":"exhaustive_draw","type":"ryukyoku"}',
        '{"type":"end_kyoku"}',
    ]
    assert results == [{"deltas": [0, 0, 0, 0], "reason": "exhaustive_draw", "type": "ryukyoku"}]
    assert kyoku_results(_views()) == results


def test_kyoku_lines_meta_a_branch_writes_into_stays_open():
    meta = {"q_values": [1.0], "mask_bits": 1}
    lines, _ = kyoku_lines(_views(), [[({"type": "dahai", "pai": "5s"}, meta)], [], [], []], {id(meta)})
    assert isinstance(lines[2], tuple)
    meta["counterfactual"] = {"action": 3}  # written after the kyoku ended, before the log is rendered
    assert render_line(lines[2]) == ('{"actor":0,"pai":"5s","tsumogiri":true,"type":"dahai","meta":'
                                     '{"q_values":[1.0],"mask_bits":1,"counterfactual":{"action":3}}}')


@pytest.mark.parametrize("queue", [[], [({"type": "dahai", "pai": "6s"}, None)], [({"type": "reach"}, None)]])
def test_kyoku_lines_refuses_a_reaction_that_was_not_submitted(queue):
    with pytest.raises(ValueError, match="seat 0: logged"):
        kyoku_lines(_views(), [queue, [], [], []])


@pytest.mark.slow
def test_log_lines_equal_the_tables_mjai_log(monkeypatch, tmp_path):
    """Every kyoku's lines (meta left out) are the table's own ``mjai_log`` events, byte for byte, on games with
    riichi, calls, kans and hora (``PriorityEngine``)."""
    real = game_mod._Game._end_kyoku
    checked = {"kyoku": 0, "lines": 0}

    def end(self):
        want = [dumps(e) for e in self.env.mjai_log if e["type"] not in ("start_game", "end_game")]
        n = len(self.lines)
        real(self)
        got = [render_line(ln) for ln in self.lines[n:n + len(want)]]
        for line, ev in zip(got, want):
            head, sep, _ = line.partition(',"meta":')
            assert (head + "}" if sep else line) == ev
        assert len(got) == len(want)
        checked["kyoku"] += 1
        checked["lines"] += len(want)

    monkeypatch.setattr(game_mod._Game, "_end_kyoku", end)
    OneVsThree(disable_progress_bar=True, log_dir=str(tmp_path)).py_vs_py(
        PriorityEngine("x", 1), PriorityEngine("y", 2, guard=True), (5, 9), 1)
    assert checked["kyoku"] >= 16 and checked["lines"] > 1000
