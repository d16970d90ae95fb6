"""One-vs-three arena: many hanchan in lock-step on ``riichienv`` tables (Mortal's ``arena/one_vs_three.rs``)."""

from __future__ import annotations

import functools
import gc
import logging
import os
import random

from mortal.play.agent import make_agent, needs_v4_encoder
from mortal.play.counterfactual import fork
from mortal.play.game import SPLITS, _Game
from mortal.play.lockstep import _LockStep
from mortal.play.log_writer import LogWriter

logger = logging.getLogger('mortal.arena')  # the name before the package split (log format)

GC_THRESHOLD = 10_000  # gc's first threshold while py_vs_py runs (docs/performance.md)
_CF_WARNED = False  # the warning that counterfactual branches cannot be played was logged


class OneVsThree:
    """Mortal's 1v3 duplicate arena (``libriichi/src/arena/one_vs_three.rs``).

    Args:
        disable_progress_bar: no tqdm bar (games finished / total, games/s).
        log_dir: if set, one ``{nonce}_{key}_{a|b|c|d}.json.gz`` mjai log per game (split = challenger seat 0-3),
            written atomically on a background thread; all are on disk when ``py_vs_py`` returns. The directory
            is created, not cleared.
        speculate_passes: decide the step after a call step in the same batch as the call (see ``py_vs_py``). It
            changes which random draws exploring rows get (same distribution).
        counterfactual_rate: probability that a challenger's decision by a logged reaction (not one with a
            kan-select evaluation) forks a branch: a clone of the table where the challenger takes another legal
            action, played to the end of the kyoku (``mortal.play.counterfactual``); its outcome goes into the
            decision's ``meta["counterfactual"]``. 0 = Mortal's games. Needs ``stateless`` agents without version
            4, else nothing is forked (one warning). ``counterfactual``: counts of the last run.
        counterfactual_seed: seeds the per-game draws.
        counterfactual_alternative: 'best' (``counterfactual_action``), 'other_kind' (the same, of another kind)
            or 'contested' (``contested_action``); the rate is that of the decisions that have such an
            alternative. ``counterfactual_kinds``: under 'contested', per kind, ``[forked, scenes]`` of the last run.
        log_compresslevel: the logs' gzip level, 1-9 (9: Mortal's ``Compression::best()``).
    """

    def __init__(self, *, disable_progress_bar: bool = False, log_dir: str | None = None,
                 speculate_passes: bool = False, counterfactual_rate: float = 0.0, counterfactual_seed: int = 0,
                 counterfactual_alternative: str = "best", log_compresslevel: int = 9):
        self.log_compresslevel = log_compresslevel  # gzip's, 1-9: 9 as Mortal; self-play's training logs take 1
        self.counterfactual_alternative = counterfactual_alternative
        self.disable_progress_bar = disable_progress_bar
        self.log_dir = log_dir
        self.speculate_passes = speculate_passes
        self.counterfactual_rate = float(counterfactual_rate)
        self.counterfactual_seed = int(counterfactual_seed)
        self.speculated = [0, 0]  # speculative scenes of the last run: handed to agents, and used
        # branches of the last run: forked, recorded, dropped (call not executed), the scenes their agents decided
        self.counterfactual = {"forked": 0, "recorded": 0, "dropped": 0, "scenes": 0}
        self.counterfactual_kinds: dict = {}
        self.last_games: list = []  # (nonce, key, split, final scores, rank_by_player) of the last run
        # (nonce, key, split, reason) of the last run's games ended as failed (StatePanic), left out of the above
        self.failed_games: list = []

    def _enable_counterfactuals(self, games: list[_Game], agents) -> None:
        """Let the games fork branches when every agent is ``stateless`` and none encodes version 4, else warn
        once per process. Each game draws from its own generator: the draws do not depend on the batching."""
        global _CF_WARNED
        if self.counterfactual_rate <= 0:
            return
        if not all(getattr(a, "stateless", False) and not needs_v4_encoder(a) for a in agents):
            if not _CF_WARNED:
                logger.warning("counterfactual_rate %g: no counterfactual branches, they need stateless agents "
                               "of observation version 1-3 (got %s)", self.counterfactual_rate,
                               ", ".join(type(a).__name__ for a in agents))
                _CF_WARNED = True
            return
        for g in games:
            g.fork = functools.partial(fork, rate=self.counterfactual_rate,
                                       rng=random.Random(f"{self.counterfactual_seed}:{g.nonce}:{g.key}:{g.split}"),
                                       other_kind=self.counterfactual_alternative == "other_kind",
                                       contested=self.counterfactual_alternative == "contested")

    def py_vs_py(self, challenger, champion, seed_start: tuple[int, int], seed_count: int) -> list[int]:
        """Play ``4 * seed_count`` hanchan, all in flight: nonces ``seed_start[0]`` .. ``+ seed_count - 1`` with key
        ``seed_start[1]``, each 4 times with the challenger in seat 0, 1, 2, 3 (splits a-d).

        ``challenger``/``champion``: an engine with ``react_batch`` (``mortal.play.engine.MortalEngine``) or an
        arena agent (``mortal.play.agent.MjaiBotAgent``). The agent with the most pending decisions across all
        games is served next, all of them in one call, so games fall into step. With ``speculate_passes``, a call
        step whose asked seats and all-pass continuation belong to one ``stateless`` agent also hands that agent
        the continuation's scenes, played on a clone of the table; if all pass, the game takes both steps in one
        batch, else those rows are wasted.

        A game in which a seat's ``PlayerState`` panics (``StatePanic``) is ended as failed with a warning: left
        out of the rankings, ``last_games`` and the logs, and listed in ``failed_games``; the others play on.

        Returns ``[n1, n2, n3, n4]``: games in which the challenger finished 1st .. 4th. Raises ArenaError (an
        invalid reaction, a table that stops answering, no progress; naming the game and seat) and ValueError
        (bad ``seed_count``).
        """
        nonce0, key = (int(v) for v in seed_start)
        if seed_count < 1:
            raise ValueError(f"seed_count must be >= 1, got {seed_count}")
        chal = make_agent(challenger)
        champ = make_agent(champion)
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        games = [_Game(4 * n + split, nonce0 + n, key, SPLITS[split], [chal if s == split else champ for s in range(4)])
                 for n in range(seed_count) for split in range(4)]
        self.last_games = []
        self.failed_games = []
        self.speculated = [0, 0]
        self.counterfactual = dict.fromkeys(self.counterfactual, 0)
        self.counterfactual_kinds = {}
        self._enable_counterfactuals(games, (chal, champ))
        # a kyoku's reactions and metas live until it ends: at gc's default (700) they were scanned over and over
        thresholds = gc.get_threshold()
        gc.set_threshold(max(thresholds[0], GC_THRESHOLD), *thresholds[1:])
        try:
            with LogWriter(self.log_compresslevel) as self._logs:  # every log is on disk when py_vs_py returns
                rankings = _LockStep(self, games, chal, champ).run()
        finally:
            gc.set_threshold(*thresholds)
        self.counterfactual["dropped"] = self.counterfactual["forked"] - self.counterfactual["recorded"]
        return rankings

    def _finish(self, g: _Game, rankings: list[int]) -> None:
        for s in range(4):
            g.agents[s].end_game(g.gid, s)
        if g.failed is not None:  # no ranks, no log (its kyoku never ended)
            self.failed_games.append((g.nonce, g.key, g.split, g.failed))
        else:
            rankings[g.ranks[SPLITS.index(g.split)]] += 1
            self.last_games.append((g.nonce, g.key, g.split, g.scores, g.ranks))
            if self.log_dir:
                path = os.path.join(self.log_dir, f"{g.nonce}_{g.key}_{g.split}.json.gz")
                self._logs.submit(path, g.log_text())
        g.lines = []
        g.env = None
