"""Self-play fleet on Ray (``python -m mortal.fleet``): N clients of ``mortal.client`` as Ray actors.

The three-process design stays as it is: every actor is a ``mortal.client.Client`` that talks to the server over
TCP exactly as ``python mortal/client.py`` does (fetch parameters, play a round, submit the logs). Ray only starts,
places and restarts them, and carries their per-round records back to this driver:

- ``[fleet] actors`` actors (``--actors``), on a local Ray instance, or on a running cluster (``[fleet] address``,
  ``--address``). Each reserves ``num_cpus`` CPUs (its torch threads) and ``num_gpus`` of a GPU, so that four
  actors with ``num_gpus = 0.25`` share one card.
- Actor ``i`` plays ``[train_play.<profiles[i % len(profiles)]>]`` (its ``TRAIN_PLAY_PROFILE``) and writes its
  round's logs to ``<that profile's log_dir>/fleet-<i>``: clients on one node never wipe each other's logs.
- A dead actor (killed, out of memory, a crashed node) is restarted by Ray up to ``max_restarts`` times (-1: no
  limit) and plays on; the driver logs ``actor I died ...`` and ``actor I restarted (pid P ...)``. An actor whose
  start fails (a bad config, a missing baseline file) or whose round raises is reported and dropped; the fleet
  exits with status 1 once no actor is left.
- Each fleet round (one round of every live actor) gives one line, ``fleet round R: ...`` with the trainee's rank
  counts, avg rank and avg pt of that round and of the last ``[online] history_window`` fleet rounds, and hanchan/h;
  and one TensorBoard group ``fleet/*`` in ``[fleet] tensorboard_dir``.

The config is read here, once, and handed to every actor: a node of a cluster needs the package installed, not the
file (paths in it are taken relative to the driver's working directory where that exists on the node).
``ray`` is an optional extra: ``pip install 'mortal-online[fleet]'``.
"""

if __package__ in (None, ''):  # run as a script: python mortal/fleet.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import copy
import logging
import os
import socket
import time
from dataclasses import dataclass
from os import path

import numpy as np

from mortal.client import RankHistory
from mortal.stat import rank_summary

logger = logging.getLogger('mortal.fleet' if __name__ == '__main__' else __name__)

INSTALL_HINT = "the fleet needs Ray: pip install 'mortal-online[fleet]' (or: pip install ray)"
# A local instance's object store: the fleet moves only configs and round records through it (a few KB), so Ray's
# default (30% of RAM, in /dev/shm) would only take memory from the clients. Ray's floor is 75 MiB.
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024
RETRY_SECONDS = 1.0  # between two looks at an actor that Ray is restarting


def import_ray():
    """The ``ray`` module; raises SystemExit with :data:`INSTALL_HINT` (one ``error:`` line, status 2) without it."""
    try:
        import ray
    except ImportError:
        from mortal import entry
        raise SystemExit(entry.error(INSTALL_HINT)) from None
    return ray


@dataclass(frozen=True)
class ActorPlan:
    """What actor ``index`` plays: its ``TRAIN_PLAY_PROFILE`` and its own ``log_dir`` (absolute, on its node)."""

    index: int
    profile: str
    log_dir: str


def plan_actors(config: dict, actors: int, profiles: list) -> list:
    """The :class:`ActorPlan` of each of ``actors`` actors: profiles in turn, ``<profile log_dir>/fleet-<i>``.

    Raises ``mortal.config.ConfigError`` naming ``[train_play.<profile>]`` for a profile the config lacks.
    """
    from mortal.config import EnvOverrides, train_play_profile
    plans = []
    for i in range(actors):
        profile = profiles[i % len(profiles)]
        table = train_play_profile(config, EnvOverrides(profile=profile))
        plans.append(ActorPlan(i, profile, path.join(path.abspath(table['log_dir']), f'fleet-{i}')))
    return plans


def actor_config(config: dict, plan: ActorPlan) -> dict:
    """A copy of ``config`` in which ``[train_play.<plan.profile>] log_dir`` is the actor's own folder."""
    out = copy.deepcopy(config)
    out['train_play'][plan.profile]['log_dir'] = plan.log_dir
    return out


def check_devices(config: dict, num_gpus: float) -> list:
    """Problems of running the clients of ``config`` with ``num_gpus`` of a GPU each: a CUDA device for the trainee
    (``[control] device``) or the baseline (``[baseline.train] device``) needs ``num_gpus`` > 0, since Ray hides the
    GPUs from an actor that reserved none. Returns the messages (empty: fine)."""
    problems = []
    for where, device in (('[control] device', config['control']['device']),
                          ('[baseline.train] device', config['baseline']['train']['device'])):
        if str(device).startswith('cuda') and num_gpus <= 0:
            problems.append(f'{where} is {device!r} but [fleet] num_gpus is 0: Ray gives such an actor no GPU; '
                            'reserve a share of one, e.g. num_gpus = 0.25 for four actors per GPU')
    return problems


class SelfPlayActor:
    """One self-play client inside a Ray actor (``ray.remote(SelfPlayActor)``); a plain class, so it is testable
    without Ray.

    config: the actor's config (:func:`actor_config`); profile: its ``TRAIN_PLAY_PROFILE``; cwd: the driver's
    working directory, entered when it exists on this node (the config's relative paths mean the same there);
    num_threads: torch threads (``[fleet] num_cpus``).
    """

    def __init__(self, config: dict, profile: str, cwd: str, num_threads: int = 1):
        import dataclasses
        import torch
        from mortal import entry
        from mortal.client import Client

        entry.drop_rust_backtrace()
        logging.basicConfig(level=logging.INFO, format=entry.LOG_FORMAT, force=True)
        if path.isdir(cwd):
            os.chdir(cwd)
        torch.set_num_threads(max(1, num_threads))
        # the node's own MORTAL_SP_THREADS still applies; the profile and the config come from the driver
        overrides = dataclasses.replace(entry.apply_env(), profile=profile)
        self.client = Client(config, env=overrides)

    def ready(self) -> dict:
        """``{'pid': int, 'node': str}`` of this actor's process, once it is built."""
        return {'pid': os.getpid(), 'node': socket.gethostname()}

    def run_round(self) -> dict:
        """One client round (``Client.run_round``): ``{'rankings': [4 ints], 'seconds': float, 'param_version':
        int}``, the trainee's rank counts, the round's wall time and the parameter version it played."""
        t0 = time.monotonic()
        rankings = self.client.run_round()
        return {'rankings': [int(x) for x in rankings], 'seconds': time.monotonic() - t0,
                'param_version': int(self.client.param_version)}


class FleetRecord:
    """The fleet's per-round record: the rounds of all live actors summed into fleet rounds.

    window: fleet rounds in the moving window (``[online] history_window``); writer: a SummaryWriter-like object
    (``add_scalar``) or None. :meth:`add` takes each actor round as it comes and returns the log line of a finished
    fleet round (``live`` actor rounds) or None.
    """

    def __init__(self, window: int, writer=None, *, clock=time.monotonic):
        self.history = RankHistory(window)
        self.writer = writer
        self.clock = clock
        self.fleet_rounds = 0
        self.restarts = 0
        self.pending = np.zeros(4, dtype=np.int64)
        self.pending_rounds = 0
        self.since = clock()

    def add(self, rankings, live: int):
        """Add one actor round's (4,) rank counts; ``live``: actors alive now. Returns the line of a finished fleet
        round, else None."""
        self.pending += np.asarray(rankings, dtype=np.int64)
        self.pending_rounds += 1
        if self.pending_rounds < max(1, live):
            return None
        return self.flush(live)

    def flush(self, live: int) -> str:
        """Close the fleet round now (also with fewer rounds than ``live``) and return its line."""
        now = self.clock()
        rankings, self.pending = self.pending, np.zeros(4, dtype=np.int64)
        rounds, self.pending_rounds = self.pending_rounds, 0
        seconds, self.since = max(now - self.since, 1e-9), now
        self.fleet_rounds += 1
        total = self.history.add(rankings)
        games = int(rankings.sum())
        per_hour = games / seconds * 3600
        avg_rank, avg_pt = rank_summary(rankings)
        ma_rank, ma_pt = rank_summary(total)
        if self.writer is not None:
            step = self.fleet_rounds
            for tag, value in (('fleet/avg_rank', avg_rank), ('fleet/avg_pt', avg_pt),
                               ('fleet/window_avg_rank', ma_rank), ('fleet/window_avg_pt', ma_pt),
                               ('fleet/hanchan_per_hour', per_hour), ('fleet/actors', live),
                               ('fleet/restarts', self.restarts)):
                self.writer.add_scalar(tag, value, step)
            self.writer.flush()
        return (f'fleet round {self.fleet_rounds}: {rounds} rounds of {live} actors, {games} games in '
                f'{seconds:.1f} s ({per_hour:.0f} hanchan/h); trainee rankings: {rankings.tolist()} '
                f'({avg_rank:.6}, {avg_pt:.6}pt); last {len(self.history)} fleet rounds: {total.tolist()} '
                f'({ma_rank:.6}, {ma_pt:.6}pt); restarts {self.restarts}')


class Fleet:
    """The driver: starts the actors of ``plans`` on Ray and keeps one call in flight per actor.

    ray: the ``ray`` module (initialised); config: the full config; fleet: the typed ``[fleet]`` section;
    plans: from :func:`plan_actors`; record: a :class:`FleetRecord`.
    """

    def __init__(self, ray, config: dict, fleet, plans: list, record: FleetRecord):
        self.ray = ray
        self.record = record
        self.plans = {p.index: p for p in plans}
        remote_cls = ray.remote(SelfPlayActor)
        options = dict(num_cpus=fleet.num_cpus, num_gpus=fleet.num_gpus, max_restarts=fleet.max_restarts,
                       max_task_retries=0)  # a round is not retried by Ray: the driver resubmits it
        threads = max(1, int(fleet.num_cpus))
        cwd = os.getcwd()
        self.actors = {p.index: remote_cls.options(**options).remote(actor_config(config, p), p.profile, cwd, threads)
                       for p in plans}
        self.pids = {}
        self.in_flight = {}  # ObjectRef -> (actor index, 'ready' | 'round')
        for i, actor in self.actors.items():
            self.in_flight[actor.ready.remote()] = (i, 'ready')

    @property
    def live(self) -> int:
        """Actors not dropped."""
        return len(self.actors)

    def drop(self, i: int, why: str) -> None:
        """Stop actor ``i`` for good (no restart) and forget its calls; logged as an error."""
        logger.error('actor %d dropped: %s', i, why)
        self.ray.kill(self.actors.pop(i), no_restart=True)
        for ref, (j, _) in list(self.in_flight.items()):
            if j == i:
                del self.in_flight[ref]

    def rounds_in_flight(self) -> int:
        return sum(kind == 'round' for _, kind in self.in_flight.values())

    def on_ready(self, i: int, info: dict) -> None:
        """Log actor ``i`` as started, or as restarted (counted) when its pid changed."""
        plan = self.plans[i]
        old = self.pids.get(i)
        if old is None:
            logger.info('actor %d ready (pid %d on %s, profile %s, log_dir %s)', i, info['pid'], info['node'],
                        plan.profile, plan.log_dir)
        elif old != info['pid']:
            self.record.restarts += 1
            logger.info('actor %d restarted (pid %d on %s; restart %d of the fleet)', i, info['pid'], info['node'],
                        self.record.restarts)
        self.pids[i] = info['pid']

    def run(self, rounds: int = 0) -> int:
        """Play until ``rounds`` actor rounds are done (0: forever). Returns the exit status: 0, or 1 when every
        actor was dropped."""
        from mortal.net.wire import RequestRefused
        ray = self.ray
        done = 0
        while self.in_flight and (not rounds or done < rounds):
            ready, _ = ray.wait(list(self.in_flight), num_returns=1)
            i, kind = self.in_flight.pop(ready[0])
            actor = self.actors.get(i)
            if actor is None:
                continue
            try:
                value = ray.get(ready[0])
            except ray.exceptions.RayActorError as ex:
                unavailable = isinstance(ex, ray.exceptions.ActorUnavailableError)  # Ray restarts it, or a blip
                if kind == 'round':
                    logger.warning('actor %d died during a round: %s', i, _last_line(ex))
                elif not unavailable:  # dead for good: its start failed, or no restart is left
                    self.drop(i, f'the actor is dead and Ray does not restart it: {_last_line(ex)}')
                    continue
                if unavailable:
                    time.sleep(RETRY_SECONDS)
                self.in_flight[actor.ready.remote()] = (i, 'ready')
                continue
            except ray.exceptions.RayTaskError as ex:  # the round raised
                if isinstance(ex.cause, RequestRefused):  # e.g. a round too big for the server: retrying cannot help
                    self.drop(i, f'its round was refused: {ex.cause}')
                    continue
                logger.error('actor %d: its round failed (%s): restarting it', i, _last_line(ex))
                ray.kill(actor, no_restart=False)  # a fresh client, within max_restarts
                self.in_flight[actor.ready.remote()] = (i, 'ready')
                continue
            if kind == 'ready':
                self.on_ready(i, value)
            else:
                done += 1
                line = self.record.add(value['rankings'], self.live)
                if line:
                    logger.info('%s', line)
            if not rounds or done + self.rounds_in_flight() < rounds:
                self.in_flight[actor.run_round.remote()] = (i, 'round')
        if self.record.pending_rounds:
            logger.info('%s', self.record.flush(self.live))
        if not self.actors:
            logger.error('no actor is left')
            return 1
        return 0


def _last_line(ex: BaseException) -> str:
    text = str(ex).strip()
    return text.splitlines()[-1] if text else type(ex).__name__


def main(argv=None):
    """Entry point: ``python -m mortal.fleet [-c CONFIG] [--actors N] [--address ADDR] [--rounds R]``; exits with
    2 on a bad config or without Ray, 1 when every actor was dropped."""
    from mortal import entry
    from mortal.config import CLIENT_SECTIONS, ConfigError, typed

    parser = entry.parser(__doc__.splitlines()[0])
    parser.add_argument('--actors', type=int, default=None, help='actors to start (default: [fleet] actors)')
    parser.add_argument('--address', default=None,
                        help="Ray cluster to join, e.g. ray-head:6379 or 'auto' (default: [fleet] address; "
                             "empty: a local Ray instance)")
    parser.add_argument('--rounds', type=int, default=0, help='stop after this many actor rounds (0 = never)')
    args = entry.start(parser, argv)
    config = entry.load_config_or_exit(args, CLIENT_SECTIONS)
    fleet = typed(config).fleet
    actors = fleet.actors if args.actors is None else args.actors
    if actors < 1:
        parser.error('--actors must be >= 1')
    try:
        plans = plan_actors(config, actors, fleet.profiles)
    except ConfigError as ex:
        return entry.error(ex)
    problems = check_devices(config, fleet.num_gpus)
    if problems:
        return entry.error('; '.join(problems))
    os.environ.setdefault('RAY_DEDUP_LOGS', '0')  # before the import, which reads it: every actor's lines shown
    ray = import_ray()
    address = fleet.address if args.address is None else args.address
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
    else:
        ray.init(include_dashboard=False, log_to_driver=True, object_store_memory=LOCAL_OBJECT_STORE_BYTES)
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(fleet.tensorboard_dir or path.join(config['control']['tensorboard_dir'], 'fleet'))
    record = FleetRecord(config['online']['history_window'], writer)
    try:
        return Fleet(ray, config, fleet, plans, record).run(args.rounds)
    except KeyboardInterrupt:
        return 0
    finally:
        writer.close()
        ray.shutdown()


if __name__ == '__main__':
    raise SystemExit(main())
