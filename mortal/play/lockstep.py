"""The lock-step loop of ``OneVsThree.py_vs_py``: each agent call takes all of its pending decisions."""

from __future__ import annotations

import logging

from mortal.play.agent import IllegalReaction, Scene
from mortal.play.counterfactual import _Branch
from mortal.play.game import ArenaError, StatePanic, _Game

logger = logging.getLogger('mortal.arena')  # the name before the package split (log format)


class _LockStep:
    """One run of the lock-step loop; a ``StatePanic`` in ``guarded`` fails only that game or branch."""

    def __init__(self, arena: "OneVsThree", games: list[_Game], chal, champ):
        self.arena = arena
        self.games = games
        self.rankings = [0, 0, 0, 0]
        self.flight: dict[int, _Game] = {g.gid: g for g in games}  # gid -> every game in flight, branches included
        self.next_gid = len(games)
        self.agents = {id(chal): chal, id(champ): champ}
        self.pending: dict[int, list[Scene]] = {aid: [] for aid in self.agents}  # agent -> its scenes pending
        for g in games:  # the per-seat lookups a step needs, once per game (a branch shares its parent's)
            g.guard = [bool(getattr(a, "agari_guard", False)) for a in g.agents]
            g.queues = [self.pending[id(a)] for a in g.agents]

    def run(self) -> list[int]:
        """Play every game to its end; returns the rankings (as ``py_vs_py``)."""
        from tqdm import tqdm
        remaining = len(self.games)
        for g in self.games:
            if not self.guarded(g, self.gather, g) and self.settle(g):
                remaining -= 1
        with tqdm(total=len(self.games), unit="game", disable=self.arena.disable_progress_bar or None) as bar:
            bar.update(len(self.games) - remaining)
            while remaining:
                for g in self.serve(remaining):
                    dec, spec, g.decided, g.spec_decided = g.decided, g.spec_decided, {}, {}
                    self.guarded(g, self.advance, g, dec, spec)
                    self.take_up(g)
                    if g.done and self.settle(g):
                        remaining -= 1
                        bar.update(1)
        return self.rankings

    def guarded(self, g: _Game, step, *args) -> bool:
        """``step(*args)`` for game (or branch) ``g``; on a ``StatePanic``, ``fail`` it. Returns False if it failed."""
        try:
            step(*args)
        except StatePanic as e:
            self.fail(g, e)
            return False
        return True

    def fail(self, g: _Game, err: StatePanic) -> None:
        """End ``g`` after ``err``: a game is marked failed, a branch cancelled."""
        g.spec = None
        if isinstance(g, _Branch):
            logger.warning("%s: %s; branch dropped", g.label(), err)
            g.cancel()
            return
        logger.warning("%s (seed %d, %d): %s; game left out of the results", g.label(), g.nonce, g.key, err)
        g.failed = str(err)
        g.done = True
        g.obs = {}

    def serve(self, remaining: int) -> list[_Game]:
        """Hand the agent with the most pending decisions all of them (games then fall into step; alternating
        would average N/2 rows per forward); returns the games now fully decided."""
        pending = self.pending
        aid = max(pending, key=lambda k: len(pending[k]))
        queue = pending[aid]
        scenes = queue[:]  # the games hold the queue itself (``queues``): emptied in place
        queue.clear()
        if not scenes:
            raise ArenaError(f"no progress: {remaining} games running but no decision pending")
        try:
            decisions = self.agents[aid].react(scenes)
        except IllegalReaction as e:
            raise ArenaError(f"{self.flight[e.game].label(e.seat)}: {e}") from e
        ready = []
        flight = self.flight
        for sc, dec in zip(scenes, decisions):
            g = flight[sc.game]
            if sc.speculative:
                g.spec_decided[sc.seat] = dec
                continue
            g.decided[sc.seat] = dec
            g.waiting -= 1
            if not g.waiting:
                ready.append(g)
        return ready

    def gather(self, g: _Game, absorbed: dict | None = None) -> None:
        """Queue the scenes ``g``'s table asks now (and, with ``speculate_passes``, its speculative ones)."""
        scenes = g.scenes(g.guard, absorbed)
        g.waiting = len(scenes)
        queues = g.queues
        for sc in scenes:
            queues[sc.seat].append(sc)
        if isinstance(g, _Branch):
            self.arena.counterfactual["scenes"] += len(scenes)
            if g.kind is not None:
                self.arena.counterfactual_kinds.setdefault(g.kind, [0, 0])[1] += len(scenes)
        if self.arena.speculate_passes:
            spec = g.speculate(g.guard)
            self.arena.speculated[0] += len(spec)
            for sc in spec:
                queues[sc.seat].append(sc)

    def advance(self, g: _Game, dec: dict, spec: dict) -> None:
        """Commit ``g``'s decisions and gather its next scenes (taking a speculated step when it held)."""
        while True:
            g.commit(dec)
            if g.done:
                return
            absorbed = g.absorb()
            if not (spec and all(d.reaction.get("type") == "none" for d in dec.values())
                    and g.adopt(absorbed)):
                g.spec = None
                self.gather(g, absorbed)
                return
            self.arena.speculated[1] += len(spec)
            dec, spec = spec, {}

    def take_up(self, g: _Game) -> None:
        """The branches ``g``'s last commits forked join the loop (those dropped or ended at once are counted)."""
        counts = self.arena.counterfactual
        for b in g.new_branches:
            counts["forked"] += 1
            if b.kind is not None:
                self.arena.counterfactual_kinds.setdefault(b.kind, [0, 0])[0] += 1
            if b.done:
                counts["recorded"] += not b.cancelled
                continue
            b.gid = self.next_gid
            self.next_gid += 1
            self.flight[b.gid] = b
            if not self.guarded(b, self.gather, b):
                # dropped before it had a scene pending; settling it here would also settle its parent, which
                # the caller settles
                del self.flight[b.gid]
        g.new_branches = []

    def settle(self, g: _Game) -> bool:
        """A game or branch has ended; True when a real game is finished (its log waits for its branches)."""
        if isinstance(g, _Branch):
            self.arena.counterfactual["recorded"] += not g.cancelled
            del self.flight[g.gid]
            g = g.parent
        if not (g.done and not g.branches and self.flight.pop(g.gid, None) is not None):
            return False
        self.arena._finish(g, self.rankings)
        return True
