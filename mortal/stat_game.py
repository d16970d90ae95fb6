"""Counting one mjai game for one seat into ``mortal.stat.Stat``'s raw counters, as Mortal's ``stat.rs``.

The conventions are listed in ``mortal.stat``'s module docstring."""

from typing import Any, Sequence

from mortal.data.mjai_log import BadLogError, is_int, is_seat

# Mortal's yakuman threshold (the point includes honba and sticks: approximate, as in Mortal).
_YAKUMAN_POINT_OYA = 48000
_YAKUMAN_POINT_KO = 32000
_NAGASHI_MANGAN_POINT = 8000


class LogFormatError(BadLogError):
    """A log that cannot be analysed: a BadLogError whose text is ``"<source>:<line>: <reason>"``."""

    def _where(self) -> str:
        return f'{self.source}:{self.line}: ' if self.line is not None else f'{self.source}: '


def count_game(st: Any, events: Sequence[tuple[int, dict]], seat: int, source: str) -> None:
    """Add one game of ``seat`` (0-3) to the counters of ``st`` (``game`` set by the caller).

    ``events``: ``parse_events`` pairs (line, event), not checked again. Raises LogFormatError (naming ``source``
    and the line) when a field the statistics need is missing or out of range."""
    game = _GameCount(st, seat, source)
    for lineno, ev in events:
        handler = _HANDLERS.get(ev['type'])
        if handler is not None:
            handler(game, ev, lineno)
    game.final_placement()


class _GameCount:
    """One game of ``seat`` being counted into ``st``: one method per event kind the statistics read."""

    def __init__(self, st: Any, seat: int, source: str):
        self.st = st
        self.seat = seat
        self.source = source
        self.scores = [0, 0, 0, 0]
        self.riichi_declared = self.riichi_accepted = self.others_declared = False
        self.oya = 0
        self.jun = 0  # own discards so far in this kyoku
        self.fuuro_num = 0  # own chi/pon/daiminkan in this kyoku

    def start_kyoku(self, ev: dict, lineno: int) -> None:
        st = self.st
        st.round += 1
        self.scores = _scores(ev, 'scores', self.source, lineno)
        self.oya = _seat(ev, 'oya', self.source, lineno)
        self.riichi_declared = self.riichi_accepted = self.others_declared = False
        if self.oya == self.seat:
            st.oya += 1
        self.jun = 0
        self.fuuro_num = 0

    def dahai(self, ev: dict, lineno: int) -> None:
        if ev['actor'] == self.seat:
            self.jun += 1

    def call(self, ev: dict, lineno: int) -> None:
        """chi, pon, daiminkan."""
        if ev['actor'] == self.seat:
            self.fuuro_num += 1

    def reach(self, ev: dict, lineno: int) -> None:
        st = self.st
        if ev['actor'] == self.seat:
            self.riichi_declared = True
            st.riichi += 1
            st.riichi_jun += self.jun
            if self.oya == self.seat:
                st.riichi_as_oya += 1
            if self.others_declared:
                st.chasing_riichi += 1
        elif self.riichi_declared:
            st.riichi_got_chased += 1
        else:
            self.others_declared = True

    def reach_accepted(self, ev: dict, lineno: int) -> None:
        actor = ev['actor']
        self.scores[actor] -= 1000
        if actor == self.seat:
            self.riichi_accepted = True

    def hora(self, ev: dict, lineno: int) -> None:
        actor = ev['actor']
        target = _seat(ev, 'target', self.source, lineno)
        deltas = _scores(ev, 'deltas', self.source, lineno)
        self.scores = [s + d for s, d in zip(self.scores, deltas)]
        if actor == self.seat:
            self._own_win(deltas[self.seat] - 1000 * self.riichi_accepted)
        elif target == self.seat:
            self._deal_in(deltas[self.seat], actor)

    def _own_win(self, point: int) -> None:
        st, jun = self.st, self.jun
        st.agari += 1
        st.agari_jun += jun
        if self.oya == self.seat:
            st.agari_as_oya += 1
            st.agari_point_oya += point
        else:
            st.agari_point_ko += point
        if self.riichi_accepted:
            st.riichi_agari += 1
            st.riichi_agari_jun += jun
            st.riichi_agari_point += point
            st.riichi_point += point
        elif self.fuuro_num > 0:
            st.fuuro_agari += 1
            st.fuuro_agari_jun += jun
            st.fuuro_agari_point += point
            st.fuuro_point += point
        else:
            st.dama_agari += 1
            st.dama_agari_jun += jun
            st.dama_agari_point += point
        if point >= (_YAKUMAN_POINT_OYA if self.oya == self.seat else _YAKUMAN_POINT_KO):
            st.yakuman += 1

    def _deal_in(self, point: int, winner: int) -> None:
        st = self.st
        st.houjuu += 1
        st.houjuu_jun += self.jun
        if self.oya == winner:
            st.houjuu_to_oya += 1
            st.houjuu_point_to_oya += point
        else:
            st.houjuu_point_to_ko += point
        # declared (not only accepted): the declaration tile itself counts
        if self.riichi_declared:
            st.riichi_houjuu += 1
            st.riichi_point += point
        elif self.fuuro_num > 0:
            st.fuuro_houjuu += 1
            st.fuuro_point += point

    def ryukyoku(self, ev: dict, lineno: int) -> None:
        st = self.st
        deltas = _scores(ev, 'deltas', self.source, lineno)
        self.scores = [s + d for s, d in zip(self.scores, deltas)]
        point = deltas[self.seat]
        st.ryukyoku += 1
        st.ryukyoku_point += point
        if self.riichi_accepted:
            st.riichi_ryukyoku += 1
            st.riichi_point += point - 1000
        elif self.fuuro_num > 0:
            st.fuuro_point += point
        if point >= _NAGASHI_MANGAN_POINT:
            st.nagashi_mangan += 1

    def end_kyoku(self, ev: dict, lineno: int) -> None:
        if self.fuuro_num > 0:
            self.st.fuuro += 1
            self.st.fuuro_num += self.fuuro_num

    def final_placement(self) -> None:
        """Seat order breaks ties; sticks left on the table go to the top."""
        scores, st = self.scores, self.st
        player_by_rank = sorted(range(4), key=lambda i: -scores[i])
        rest = 100_000 - sum(scores)
        if rest > 0:
            scores[player_by_rank[0]] += rest
        final = scores[self.seat]
        st.point = final - 25000
        st.tobi = int(final < 0)
        rank = player_by_rank.index(self.seat)
        setattr(st, f'rank_{rank + 1}', 1)


_HANDLERS = {'start_kyoku': _GameCount.start_kyoku, 'dahai': _GameCount.dahai, 'chi': _GameCount.call,
             'pon': _GameCount.call, 'daiminkan': _GameCount.call, 'reach': _GameCount.reach,
             'reach_accepted': _GameCount.reach_accepted, 'hora': _GameCount.hora,
             'ryukyoku': _GameCount.ryukyoku, 'end_kyoku': _GameCount.end_kyoku}


# Fields only the statistics read (mortal.data.mjai_log.parse_events checked types and actors).

def _seat(ev: dict, key: str, source: str, lineno: int) -> int:
    v = ev.get(key)
    if not is_seat(v):
        raise LogFormatError(source, f'{ev["type"]} field {key!r} must be a seat 0-3, got {v!r}', lineno)
    return v


def _scores(ev: dict, key: str, source: str, lineno: int) -> list[int]:
    v = ev.get(key)
    if not isinstance(v, list) or len(v) != 4 or not all(is_int(x) for x in v):
        raise LogFormatError(source, f'{ev["type"]} field {key!r} must be 4 integers (required for statistics), '
                                     f'got {v!r}', lineno)
    return list(v)
