"""The GRP (Global Reward Predictor) record of a game, as Mortal's ``libriichi/src/dataset/grp.rs``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from mortal.data.mjai_log import BadLogError, parse_log, read_log, skip_message

logger = logging.getLogger('mortal.grp')  # the name before the package split (log format)

GRP_SIZE = 7  # as Mortal's consts.rs


def grand_kyoku(bakaze: str, kyoku: int) -> int:
    """E1=0 ... E4=3, S1=4 ... S4=7, any other wind 8+ (W1=8 ... W4=11), as ``grp.rs``."""
    if bakaze == "E":
        return kyoku - 1
    if bakaze == "S":
        return 3 + kyoku
    return 7 + kyoku


def rank_by_player(scores) -> list[int]:
    """Rank (0 = top) of each seat, ties to the lower seat: ``[25000, 25000, 30000, 20000]`` -> ``[1, 2, 0, 3]``."""
    order = sorted(range(4), key=lambda p: -scores[p])  # sorted() is stable
    return [order.index(p) for p in range(4)]


@dataclass
class Grp:
    """GRP record of one game: ``feature`` ``(K, 7)`` float64, per ``start_kyoku`` ``[grand_kyoku, honba,
    kyotaku, s0/1e4 .. s3/1e4]``; ``rank_by_player`` ``(4,)`` uint8; ``final_scores`` ``(4,)`` int32."""

    feature: np.ndarray = field(default_factory=lambda: np.zeros((0, GRP_SIZE), np.float64))
    rank_by_player: np.ndarray = field(default_factory=lambda: np.zeros(4, np.uint8))
    final_scores: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int32))

    def __len__(self) -> int:
        return self.feature.shape[0]

    def take_feature(self) -> np.ndarray:  # Mortal's getter names
        return self.feature

    def take_rank_by_player(self) -> np.ndarray:
        return self.rank_by_player

    def take_final_scores(self) -> np.ndarray:
        return self.final_scores

    @staticmethod
    def load_events(events: list[dict], source: str = "<log>") -> "Grp":
        """The record of a log ``parse_log`` accepted (final scores as ``grp.rs``); ``BadLogError`` if incomplete."""
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
                final = [s + d for s, d in zip(final, ev["deltas"])]
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
        return Grp(feature=np.asarray(rows, dtype=np.float64).reshape(-1, GRP_SIZE),
                   rank_by_player=np.asarray(ranks, dtype=np.uint8), final_scores=np.asarray(final, dtype=np.int32))

    @staticmethod
    def load_log(raw: str, source: str = "<log>") -> "Grp":
        """The record of mjai JSON lines (``parse_log``); ``BadLogError``."""
        return Grp.load_events(parse_log(raw, source).events, source)

    @staticmethod
    def load_gz_log_files(paths, skipped: list | None = None) -> list["Grp"]:
        """One ``Grp`` per readable file; a bad one is warned about (and appended to ``skipped``)."""
        out = []
        for path in paths:
            try:
                loaded = read_log(path)
                out.append(Grp.load_events(loaded.events, str(path)))
            except Exception as e:  # noqa: BLE001 - one bad file must not stop the rest (BadLogError, OSError, ...)
                message = skip_message(path, e)
                logger.warning("%s", message)
                if skipped is not None:
                    skipped.append((str(path), message))
        return out
