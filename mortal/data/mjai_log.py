"""The mjai log reader: a recorded game (gzip or plain JSON lines) -> checked events; failures are ``BadLogError``."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from dataclasses import dataclass

from mortal import config as _config
from mortal.features.mjai import ACTOR_EVENTS, MJAI_EVENT_TYPES, is_int, is_seat  # re-exported: this module's API

MAX_KYOKU = 256  # Gameplay numbers kyoku in uint8 (Mortal's ``at_kyoku: u8``): more would wrap and mix up rewards
MAX_EVENTS = 100_000  # a hanchan has a few thousand: stops files that are not one game early
MAX_POINTS = 1_000_000  # |score| and |delta| of any real game are far below (a yakuman is 48,000): rewards stay sane
DEFAULT_MAX_LOG_BYTES = _config.DEFAULT_MAX_LOG_BYTES  # ``[dataset] max_log_bytes``: a hanchan is well under 1 MB

_GZIP_MAGIC = b"\x1f\x8b"
_scan_once = json.JSONDecoder().scan_once  # json.loads' own scanner (see _scan)
_READ_CHUNK = 1 << 20
# Event types with fields that only a training log must have (parse_log).
_TRAINING_FIELDS = frozenset({"start_game", "start_kyoku", "hora", "ryukyoku"})


class BadLogError(ValueError):
    """A log that cannot be used: ``source``, ``line`` (1-based or None), ``reason``."""

    def __init__(self, source: str, reason: str, line: int | None = None):
        self.source = str(source)
        self.reason = reason
        self.line = line
        super().__init__(self._where() + reason)

    def _where(self) -> str:  # LogFormatError (mortal.stat_game) words it as file:line
        return f"{self.source}: line {self.line}: " if self.line is not None else f"{self.source}: "


@dataclass
class LoadedLog:
    """A parsed mjai log: ``events`` (dicts), ``lines`` (their JSON text), ``line_numbers`` (1-based), ``source``."""

    events: list[dict]
    lines: list[str]
    line_numbers: list[int]
    source: str = "<log>"


def _read_capped(f, max_bytes: int, path, what: str) -> bytes:
    # Chunked reads so that memory stays within about max_bytes + one chunk whatever the file claims to hold.
    chunks, size = [], 0
    while True:
        chunk = f.read(_READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise BadLogError(path, f"{what} exceeds the cap of {max_bytes:,} bytes ([dataset] max_log_bytes; "
                                    f"a decompression bomb or not a single game?)")
        chunks.append(chunk)


def decode_log_bytes(data: bytes, source: str = "<log>", error: type[BadLogError] = BadLogError) -> str:
    """UTF-8 text of a log's bytes, a leading BOM dropped; ``BadLogError`` (or ``error``) if not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(source, f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_log_text(path, max_bytes: int | None = DEFAULT_MAX_LOG_BYTES) -> str:
    """A log file's text, gunzipped if gzip, at most ``max_bytes`` decompressed. Raises ``BadLogError``, OSError."""
    cap = math.inf if max_bytes is None else max_bytes
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the open forever, a device not end
        raise BadLogError(path, "not a regular file")
    with open(path, "rb") as f:
        gzipped = f.read(2) == _GZIP_MAGIC
        f.seek(0)
        if gzipped:
            try:
                with gzip.GzipFile(fileobj=f, mode="rb") as gz:
                    data = _read_capped(gz, cap, path, "decompressed log")
            except (OSError, EOFError, zlib.error) as e:
                raise BadLogError(path, f"corrupt gzip data ({e})") from None
        else:
            data = _read_capped(f, cap, path, "log")
    return decode_log_bytes(data, path)


def _not_mjai_hint(raw: str) -> str:
    head = raw.lstrip()[:200].lower()
    if head.startswith("<"):
        return "looks like XML/HTML (a Tenhou mjlog?), not mjai JSON lines; convert it to mjai first"
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return ""
    return ("the whole file is one JSON document (a Mahjong Soul or Tenhou JSON record?), "
            "not mjai JSON lines; convert it to mjai first")


# Runs of blank lines skipped in one regex step; one character class, so sre keeps no backtracking state.
_BLANK_RUN = re.compile(r"[ \t\r\f\v\n]*\n")
_BLANKS = " \t\r\f\v\n"  # its characters: the regex is only tried on a line that starts with one


def _numbered_lines(raw: str):
    """Yield ``(line number, line)`` of ``raw`` split on ``\n`` only (not U+2028 as ``splitlines``)."""
    pos, no, n = 0, 1, len(raw)
    while pos < n:
        blank = _BLANK_RUN.match(raw, pos) if raw[pos] in _BLANKS else None
        if blank is not None:
            no += raw.count("\n", pos, blank.end())
            pos = blank.end()
            continue
        end = raw.find("\n", pos)
        if end < 0:
            end = n
        yield no, raw[pos:end]
        no += 1
        pos = end + 1


def _scan(items, source: str, raw: str | None, error: type[BadLogError], training: bool):
    """The one pass over a log: ``(events, lines, line numbers)``; ``training`` adds ``parse_log``'s checks."""
    events: list[dict] = []
    lines: list[str | None] = []
    numbers: list[int] = []
    ended = False
    in_kyoku = False
    n_kyoku = 0
    for no, item in items:
        if isinstance(item, str):
            line = item.strip()
            if not line:
                continue
        else:
            line = None
        if len(events) >= MAX_EVENTS:
            raise error(source, f"more than {MAX_EVENTS:,} events (a hanchan has a few thousand): not one game", no)
        if line is None:
            ev = item
        else:
            try:
                # The C scanner behind json.loads, without its per-call Python layers: a stripped line is one
                # JSON value iff the scan ends at its end. Anything else goes to json.loads for its exact error.
                ev, end = _scan_once(line, 0)
            except (StopIteration, ValueError, RecursionError):
                end = -1
            if end != len(line):
                try:
                    ev = json.loads(line)
                except RecursionError:
                    raise error(source, "JSON nested too deeply", no) from None
                except ValueError as e:
                    hint = _not_mjai_hint(raw) if raw is not None and not events else ""
                    raise error(source, hint or f"not a JSON event ({e})", no) from None
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            hint = _not_mjai_hint(raw) if raw is not None and not events else ""
            raise error(source, hint or "not an mjai event (no string field 'type')", no)
        typ = ev["type"]
        if typ not in MJAI_EVENT_TYPES:
            raise error(source, f"unknown event type {typ!r}", no)
        if typ in ACTOR_EVENTS:
            actor = ev.get("actor")
            if not is_seat(actor):
                raise error(source, f"{typ} field 'actor' must be a seat 0-3, got {actor!r}", no)
        if training and typ in _TRAINING_FIELDS:
            _check_training_fields(ev, typ, source, no, error)
        # One game per file: a second one would be scored (and ranked) as part of the first.
        if ended:
            raise error(source, f"{typ} after end_game (one game per file; two logs concatenated?)", no)
        if typ == "start_game":
            if events:
                raise error(source, "start_game in the middle of the log (two logs concatenated?)", no)
        elif typ == "end_game":
            ended = True
            if training and in_kyoku:
                raise error(source, "end_game before the last kyoku's end_kyoku", no)
        elif training and typ == "start_kyoku":
            if in_kyoku:
                raise error(source, "start_kyoku before the previous kyoku's end_kyoku", no)
            in_kyoku, n_kyoku = True, n_kyoku + 1
            if n_kyoku > MAX_KYOKU:
                raise error(source, f"more than {MAX_KYOKU} kyoku in one game", no)
        elif training and typ == "end_kyoku":
            # The loaders number kyoku by end_kyoku and reward them by start_kyoku: the two must pair up.
            if not in_kyoku:
                raise error(source, "end_kyoku without a start_kyoku", no)
            in_kyoku = False
        events.append(ev)
        lines.append(line)
        numbers.append(no)
    return events, lines, numbers


def _check_training_fields(ev: dict, typ: str, source: str, no: int, error: type[BadLogError]) -> None:
    # Only what the loaders rely on; PlayerState.update checks the rest (the GRP reader never runs it, so every
    # field Grp.load_events reads is checked here).
    if typ == "start_game":
        names = ev.get("names")
        if names is not None and (not isinstance(names, list) or len(names) != 4):
            n = len(names) if isinstance(names, list) else "?"
            raise error(source, f"start_game has {n} names; only 4-player logs are supported", no)
    elif typ == "start_kyoku":
        if "tehais" not in ev:
            # Some converters write the starting hands under another name ('haipai'/'haipais', or one 'haipai'
            # event per seat): that is another dialect, not a 3-player log.
            alt = sorted(k for k in ev if "haipai" in k.lower())
            seen = f" (it has {', '.join(repr(k) for k in alt)})" if alt else ""
            raise error(source, f"start_kyoku has no 'tehais'{seen}: a haipai-dialect log? mjai's start_kyoku "
                                f"lists the 4 starting hands in 'tehais'; convert the log to mjai", no)
        for key in ("scores", "tehais"):
            v = ev.get(key)
            if not isinstance(v, list) or len(v) != 4:
                n = len(v) if isinstance(v, list) else "no"
                raise error(source, f"start_kyoku has {n} {key}; only 4-player logs are supported", no)
        for key in ("bakaze", "kyoku", "honba", "kyotaku"):
            if key not in ev:
                raise error(source, f"start_kyoku lacks field {key!r}", no)
        if ev["bakaze"] not in ("E", "S", "W", "N"):
            raise error(source, f"start_kyoku field 'bakaze' must be E, S, W or N, got {ev['bakaze']!r}", no)
        if not is_int(ev["kyoku"]) or not 1 <= ev["kyoku"] <= 4:
            raise error(source, f"start_kyoku field 'kyoku' must be 1-4, got {ev['kyoku']!r}", no)
        for key in ("honba", "kyotaku"):
            if not is_int(ev[key]) or ev[key] < 0:
                raise error(source, f"start_kyoku field {key!r} must be an integer >= 0, got {ev[key]!r}", no)
        if not all(is_points(x) for x in ev["scores"]):
            raise error(source, f"start_kyoku field 'scores' must be 4 integers within ±{MAX_POINTS:,}, got "
                                f"{ev['scores']!r}", no)
    else:  # hora, ryukyoku
        d = ev.get("deltas")
        if not isinstance(d, list) or len(d) != 4 or not all(is_points(x) for x in d):
            raise error(source, f"{typ} lacks field 'deltas' (4 integers within ±{MAX_POINTS:,}), required for GRP "
                                f"final scores", no)


def is_points(x) -> bool:
    """Whether ``x`` is an int score or delta within ``MAX_POINTS``."""
    return is_int(x) and -MAX_POINTS <= x <= MAX_POINTS


def parse_log(raw: str, source: str = "<log>") -> LoadedLog:
    """One complete 4-player game of mjai JSON lines as ``LoadedLog``, every field the loaders read checked."""
    events, lines, numbers = _scan(_numbered_lines(raw), source, raw, BadLogError, True)
    if not events:
        raise BadLogError(source, "empty log (no events)")
    if events[0]["type"] != "start_game":
        raise BadLogError(source, f"first event is {events[0]['type']!r}, expected 'start_game'", numbers[0])
    if events[-1]["type"] != "end_game":
        raise BadLogError(source, f"truncated log: last event is {events[-1]['type']!r}, no 'end_game'",
                          numbers[-1])
    return LoadedLog(events, lines, numbers, str(source))


def parse_events(log, source: str = "<log>", *, error: type[BadLogError] = BadLogError) -> list[tuple[int, dict]]:
    """``[(line, event dict)]`` of one mjai game, complete or not; the first failure raises ``error``."""
    if isinstance(log, bytes):
        log = decode_log_bytes(log, source, error)
    if isinstance(log, str):
        events, _, numbers = _scan(_numbered_lines(log), source, log, error, False)
    else:
        events, _, numbers = _scan(enumerate(log, 1), source, None, error, False)
    return list(zip(numbers, events))


def read_log(path, max_bytes: int | None = DEFAULT_MAX_LOG_BYTES) -> LoadedLog:
    """``read_log_text`` + ``parse_log``; raises ``BadLogError`` / ``OSError``."""
    return parse_log(read_log_text(path, max_bytes), str(path))


def skip_message(path, exc: BaseException) -> str:
    """One-line text for a skipped file: ``"skipped log <path>: line <n>: <reason>"``."""
    if isinstance(exc, BadLogError):
        where = f"line {exc.line}: " if exc.line is not None else ""
        return f"skipped log {path}: {where}{exc.reason}"
    return f"skipped log {path}: {type(exc).__name__}: {exc}"
