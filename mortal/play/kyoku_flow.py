"""The Tenhou hanchan flow between kyoku, as Mortal's ``arena/game.rs``, as pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

HANCHAN_LENGTH = 8  # E1-S4; kyoku index 8-11 is the West extension
MAX_KYOKU_INDEX = 12  # no North round
TARGET_SCORE = 30000


@dataclass(frozen=True)
class KyokuState:
    """Where a hanchan stands at a kyoku's start: ``kyoku_index`` 0 = E1 … 7 = S4, 8-11 = W1-W4; stick
    counts; 4 absolute-seat scores; ``in_renchan`` (Mortal's flag for West-round sudden death)."""

    kyoku_index: int = 0
    honba: int = 0
    kyotaku: int = 0
    scores: tuple = (25000, 25000, 25000, 25000)
    in_renchan: bool = False

    @property
    def oya(self) -> int:
        return self.kyoku_index % 4


@dataclass(frozen=True)
class KyokuResult:
    """What a finished kyoku changed: summed hora/ryukyoku ``deltas`` (4 ints), ``reach_accepted`` (4 ints),
    ``has_hora``, ``abortive``, ``can_renchan`` (dealer won or was tenpai at the exhaustive draw)."""

    deltas: tuple = (0, 0, 0, 0)
    reach_accepted: tuple = (0, 0, 0, 0)
    has_hora: bool = False
    abortive: bool = False
    can_renchan: bool = False


@dataclass(frozen=True)
class KyokuOutcome:
    """``next`` kyoku state (None: game over) and the table's ``scores``/``kyotaku`` after the kyoku."""

    next: KyokuState | None
    scores: tuple
    kyotaku: int


def top_seat(scores: Sequence[int]) -> int:
    """Seat with the most points; ties go to the lowest seat index (game.rs)."""
    return max(range(4), key=lambda s: (scores[s], -s))


def next_kyoku(state: KyokuState, result: KyokuResult) -> KyokuOutcome:
    """The next kyoku or the end of the game under the Tenhou hanchan rules (tobi below 0, agari-yame and
    tenpai-yame at all-last, West extension with sudden death, no North), as Mortal's ``arena/game.rs``."""
    scores = tuple(s + d - 1000 * r for s, d, r in zip(state.scores, result.deltas, result.reach_accepted))
    kyotaku = 0 if result.has_hora else state.kyotaku + sum(result.reach_accepted)
    if any(s < 0 for s in scores):
        return KyokuOutcome(None, scores, kyotaku)
    if result.abortive:
        nxt = KyokuState(state.kyoku_index, state.honba + 1, kyotaku, scores, False)
    elif not result.can_renchan:
        honba = 0 if result.has_hora else state.honba + 1
        nxt = KyokuState(state.kyoku_index + 1, honba, kyotaku, scores, False)
    else:
        oya = state.oya
        if state.kyoku_index >= HANCHAN_LENGTH - 1 and scores[oya] >= TARGET_SCORE and top_seat(scores) == oya:
            return KyokuOutcome(None, scores, kyotaku)
        nxt = KyokuState(state.kyoku_index, state.honba + 1, kyotaku, scores, True)
    if nxt.kyoku_index >= MAX_KYOKU_INDEX or (
        nxt.kyoku_index >= HANCHAN_LENGTH and not nxt.in_renchan and any(s >= TARGET_SCORE for s in scores)
    ):
        return KyokuOutcome(None, scores, kyotaku)
    return KyokuOutcome(nxt, scores, kyotaku)


def final_scores(scores: Sequence[int], kyotaku: int) -> list[int]:
    """Scores at game end: leftover kyotaku (1000 each) go to the top seat (game.rs)."""
    out = list(scores)
    if kyotaku > 0:
        out[top_seat(out)] += 1000 * kyotaku
    return out


def kyoku_result_from_events(events: Sequence[dict], oya: int, oya_shanten: int | None) -> KyokuResult:
    """``KyokuResult`` of one kyoku's event dicts; ``oya_shanten``: the dealer's at the end."""
    deltas = [0, 0, 0, 0]
    reach = [0, 0, 0, 0]
    has_hora = abortive = renchan = False
    for ev in events:
        ty = ev["type"]
        if ty == "hora":
            has_hora = True
            renchan |= ev["actor"] == oya
        elif ty == "ryukyoku":
            if ev.get("reason", "exhaustive_draw") == "exhaustive_draw":
                renchan |= oya_shanten == 0
            else:
                abortive = True
        elif ty == "reach_accepted":
            reach[ev["actor"]] += 1
            continue
        else:
            continue
        for s, d in enumerate(ev["deltas"]):
            deltas[s] += d
    return KyokuResult(tuple(deltas), tuple(reach), has_hora, abortive, renchan or abortive)
