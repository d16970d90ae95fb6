"""The teacher stays whole: mjai's RulebaseBot, played through the project's arena, sees each kyoku afresh.

mjai's ``Bot`` keeps its call, discard and dora events from ``start_game`` on. A meld of an earlier kyoku left in
its hand string makes ``find_improving_tiles`` return nothing, and the bot then only discards its draw: no riichi,
no win. The arena keeps it whole by sending every seat a ``start_game`` before each ``start_kyoku`` (a fresh table
every kyoku). These tests watch every bot at every decision in the gen-logs path (``rulebase_games.play_set``) and in
the arena with plain RulebaseBot seats (evaluation against rulebase), and check that the bot's riichi and win rates
after a call in an earlier kyoku of the hanchan are those without one.
"""

from __future__ import annotations

import gzip
import json
import math

import pytest
from mjai.bot.rulebase import RulebaseBot
from mjai.bot.tools import convert_vec34_to_short, fmt_calls

from mortal.tools import rulebase_games
from mortal.play.agent import MjaiBotAgent
from mortal.play.arena import OneVsThree
from mortal.play.game import SPLITS

from test_play_equals_train import _end_games_early

_MELDS = frozenset({"chi", "pon", "daiminkan", "kakan", "ankan"})


class HandWatch:
    """What the watched bots saw: per decision ``(bot number, seat, kyoku number, calls of the seat in earlier kyoku,
    the bot's hand string, the hand string with this kyoku's melds only)``."""

    def __init__(self):
        self.decisions: list[tuple] = []
        self.bots = 0  # bots made so far; each is named by its number

    def react(self, bot, input_str: str, react) -> str:
        """Keep the seat's own record of this kyoku's melds (reset at every ``start_kyoku``, whatever the arena
        sends before it), let the bot ``react``, then note its hand string against that record."""
        for ev in json.loads(input_str):
            if ev["type"] == "start_kyoku":
                bot.watch_kyoku += 1
                bot.watch_earlier += len(bot.watch_melds)
                bot.watch_melds = []
            elif ev["type"] in _MELDS and ev.get("actor") == bot.player_id:
                bot.watch_melds.append(ev)
        out = react(input_str)
        st = bot.player_state
        expected = convert_vec34_to_short(st.tehai, st.akas_in_hand) + fmt_calls(bot.watch_melds, bot.player_id)
        self.decisions.append((bot.watch_bot, bot.player_id, bot.watch_kyoku, bot.watch_earlier, bot.tehai,
                               expected))
        return out

    def stale(self) -> list[tuple]:
        """The decisions whose hand string was not the current kyoku's."""
        return [d for d in self.decisions if d[4] != d[5]]

    def assert_whole(self) -> None:
        """Every decision's hand string carried this kyoku's melds only, and some came after an earlier call."""
        bad = self.stale()
        assert not bad, (f"{len(bad)} of {len(self.decisions)} bot decisions hold melds of an earlier kyoku; first: "
                         f"bot {bad[0][0]} seat {bad[0][1]} kyoku {bad[0][2]} (after {bad[0][3]} earlier calls): "
                         f"hand {bad[0][4]!r}, this kyoku's {bad[0][5]!r}")
        assert any(d[3] for d in self.decisions), "no decision came after a call in an earlier kyoku: vacuous"


def _watched(cls, watch: HandWatch):
    """A subclass of the bot class ``cls`` whose ``react`` goes through ``watch``."""

    class Watched(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.watch_bot, self.watch_kyoku, self.watch_earlier, self.watch_melds = watch.bots, 0, 0, []
            watch.bots += 1

        def react(self, input_str: str) -> str:
            return watch.react(self, input_str, super().react)

    return Watched


# ---------------------------------------------------------------- rates from the logs


def seat_kyoku_outcomes(path) -> list[tuple]:
    """Per kyoku and seat of the mjai log at ``path``: ``(called in an earlier kyoku of the hanchan, declared
    riichi in this kyoku, won in this kyoku)``."""
    with gzip.open(path, "rt") as f:
        events = [json.loads(line) for line in f]
    out, called, kyoku = [], [False] * 4, None
    for ev in events + [{"type": "start_kyoku"}]:  # the sentinel closes the last kyoku
        if ev["type"] == "start_kyoku":
            if kyoku is not None:
                out += [(called[s], kyoku["reach"][s], kyoku["hora"][s]) for s in range(4)]
                called = [c or m for c, m in zip(called, kyoku["meld"])]
            kyoku = {"reach": [False] * 4, "hora": [False] * 4, "meld": [False] * 4}
        elif kyoku is not None and (ev["type"] in ("reach", "hora") or ev["type"] in _MELDS):
            kyoku["meld" if ev["type"] in _MELDS else ev["type"]][ev["actor"]] = True
    return out


def two_proportion_z(hits1: int, n1: int, hits0: int, n0: int) -> float:
    """z of the difference p1 - p0 of two proportions under the pooled null (0 when both are 0 or 1)."""
    p = (hits1 + hits0) / (n1 + n0)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n0))
    return 0.0 if se == 0 else (hits1 / n1 - hits0 / n0) / se


def test_two_proportion_z_by_hand():
    # 30/100 vs 20/100: pooled p = 0.25, se = sqrt(0.25 * 0.75 * 0.02) = 0.061237, z = 0.1 / 0.061237 = 1.633
    assert two_proportion_z(30, 100, 20, 100) == pytest.approx(1.63299, abs=1e-4)
    assert two_proportion_z(0, 10, 0, 10) == 0.0


def test_seat_kyoku_outcomes_of_a_written_log(tmp_path):
    lines = [{"type": "start_game"},
             {"type": "start_kyoku"}, {"type": "pon", "actor": 1}, {"type": "reach", "actor": 2},
             {"type": "hora", "actor": 2}, {"type": "end_kyoku"},
             {"type": "start_kyoku"}, {"type": "reach", "actor": 1}, {"type": "chi", "actor": 3},
             {"type": "end_kyoku"},
             {"type": "start_kyoku"}, {"type": "hora", "actor": 3}, {"type": "end_kyoku"}, {"type": "end_game"}]
    path = tmp_path / "g.json.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(ev) for ev in lines) + "\n")
    f, t = False, True
    assert seat_kyoku_outcomes(path) == [(f, f, f), (f, f, f), (f, t, t), (f, f, f),
                                         (f, f, f), (t, t, f), (f, f, f), (f, f, f),
                                         (f, f, f), (t, f, f), (f, f, f), (t, f, t)]


# ---------------------------------------------------------------- the gen-logs path (fast)


def test_gen_logs_bots_hold_only_this_kyokus_melds(tmp_path, monkeypatch):
    """One gen-logs deal (``rulebase_games.play_set``, the bots of every seat, epsilon 0; games ended after 2-4 kyoku to
    stay fast): at every decision of every bot, its hand string has the melds of the current kyoku only, also
    after calls in earlier kyoku."""
    _end_games_early(monkeypatch)
    watch = HandWatch()
    real = rulebase_games._exploring_rulebase_class
    monkeypatch.setattr(rulebase_games, "_exploring_rulebase_class", lambda: _watched(real(), watch))
    nonce, subs, err = rulebase_games.play_set((str(tmp_path), 7, 5, 0.0))
    assert err is None, err
    assert (tmp_path / "7_5_a.json.gz").is_file()
    watch.assert_whole()
    assert len(watch.decisions) > 200


# ---------------------------------------------------------------- plain RulebaseBot seats: hands and rates (slow)


@pytest.mark.slow
def test_rulebase_bots_win_and_riichi_as_often_after_an_earlier_call(tmp_path, monkeypatch):
    """10 hanchan of four RulebaseBots through ``OneVsThree`` (the seats of an evaluation against rulebase): every
    hand string is the current kyoku's, and the bots' riichi and win rates in the kyoku after one of their calls
    in an earlier kyoku are those of the other kyoku, within noise: |z| < 3 for each (a two-sided 0.3% bound).
    Measured on these deals: riichi 75/193 after an earlier call against 86/223 without (z 0.06), wins 45/193
    against 55/223 (z -0.32); with the per-kyoku start_game withheld from the bots, riichi 1/127 against 101/229
    (z -8.7) and wins 1/127 against 79/229 (z -7.3).

    The seats are deterministic, so the four rotations of a deal play the same game: only rotation a counts.
    """
    watch = HandWatch()
    bot = _watched(RulebaseBot, watch)
    agents = [MjaiBotAgent(bot, name=name) for name in ("challenger", "champion")]
    arena = OneVsThree(disable_progress_bar=True, log_dir=str(tmp_path))
    seeds = 10
    arena.py_vs_py(agents[0], agents[1], seed_start=(300, 17), seed_count=seeds)
    assert not arena.failed_games
    watch.assert_whole()
    rows = [r for n in range(seeds) for r in seat_kyoku_outcomes(tmp_path / f"{300 + n}_17_{SPLITS[0]}.json.gz")]
    after = [r for r in rows if r[0]]
    fresh = [r for r in rows if not r[0]]
    assert len(after) >= 80 and len(fresh) >= 80, (len(after), len(fresh))
    for k, what in ((1, "riichi"), (2, "win")):
        hits1, hits0 = sum(r[k] for r in after), sum(r[k] for r in fresh)
        z = two_proportion_z(hits1, len(after), hits0, len(fresh))
        assert abs(z) < 3, (f"{what} rate after an earlier call {hits1}/{len(after)} = {hits1 / len(after):.3f}, "
                            f"without {hits0}/{len(fresh)} = {hits0 / len(fresh):.3f}: z = {z:.2f}")
