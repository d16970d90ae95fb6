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
    scores = [0, 0, 0, 0]
    oya = 0
    jun = 0  # own discards so far in this kyoku
    fuuro_num = 0  # own chi/pon/daiminkan in this kyoku
    riichi_declared = riichi_accepted = others_declared = False
    for lineno, ev in events:
        kind = ev['type']
        if kind == 'start_kyoku':
            st.round += 1
            scores = _scores(ev, 'scores', source, lineno)
            oya = _seat(ev, 'oya', source, lineno)
            riichi_declared = riichi_accepted = others_declared = False
            if oya == seat:
                st.oya += 1
            jun = fuuro_num = 0
        elif kind == 'dahai':
            if ev['actor'] == seat:
                jun += 1
        elif kind in ('chi', 'pon', 'daiminkan'):
            if ev['actor'] == seat:
                fuuro_num += 1
        elif kind == 'reach':
            if ev['actor'] == seat:
                riichi_declared = True
                st.riichi += 1
                st.riichi_jun += jun
                if oya == seat:
                    st.riichi_as_oya += 1
                if others_declared:
                    st.chasing_riichi += 1
            elif riichi_declared:
                st.riichi_got_chased += 1
            else:
                others_declared = True
        elif kind == 'reach_accepted':
            scores[ev['actor']] -= 1000
            if ev['actor'] == seat:
                riichi_accepted = True
        elif kind == 'hora':
            actor = ev['actor']
            target = _seat(ev, 'target', source, lineno)
            deltas = _scores(ev, 'deltas', source, lineno)
            scores = [s + d for s, d in zip(scores, deltas)]
            if actor == seat:
                _own_win(st, deltas[seat] - 1000 * riichi_accepted, jun, oya == seat, riichi_accepted, fuuro_num)
            elif target == seat:
                _deal_in(st, deltas[seat], jun, oya == actor, riichi_declared, fuuro_num)
        elif kind == 'ryukyoku':
            deltas = _scores(ev, 'deltas', source, lineno)
            scores = [s + d for s, d in zip(scores, deltas)]
            point = deltas[seat]
            st.ryukyoku += 1
            st.ryukyoku_point += point
            if riichi_accepted:
                st.riichi_ryukyoku += 1
                st.riichi_point += point - 1000
            elif fuuro_num > 0:
                st.fuuro_point += point
            if point >= _NAGASHI_MANGAN_POINT:
                st.nagashi_mangan += 1
        elif kind == 'end_kyoku' and fuuro_num > 0:
            st.fuuro += 1
            st.fuuro_num += fuuro_num
    _final_placement(st, scores, seat)


def _own_win(st: Any, point: int, jun: int, as_oya: bool, riichi: bool, fuuro_num: int) -> None:
    """Count a win of ``point`` (own riichi stick excluded) after ``jun`` own discards."""
    st.agari += 1
    st.agari_jun += jun
    if as_oya:
        st.agari_as_oya += 1
        st.agari_point_oya += point
    else:
        st.agari_point_ko += point
    if riichi:
        st.riichi_agari += 1
        st.riichi_agari_jun += jun
        st.riichi_agari_point += point
        st.riichi_point += point
    elif fuuro_num > 0:
        st.fuuro_agari += 1
        st.fuuro_agari_jun += jun
        st.fuuro_agari_point += point
        st.fuuro_point += point
    else:
        st.dama_agari += 1
        st.dama_agari_jun += jun
        st.dama_agari_point += point
    if point >= (_YAKUMAN_POINT_OYA if as_oya else _YAKUMAN_POINT_KO):
        st.yakuman += 1


def _deal_in(st: Any, point: int, jun: int, to_oya: bool, riichi_declared: bool, fuuro_num: int) -> None:
    """Count a deal-in of ``point`` (negative) after ``jun`` own discards; a declared riichi counts (its tile
    may be the one dealt in)."""
    st.houjuu += 1
    st.houjuu_jun += jun
    if to_oya:
        st.houjuu_to_oya += 1
        st.houjuu_point_to_oya += point
    else:
        st.houjuu_point_to_ko += point
    if riichi_declared:
        st.riichi_houjuu += 1
        st.riichi_point += point
    elif fuuro_num > 0:
        st.fuuro_houjuu += 1
        st.fuuro_point += point


def _final_placement(st: Any, scores: list[int], seat: int) -> None:
    """Point, tobi and rank of ``seat``: seat order breaks ties; sticks left on the table go to the top."""
    player_by_rank = sorted(range(4), key=lambda i: -scores[i])
    rest = 100_000 - sum(scores)
    if rest > 0:
        scores[player_by_rank[0]] += rest
    final = scores[seat]
    st.point = final - 25000
    st.tobi = int(final < 0)
    rank = player_by_rank.index(seat)
    setattr(st, f'rank_{rank + 1}', 1)


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
