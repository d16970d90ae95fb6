"""Counting one mjai game for one seat into ``mortal.stat.Stat``'s raw counters, as Mortal's
``libriichi/src/stat.rs``: the per-kyoku bookkeeping (riichi, calls, wins, deal-ins, draws, own discards),
the final placement, and the checks of the event fields only the statistics read (``LogFormatError``).

The conventions (what a "point" includes, when a deal-in counts as after riichi, ...) are those listed in
``mortal.stat``'s module docstring.
"""

from typing import Any, Sequence

from mortal.data.mjai_log import BadLogError, is_int, is_seat

# Mortal's yakuman detection threshold (a yakuman ron value; the point includes honba and
# sticks, so the count is approximate, as in Mortal).
_YAKUMAN_POINT_OYA = 48000
_YAKUMAN_POINT_KO = 32000
_NAGASHI_MANGAN_POINT = 8000


class LogFormatError(BadLogError):
    """A log that cannot be analysed: a ``mortal.data.mjai_log.BadLogError`` (``source``, ``line``,
    ``reason``) whose text is ``"<source>:<line>: <reason>"`` (``"<source>: <reason>"`` without a line)."""

    def _where(self) -> str:
        return f'{self.source}:{self.line}: ' if self.line is not None else f'{self.source}: '


def count_game(st: Any, events: Sequence[tuple[int, dict]], seat: int, source: str) -> None:
    """Add one game of ``seat`` (0-3) to the counters of ``st`` (a ``mortal.stat.Stat``, ``game`` already set by
    the caller; the other counters are incremented in place, ``point``/``tobi``/``rank_k`` set).

    ``events``: ``mortal.data.mjai_log.parse_events`` pairs (line, event), whose types and actors are not
    checked again; ``source``: a name for error messages. Raises LogFormatError (naming ``source`` and the line)
    when a field the statistics need (``scores``, ``oya``, ``target``, ``deltas``) is missing or out of range.
    """
    scores = [0, 0, 0, 0]
    riichi_declared = riichi_accepted = others_declared = False
    oya = 0
    jun = 0  # own discards so far in this kyoku
    fuuro_num = 0  # own chi/pon/daiminkan in this kyoku

    for lineno, ev in events:
        kind = ev['type']
        if kind == 'start_kyoku':
            st.round += 1
            scores = _scores(ev, 'scores', source, lineno)
            oya = _seat(ev, 'oya', source, lineno)
            riichi_declared = riichi_accepted = others_declared = False
            if oya == seat:
                st.oya += 1
            jun = 0
            fuuro_num = 0
        elif kind == 'dahai':
            if ev['actor'] == seat:
                jun += 1
        elif kind in ('chi', 'pon', 'daiminkan'):
            if ev['actor'] == seat:
                fuuro_num += 1
        elif kind == 'reach':
            actor = ev['actor']
            if actor == seat:
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
            actor = ev['actor']
            scores[actor] -= 1000
            if actor == seat:
                riichi_accepted = True
        elif kind == 'hora':
            actor = ev['actor']
            target = _seat(ev, 'target', source, lineno)
            deltas = _scores(ev, 'deltas', source, lineno)
            for i in range(4):
                scores[i] += deltas[i]
            if actor == seat:
                point = deltas[seat] - 1000 * riichi_accepted
                st.agari += 1
                st.agari_jun += jun
                if oya == seat:
                    st.agari_as_oya += 1
                    st.agari_point_oya += point
                else:
                    st.agari_point_ko += point
                if riichi_accepted:
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
                if point >= (_YAKUMAN_POINT_OYA if oya == seat else _YAKUMAN_POINT_KO):
                    st.yakuman += 1
            elif target == seat:
                point = deltas[seat]
                st.houjuu += 1
                st.houjuu_jun += jun
                if oya == actor:
                    st.houjuu_to_oya += 1
                    st.houjuu_point_to_oya += point
                else:
                    st.houjuu_point_to_ko += point
                # declared (not only accepted): the declaration tile itself counts
                if riichi_declared:
                    st.riichi_houjuu += 1
                    st.riichi_point += point
                elif fuuro_num > 0:
                    st.fuuro_houjuu += 1
                    st.fuuro_point += point
        elif kind == 'ryukyoku':
            deltas = _scores(ev, 'deltas', source, lineno)
            for i in range(4):
                scores[i] += deltas[i]
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
        elif kind == 'end_kyoku':
            if fuuro_num > 0:
                st.fuuro += 1
                st.fuuro_num += fuuro_num

    # Final placement: seat order breaks ties; sticks left on the table go to the top.
    player_by_rank = sorted(range(4), key=lambda i: -scores[i])
    rest = 100_000 - sum(scores)
    if rest > 0:
        scores[player_by_rank[0]] += rest
    final = scores[seat]
    st.point = final - 25000
    st.tobi = int(final < 0)
    rank = player_by_rank.index(seat)
    setattr(st, f'rank_{rank + 1}', 1)


# ---------------------------------------------------------------------- field checks
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
