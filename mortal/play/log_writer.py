"""Game logs written off the arena's decision path, on a background thread: gzip level 9 as Mortal, or level 1 for the
self-play logs the learner reads once (a fifth of level 9's CPU, files ~17% larger; docs/performance.md)."""

from __future__ import annotations

import gzip
import json
from concurrent.futures import Future, ThreadPoolExecutor

from mortal.util.fsutil import atomic_write

REACTION_TYPES = frozenset(("dahai", "chi", "pon", "daiminkan", "kakan", "ankan", "reach"))  # logged with meta
_RESULT_TYPES = frozenset(("hora", "ryukyoku", "reach_accepted"))  # what kyoku_flow reads of a kyoku
dumps = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(x, separators=...) without a new encoder per call
MAX_PENDING = 64  # logs queued at most (a hanchan's text is ~0.3-1 MB): the loop waits for the oldest beyond


def write_log_atomic(path: str, text: str, compresslevel: int = 9) -> None:
    """gzip ``text`` to ``path`` at ``compresslevel`` (1-9) via a temporary name and rename, no fsync. Raises
    OSError."""
    # filename='': no file name in the gzip header (the temporary one would be recorded)
    with atomic_write(path, fsync=False) as raw, \
            gzip.GzipFile(filename="", mode="wb", compresslevel=compresslevel, fileobj=raw) as gz:
        gz.write(text.encode())


_META_KEYS = ["q_values", "mask_bits", "is_greedy", "shanten", "at_furiten", "batch_size", "eval_time_ns"]
_META_TYPES = (list, int, bool, int, bool, int, int)
_NUMBER_CHARS = str.maketrans("", "", "0123456789.,-+e[]")  # a JSON array of finite numbers has no other


def meta_json(meta: dict) -> str:
    """``dumps(meta)``, the same text; an agent's plain meta (``_META_KEYS`` in that order, finite float Q values)
    is written by hand, 1.3-2x faster than the encoder."""
    if list(meta) == _META_KEYS and tuple(map(type, meta.values())) == _META_TYPES:
        q, bits, greedy, shanten, furiten, size, ns = meta.values()
        qs = repr(q).replace(" ", "")  # a list of floats: JSON's text but for the spaces
        if not qs.translate(_NUMBER_CHARS):  # not inf / nan / bools / numpy scalars
            return (f'{{"q_values":{qs},"mask_bits":{bits},"is_greedy":{"true" if greedy else "false"},'
                    f'"shanten":{shanten},"at_furiten":{"true" if furiten else "false"},"batch_size":{size},'
                    f'"eval_time_ns":{ns}}}')
    return dumps(meta)


def _event_type(line: str) -> str:
    i = line.rfind('"type":"') + 8
    return line[i:line.index('"', i)]


def kyoku_lines(views: list[list[str]], meta_queues: list[list], waiting=frozenset(),
                pass_metas=()) -> tuple[list, list[dict]]:
    """One kyoku's log lines from the seats' masked events ``views``, and its result events.

    ``meta_queues``: per seat, ``[reaction, meta or None]`` of its logged reactions, checked against the events; a
    meta whose ``id`` is in ``waiting`` stays a ``(line, meta)`` pair until ``render_line``. ``pass_metas``: per
    seat, ``(view index, {"actor": seat, "meta": meta})`` of its passes that forked a branch ('contested'), added to
    the answered event's line as ``"pass"``. Returns ``(lines, [hora/ryukyoku/reach_accepted dicts])``; ValueError
    (naming the seat) for a reaction not the one submitted."""
    back = max(views, key=len)
    passes = {i: rec for q in pass_metas for i, rec in q}
    queues = [iter(q) for q in meta_queues]
    lines, results = [], []
    for i, line in enumerate(back):
        ty = _event_type(line)
        if ty in REACTION_TYPES:
            actor = int(line[9])  # '{"actor":N,...': actor is the first key of a reaction
            sub = next(queues[actor], None)
            if sub is None or sub[0]["type"] != ty or ("pai" in sub[0] and f'"pai":"{sub[0]["pai"]}"' not in line):
                raise ValueError(f"seat {actor}: logged {line} does not match the submitted reaction "
                                 f"{None if sub is None else sub[0]}")
            meta = sub[1]
            if meta is not None:
                line = (line[:-1], meta) if id(meta) in waiting else f'{line[:-1]},"meta":{meta_json(meta)}}}'
        elif ty == "tsumo":
            line = views[int(line[9])][i]  # the drawer's own view shows the tile
        elif ty == "start_kyoku":
            ev = json.loads(line)
            ev["tehais"] = [json.loads(v[i])["tehais"][s] for s, v in enumerate(views)]
            line = dumps(ev)
        elif ty in _RESULT_TYPES:
            results.append(json.loads(line))
        elif ty in ("start_game", "end_game"):
            continue
        rec = passes.get(i)
        if rec is not None and isinstance(line, str):
            if id(rec["meta"]) in waiting:
                line = (line[:-1], rec, "pass")
            elif "counterfactual" in rec["meta"]:
                line = f'{line[:-1]},"pass":{dumps(rec)}}}'
        lines.append(line)
    return lines, results


def kyoku_results(views: list[list[str]]) -> list[dict]:
    """The ``hora`` / ``ryukyoku`` / ``reach_accepted`` events (dicts) of one kyoku's seat views (as ``kyoku_lines``)."""
    return [json.loads(ln) for ln in max(views, key=len) if _event_type(ln) in _RESULT_TYPES]


def render_line(line) -> str:
    """A log line of ``kyoku_lines`` as text (a ``(head, meta)`` pair gets its meta now, a ``(head, record, key)``
    triple its record under ``key``)."""
    if isinstance(line, str):
        return line
    if len(line) > 2:
        return f'{line[0]},"{line[2]}":{dumps(line[1])}}}'
    return f'{line[0]},"meta":{meta_json(line[1])}}}'


class LogWriter:
    """Writes logs on one background thread, in order (``submit`` blocks at ``MAX_PENDING``); ``submit`` and
    ``close`` raise the first OSError, after which nothing more is written. A context manager, used once.
    ``compresslevel``: gzip's, 1-9."""

    def __init__(self, compresslevel: int = 9):
        self.compresslevel = compresslevel
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arena-logs")  # no thread before a submit
        self._pending: list[Future] = []

    def submit(self, path: str, text: str) -> None:
        """Queue ``text`` for ``path``; raises the error of an earlier write, if any."""
        while self._pending and (self._pending[0].done() or len(self._pending) >= MAX_PENDING):
            self._reap()
        self._pending.append(self._pool.submit(write_log_atomic, path, text, self.compresslevel))

    def _reap(self) -> None:
        fut = self._pending.pop(0)
        try:
            fut.result()
        except BaseException:
            for f in self._pending:  # no log written after a failure
                f.cancel()
            self._pending.clear()
            raise

    def close(self) -> None:
        """Wait for every queued log; raises the first write error."""
        try:
            while self._pending:
                self._reap()
        finally:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except Exception:
            if exc_type is None:  # else the block's own exception is the one to see
                raise
