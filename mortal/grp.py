"""mjai log reading/validation and the GRP (Global Reward Predictor) record of a game.

Behaviour as Mortal's ``libriichi/src/dataset/grp.rs``: one feature row per
``start_kyoku`` ``[grand_kyoku, honba, kyotaku, s0/1e4, s1/1e4, s2/1e4, s3/1e4]``,
final scores, and the final ``rank_by_player``.

The log reader is shared with ``mortal.gameplay``: it turns a file (gzip or
plain JSON lines) into a list of event dicts and rejects anything that is not a
complete 4-player mjai game with a ``BadLogError`` naming the file, the line
and the reason, so that loaders can skip the file and go on.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import re
import zlib
from dataclasses import dataclass, field

import numpy as np

from mortal import config as _config

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_LOG_BYTES",
    "GRP_SIZE",
    "MAX_KYOKU",
    "MJAI_EVENT_TYPES",
    "BadLogError",
    "Grp",
    "LoadedLog",
    "grand_kyoku",
    "parse_log",
    "rank_by_player",
    "skip_message",
    "read_log_text",
    "read_log",
    "MAX_EVENTS",
]

GRP_SIZE = 7  # as Mortal's consts.rs
#: Gameplay numbers kyoku 0-255 in uint8 (as Mortal's ``at_kyoku: u8``); more would wrap and mix up rewards.
MAX_KYOKU = 256

#: Events one log may have: a hanchan has a few thousand, so this only stops files that are not one game before
#: their events (kept in memory, a few hundred bytes each) cost more than the log's bytes.
MAX_EVENTS = 100_000

#: Event types Mortal's mjai ``Event`` knows; anything else is rejected.
MJAI_EVENT_TYPES = frozenset({
    "none", "start_game", "start_kyoku", "tsumo", "dahai", "chi", "pon", "daiminkan", "kakan", "ankan",
    "dora", "reach", "reach_accepted", "hora", "ryukyoku", "end_kyoku", "end_game",
})

_GZIP_MAGIC = b"\x1f\x8b"
#: Default cap on a log's decompressed size (``[dataset] max_log_bytes``, defined with the config schema): a
#: hanchan is well under 1 MB of mjai JSON, so 64 MiB only stops decompression bombs and files that are not one game.
DEFAULT_MAX_LOG_BYTES = _config.DEFAULT_MAX_LOG_BYTES
_READ_CHUNK = 1 << 20
# Events whose 'actor' (a seat) is required.
_ACTOR_EVENTS = frozenset({"tsumo", "dahai", "chi", "pon", "daiminkan", "kakan", "ankan", "reach",
                           "reach_accepted", "hora"})


class BadLogError(ValueError):
    """A log that cannot be used for training.

    Attributes: ``source`` (file name or ``'<log>'``), ``line`` (1-based line
    number or None), ``reason`` (short human text). ``str()`` gives
    ``"<source>: line <n>: <reason>"``.
    """

    def __init__(self, source: str, reason: str, line: int | None = None):
        self.source = str(source)
        self.reason = reason
        self.line = line
        where = f"{self.source}: line {line}: " if line is not None else f"{self.source}: "
        super().__init__(where + reason)


@dataclass
class LoadedLog:
    """A parsed, structurally valid mjai log.

    ``events``: event dicts in order; ``lines``: the JSON text of each event (fed
    as-is to ``PlayerState.update``); ``line_numbers``: 1-based line in the file of
    each event; ``source``: file name for messages.
    """

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


def read_log_text(path, max_bytes: int | None = DEFAULT_MAX_LOG_BYTES) -> str:
    """Read a log file, gunzipping it when it starts with the gzip magic.

    ``max_bytes``: cap on the (decompressed) size in bytes, ``None`` for none. The file is read and
    decompressed incrementally, so memory stays within about the cap however large the file unpacks.

    Raises:
        BadLogError: unreadable gzip stream, text that is not UTF-8, or more than ``max_bytes`` bytes
            (the message names the cap).
        OSError: the file cannot be opened.
    """
    cap = math.inf if max_bytes is None else max_bytes
    with open(path, "rb") as f:
        if f.read(2) == _GZIP_MAGIC:
            f.seek(0)
            try:
                with gzip.GzipFile(fileobj=f, mode="rb") as gz:
                    data = _read_capped(gz, cap, path, "decompressed log")
            except (OSError, EOFError, zlib.error) as e:
                raise BadLogError(path, f"corrupt gzip data ({e})") from None
        else:
            f.seek(0)
            data = _read_capped(f, cap, path, "log")
    try:
        # utf-8-sig: a leading byte order mark is dropped (the server's check_log_head skips it too)
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadLogError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def _not_mjai_hint(raw: str) -> str:
    head = raw.lstrip()[:200].lower()
    if head.startswith("<"):
        return "looks like XML/HTML (a Tenhou mjlog?), not mjai JSON lines; convert it to mjai first"
    try:
        json.loads(raw)
    except ValueError:
        return ""
    return ("the whole file is one JSON document (a Mahjong Soul or Tenhou JSON record?), "
            "not mjai JSON lines; convert it to mjai first")


# A run of lines holding only ASCII blanks, skipped in one regex step (a log padded with millions of blank lines
# would otherwise cost one Python iteration each).
# One character class, not a repeated group: sre keeps no backtracking state per character of a class repeat.
_BLANK_RUN = re.compile(r"[ \t\r\f\v\n]*\n")


def _numbered_lines(raw: str):
    """Yield ``(line number, line)`` of ``raw`` split on ``\n`` only, lazily (no list of all lines is built),
    leaving out runs of blank lines. ``\n`` only, not ``splitlines()``: JSON strings may hold U+2028, U+0085
    etc. literally (a player name written with ensure_ascii=False), which splitlines() would break in two;
    callers strip the ``\r`` of CRLF."""
    pos, no, n = 0, 1, len(raw)
    while pos < n:
        blank = _BLANK_RUN.match(raw, pos)
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


def parse_log(raw: str, source: str = "<log>") -> LoadedLog:
    """Parse mjai JSON lines and check that they form one complete 4-player game.

    Blank lines are ignored. Unknown extra fields in events are kept and ignored.

    Checks (each failure raises ``BadLogError`` naming ``source``, the line and the reason):
    non-empty; every line a JSON object with a known mjai ``type``; first event
    ``start_game`` with 4 ``names`` if given; every ``start_kyoku`` with 4 ``scores``
    and 4 ``tehais`` (a 3-player log fails here), integer ``scores``, ``bakaze`` E/S/W/N,
    ``kyoku`` 1-4, ``honba``/``kyotaku`` >= 0; every ``actor`` a seat 0-3; every
    ``hora``/``ryukyoku`` with 4 integer ``deltas`` (``grp.rs`` requires them); one game
    only (``start_game`` first, nothing after ``end_game``); ``start_kyoku``/``end_kyoku``
    paired (the loaders count kyoku by both), at most ``MAX_KYOKU`` of them; last event
    ``end_game`` (otherwise the log is truncated); at most ``MAX_EVENTS`` events. Lines are split on ``\n`` only
    (CRLF is fine); lines are read one at a time, so memory grows with the events, not with blank lines.
    """
    events: list[dict] = []
    lines: list[str] = []
    numbers: list[int] = []
    in_kyoku = False
    n_kyoku = 0
    for no, line in _numbered_lines(raw):
        line = line.strip()
        if not line:
            continue
        if len(events) >= MAX_EVENTS:
            raise BadLogError(source, f"more than {MAX_EVENTS:,} events (a hanchan has a few thousand): not one "
                                      f"game", no)
        try:
            ev = json.loads(line)
        except RecursionError:
            raise BadLogError(source, "JSON nested too deeply", no) from None
        except ValueError as e:
            hint = _not_mjai_hint(raw) if not events else ""
            raise BadLogError(source, hint or f"not JSON ({e})", no) from None
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            hint = _not_mjai_hint(raw) if not events else ""
            raise BadLogError(source, hint or "not an mjai event (no string field 'type')", no)
        typ = ev["type"]
        if typ not in MJAI_EVENT_TYPES:
            raise BadLogError(source, f"unknown mjai event type {typ!r}", no)
        _check_event(ev, typ, source, no)
        if events and events[-1]["type"] == "end_game":
            raise BadLogError(source, f"{typ} after end_game (one game per file; two logs concatenated?)", no)
        if typ == "start_game" and events:
            raise BadLogError(source, "start_game in the middle of the log (two logs concatenated?)", no)
        if typ == "start_kyoku":
            if in_kyoku:
                raise BadLogError(source, "start_kyoku before the previous kyoku's end_kyoku", no)
            in_kyoku = True
            n_kyoku += 1
            if n_kyoku > MAX_KYOKU:
                raise BadLogError(source, f"more than {MAX_KYOKU} kyoku in one game", no)
        elif typ == "end_kyoku":
            # The loaders number kyoku by end_kyoku and reward them by start_kyoku: the two must pair up.
            if not in_kyoku:
                raise BadLogError(source, "end_kyoku without a start_kyoku", no)
            in_kyoku = False
        elif typ == "end_game" and in_kyoku:
            raise BadLogError(source, "end_game before the last kyoku's end_kyoku", no)
        events.append(ev)
        lines.append(line)
        numbers.append(no)
    if not events:
        raise BadLogError(source, "empty log (no events)")
    if events[0]["type"] != "start_game":
        raise BadLogError(source, f"first event is {events[0]['type']!r}, expected 'start_game'", numbers[0])
    if events[-1]["type"] != "end_game":
        raise BadLogError(source, f"truncated log: last event is {events[-1]['type']!r}, no 'end_game'",
                          numbers[-1])
    return LoadedLog(events, lines, numbers, str(source))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_event(ev: dict, typ: str, source: str, no: int) -> None:
    # Only what the loaders rely on; PlayerState.update checks the rest (the GRP reader never runs it, so every
    # field Grp.load_events reads is checked here).
    if typ in _ACTOR_EVENTS:
        actor = ev.get("actor")
        if not _is_int(actor) or not 0 <= actor <= 3:
            raise BadLogError(source, f"{typ} field 'actor' must be a seat 0-3, got {actor!r}", no)
    if typ == "start_game":
        names = ev.get("names")
        if names is not None and (not isinstance(names, list) or len(names) != 4):
            n = len(names) if isinstance(names, list) else "?"
            raise BadLogError(source, f"start_game has {n} names; only 4-player logs are supported", no)
    elif typ == "start_kyoku":
        if "tehais" not in ev:
            # Some converters write the starting hands under another name ('haipai'/'haipais', or one 'haipai'
            # event per seat): that is another dialect, not a 3-player log.
            alt = sorted(k for k in ev if "haipai" in k.lower())
            seen = f" (it has {', '.join(repr(k) for k in alt)})" if alt else ""
            raise BadLogError(source, f"start_kyoku has no 'tehais'{seen}: a haipai-dialect log? mjai's start_kyoku "
                                      f"lists the 4 starting hands in 'tehais'; convert the log to mjai", no)
        for key in ("scores", "tehais"):
            v = ev.get(key)
            if not isinstance(v, list) or len(v) != 4:
                n = len(v) if isinstance(v, list) else "no"
                raise BadLogError(source, f"start_kyoku has {n} {key}; only 4-player logs are supported", no)
        for key in ("bakaze", "kyoku", "honba", "kyotaku"):
            if key not in ev:
                raise BadLogError(source, f"start_kyoku lacks field {key!r}", no)
        if ev["bakaze"] not in ("E", "S", "W", "N"):
            raise BadLogError(source, f"start_kyoku field 'bakaze' must be E, S, W or N, got {ev['bakaze']!r}", no)
        if not _is_int(ev["kyoku"]) or not 1 <= ev["kyoku"] <= 4:
            raise BadLogError(source, f"start_kyoku field 'kyoku' must be 1-4, got {ev['kyoku']!r}", no)
        for key in ("honba", "kyotaku"):
            if not _is_int(ev[key]) or ev[key] < 0:
                raise BadLogError(source, f"start_kyoku field {key!r} must be an integer >= 0, got {ev[key]!r}", no)
        if not all(_is_int(x) for x in ev["scores"]):
            raise BadLogError(source, f"start_kyoku field 'scores' must be 4 integers, got {ev['scores']!r}", no)
    elif typ in ("hora", "ryukyoku"):
        d = ev.get("deltas")
        if not isinstance(d, list) or len(d) != 4 or not all(_is_int(x) for x in d):
            raise BadLogError(source, f"{typ} lacks field 'deltas' (4 integers), required for GRP final scores", no)


def read_log(path, max_bytes: int | None = DEFAULT_MAX_LOG_BYTES) -> LoadedLog:
    """``read_log_text`` (capped at ``max_bytes`` decompressed bytes) + ``parse_log``; raises ``BadLogError`` /
    ``OSError``."""
    return parse_log(read_log_text(path, max_bytes), str(path))


def skip_message(path, exc: BaseException) -> str:
    """One-line text for a skipped file: ``"skipped log <path>: line <n>: <reason>"``."""
    if isinstance(exc, BadLogError):
        where = f"line {exc.line}: " if exc.line is not None else ""
        return f"skipped log {path}: {where}{exc.reason}"
    return f"skipped log {path}: {type(exc).__name__}: {exc}"


def grand_kyoku(bakaze: str, kyoku: int) -> int:
    """E1=0 ... E4=3, S1=4 ... S4=7, any other wind 8+ (W1=8 ... W4=11), as ``grp.rs``."""
    if bakaze == "E":
        return kyoku - 1
    if bakaze == "S":
        return 3 + kyoku
    return 7 + kyoku


def rank_by_player(scores) -> list[int]:
    """Rank (0 = top) of each seat; equal scores go to the lower seat index (``rankings.rs``).

    ``[25000, 25000, 30000, 20000]`` -> ``[1, 2, 0, 3]``.
    """
    order = sorted(range(4), key=lambda p: -scores[p])  # sorted() is stable
    ranks = [0] * 4
    for r, p in enumerate(order):
        ranks[p] = r
    return ranks


@dataclass
class Grp:
    """GRP record of one game.

    ``feature`` ``(K, 7)`` float64, one row per ``start_kyoku`` (renchan and abortive
    rounds included): ``[grand_kyoku, honba, kyotaku, s0/1e4, s1/1e4, s2/1e4, s3/1e4]``
    with scores in absolute seat order as given by ``start_kyoku``;
    ``rank_by_player`` ``(4,)`` uint8 (0 = top, ties to the lower seat);
    ``final_scores`` ``(4,)`` int32 (points, sum 100000 after leftover deposits).
    """

    feature: np.ndarray = field(default_factory=lambda: np.zeros((0, GRP_SIZE), np.float64))
    rank_by_player: np.ndarray = field(default_factory=lambda: np.zeros(4, np.uint8))
    final_scores: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int32))

    def __len__(self) -> int:
        return self.feature.shape[0]

    # Mortal's getter names.
    def take_feature(self) -> np.ndarray:
        """``(K, 7)`` float64 feature rows."""
        return self.feature

    def take_rank_by_player(self) -> np.ndarray:
        """``(4,)`` uint8 final rank of each seat."""
        return self.rank_by_player

    def take_final_scores(self) -> np.ndarray:
        """``(4,)`` int32 final scores in points."""
        return self.final_scores

    @staticmethod
    def load_events(events: list[dict], source: str = "<log>") -> "Grp":
        """Build the record from parsed events (see ``parse_log``).

        Final scores = scores of the last ``start_kyoku`` + every ``deltas`` of
        ``hora``/``ryukyoku`` after it - 1000 per ``reach_accepted`` after it. The
        ranking is taken on those; then, if they sum to less than 100000 (deposits
        nobody won), the difference goes to the top player (``grp.rs``).

        Raises:
            BadLogError: no ``start_kyoku``, or no ``hora``/``ryukyoku`` after the last one,
                or a ``deltas`` field missing.
        """
        rows = []
        final = None
        settled = False
        for ev in events:
            typ = ev["type"]
            if typ == "start_kyoku":
                scores = ev["scores"]
                rows.append((grand_kyoku(ev["bakaze"], ev["kyoku"]), ev["honba"], ev["kyotaku"],
                             *(s / 10000 for s in scores)))
                final = list(scores)
                settled = False
            elif final is None:
                continue
            elif typ in ("hora", "ryukyoku"):
                deltas = ev.get("deltas")
                if deltas is None:
                    raise BadLogError(source, f"{typ} lacks field 'deltas'")
                final = [s + d for s, d in zip(final, deltas)]
                settled = True
            elif typ == "reach_accepted":
                final[ev["actor"]] -= 1000
        if final is None:
            raise BadLogError(source, "no start_kyoku in log")
        if not settled:
            raise BadLogError(source, "no hora or ryukyoku after the last start_kyoku")
        ranks = rank_by_player(final)
        short = 100_000 - sum(final)
        if short > 0:
            final[ranks.index(0)] += short
        return Grp(
            feature=np.asarray(rows, dtype=np.float64).reshape(-1, GRP_SIZE),
            rank_by_player=np.asarray(ranks, dtype=np.uint8),
            final_scores=np.asarray(final, dtype=np.int32),
        )

    @staticmethod
    def load_log(raw: str, source: str = "<log>") -> "Grp":
        """Parse mjai JSON lines (``parse_log``) and build the record. Raises ``BadLogError``."""
        return Grp.load_events(parse_log(raw, source).events, source)

    @staticmethod
    def load_gz_log_files(paths, skipped: list | None = None) -> list["Grp"]:
        """One ``Grp`` per readable file (gzip or plain), in input order.

        A bad file is left out with one warning naming the file and the reason;
        when ``skipped`` is a list, ``(path, reason)`` is appended to it.
        """
        out = []
        for path in paths:
            try:
                loaded = read_log(path)
                out.append(Grp.load_events(loaded.events, str(path)))
            except (Exception, BadLogError) as e:  # noqa: BLE001 - one bad file must not stop the rest
                message = skip_message(path, e)
                logger.warning("%s", message)
                if skipped is not None:
                    skipped.append((str(path), message))
        return out
