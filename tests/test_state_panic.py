"""A Rust panic in one seat's mjai ``PlayerState`` (pyo3's PanicException, a BaseException) ends only that game.

The real case (an evaluation died on it): a legal kyoku in which one seat discards 25 times (it draws 21 tiles and
calls 4 times; others pon its discards so its turn comes again at once) overflows the state's 24-slot kawa. The
arena now ends that game as failed and plays the others; the evaluation drops that deal whole.
"""

import gzip
import json
import logging
import pathlib

import pytest
from mjai.mlibriichi.state import PlayerState

from mortal.play import arena, counterfactual, game
from mortal.play.arena import OneVsThree
from mortal.play.game import StatePanic
from test_arena import PriorityEngine, check_log, read_log

DATA = pathlib.Path(__file__).resolve().parent / "data"


class PanicException(BaseException):
    """Stands for pyo3's PanicException (same name, a BaseException)."""


class PanickingState:
    """A ``PlayerState`` whose ``update`` panics; other attributes are the wrapped state's."""

    def __init__(self, st):
        self.st = st

    def update(self, ev):
        raise PanicException("ArrayVec::push> capacity overflow!")

    def __getattr__(self, name):
        return getattr(self.st, name)


def masked(events, seat):
    """The events as ``seat`` sees them (others' haipai and draws hidden)."""
    out = []
    for e in events:
        e = dict(e)
        if e["type"] == "start_kyoku":
            e["tehais"] = [t if i == seat else ["?"] * 13 for i, t in enumerate(e["tehais"])]
        elif e["type"] == "tsumo" and e["actor"] != seat:
            e["pai"] = "?"
        out.append(e)
    return out


def test_a_25th_discard_panics_mjai_state():
    # the kyoku of game 10190_465557353070_c (E4, 0 honba) of the failed evaluation, as the table logged it:
    # an exhaustive draw after seat 0's 25th discard (21 draws + 4 calls), 15 calls in all
    with gzip.open(DATA / "kawa25_kyoku.jsonl.gz", "rt") as f:
        events = [json.loads(line) for line in f]
    assert sum(e["type"] == "tsumo" for e in events) == 70
    assert sum(e["type"] == "dahai" and e["actor"] == 0 for e in events) == 25
    last = max(i for i, e in enumerate(events) if e["type"] == "dahai" and e["actor"] == 0)
    for seat in range(4):  # every seat keeps all four kawa: each one overflows on that discard
        st = PlayerState(seat)
        seen = masked(events, seat)
        game._feed(seat, st, None, [json.dumps(ev) for ev in seen[:last]])
        with pytest.raises(StatePanic, match=r"seat \d's PlayerState panicked on .*dahai.*capacity overflow") as e:
            game._feed(seat, st, None, [json.dumps(seen[last])])
        assert json.loads(e.value.event) == seen[last]


def test_other_errors_of_a_state_are_not_taken_for_a_panic():
    with pytest.raises(Exception) as e:
        game._feed(0, PlayerState(0), None, ["{not json"])
    assert not isinstance(e.value, StatePanic)


def test_a_panicking_state_fails_only_its_game(tmp_path, monkeypatch, caplog, two_kyoku):
    # games of two kyoku (two_kyoku): the panic comes at the end of the first
    end_kyoku = game._Game._end_kyoku

    def panic_once(self):
        # game 101_42_b's first kyoku end: seat 2's state panics while catching up with the kyoku's last events
        if (self.nonce, self.split) == (101, "b") and not isinstance(self.states[2], PanickingState):
            self.states[2] = PanickingState(self.states[2])
        end_kyoku(self)

    monkeypatch.setattr(game._Game, "_end_kyoku", panic_once)
    env = OneVsThree(disable_progress_bar=True, log_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="mortal.arena"):
        ranks = env.py_vs_py(PriorityEngine("trainee", 1), PriorityEngine("baseline", 2), (100, 42), 2)
    assert sum(ranks) == 7
    assert [g[:3] for g in env.failed_games] == [(101, 42, "b")]
    assert "seat 2's PlayerState panicked on" in env.failed_games[0][3]
    assert sorted((n, s) for n, _, s, _, _ in env.last_games) == sorted(
        (n, s) for n in (100, 101) for s in "abcd" if (n, s) != (101, "b"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{n}_42_{s}.json.gz" for n in (100, 101) for s in "abcd" if (n, s) != (101, "b"))
    for p in tmp_path.iterdir():
        events = read_log(p)
        check_log(events, events[0]["names"])
    warning = next(r.getMessage() for r in caplog.records if "left out" in r.getMessage())
    assert "game 101_42_b (seed 101, 42): seat 2's PlayerState panicked on" in warning
    assert "capacity overflow" in warning and '"type"' in warning  # the panic and the event it came on


def test_a_panicking_counterfactual_branch_is_dropped(monkeypatch, two_kyoku):
    branch_end = counterfactual._Branch._end_kyoku

    def panic(self):
        self.states = [PanickingState(st) for st in self.states]
        branch_end(self)

    monkeypatch.setattr(counterfactual._Branch, "_end_kyoku", panic)
    env = OneVsThree(disable_progress_bar=True, counterfactual_rate=0.2)
    ranks = env.py_vs_py(PriorityEngine("trainee", 1), PriorityEngine("baseline", 2), (100, 42), 1)
    assert sum(ranks) == 4 and not env.failed_games
    c = env.counterfactual
    assert c["forked"] > 0 and c["recorded"] == 0 and c["dropped"] == c["forked"]


def test_evaluation_drops_a_deal_with_a_failed_game_whole(monkeypatch, caplog):
    from mortal.play import evaluation

    def play(self, challenger, champion, seed_start, seed_count):
        # nonce 101's split c failed
        self.last_games = [(n, 7, s, [25000] * 4, [0, 1, 2, 3]) for n in (100, 101) for s in "abcd"
                           if (n, s) != (101, "c")]
        self.failed_games = [(101, 7, "c", "seat 1's PlayerState panicked on ...")]
        return [2, 2, 2, 1]

    monkeypatch.setattr(arena.OneVsThree, "py_vs_py", play)
    monkeypatch.setattr(evaluation, "_side", lambda side, role: None)
    monkeypatch.setattr(evaluation, "SEED_START", 100)
    assert evaluation.play_chunk((("rulebase", None), ("rulebase", None), 100, 2, 7)) == {100: [1, 2, 3, 4]}
    with caplog.at_level(logging.WARNING, logger="mortal.evaluation"):
        units = evaluation.play_duplicate(("rulebase", None), ("rulebase", None), sets=2, key=7, chunk=2)
    assert units == {100: [1, 2, 3, 4]}
    assert any("1 of 2 deals (key 7) left out" in r.getMessage() and "[101]" in r.getMessage()
               for r in caplog.records)
