"""Self-play fleet on Ray (``python -m mortal.tools.fleet``): N clients of ``mortal.client`` as Ray actors.

Actor ``i`` plays profile ``profiles[i % len(profiles)]`` into ``<log_dir>.fleet-<i>`` (docs/operations.md)."""

if __package__ in (None, ''):  # run as a script: python mortal/tools/fleet.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import copy
import logging
import math
import os
import signal
import socket
import time
from dataclasses import dataclass
from os import path

import numpy as np

from mortal.client import RankHistory
from mortal.stat import rank_summary

logger = logging.getLogger('mortal.tools.fleet' if __name__ == '__main__' else __name__)

INSTALL_HINT = "the fleet needs Ray: pip install 'mortal-online[fleet]' (or: pip install ray)"
# A local Ray's object store holds only configs and round records; its default (30% of RAM) would starve clients.
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024
RETRY_SECONDS = 1.0  # between two looks at an actor that Ray is restarting
NOTICE_SECONDS = 60.0  # an actor not started after this long is reported (Ray queues an actor it cannot place)
CONNECT_SECONDS = 10.0  # to reach a cluster's address before handing it to Ray, which retries for minutes
# A failing actor is restarted for good, its k-th failure in a row held back 0 s, 5 s, 10 s, ... up to 10 min.
BACKOFF_FIRST_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 600.0


def backoff_seconds(failures: int) -> float:
    """Seconds before an actor's next start after its ``failures``-th failed round in a row (>= 1)."""
    if failures <= 1:
        return 0.0
    return min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2.0 ** min(failures - 2, 30))


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


def plan_actors(config: dict, actors: int, profiles: list, config_path: str = 'the config') -> list:
    """One ``ActorPlan`` per actor, profiles in turn; ``ConfigError`` naming a missing ``[train_play.<profile>]``."""
    from itertools import cycle

    from mortal.config import ConfigError, EnvOverrides, profile_table, train_play_profile, typed
    log_dirs = {}
    for profile in dict.fromkeys(profiles):
        try:  # the clients' own lookup, so that a name the fleet accepts is one they find
            log_dirs[profile] = path.abspath(train_play_profile(config, EnvOverrides(profile=profile)).log_dir)
        except ConfigError:
            have = ', '.join(sorted(typed(config).train_play or {})) or 'none'
            raise ConfigError(config_path, [f'[fleet] profiles in {config_path} names {profile!r}, but there is no '
                                            f'[{profile_table(profile)}] (profiles there: {have})']) from None
    return [ActorPlan(i, profile, f'{log_dirs[profile]}.fleet-{i}')
            for i, profile in zip(range(actors), cycle(profiles))]


def actor_config(config: dict, plan: ActorPlan) -> dict:
    """A copy of ``config`` in which ``[train_play.<plan.profile>] log_dir`` is the actor's own folder."""
    from mortal.config import profile_table, put
    out = copy.deepcopy(config)
    put(out, f'{profile_table(plan.profile)}.log_dir', plan.log_dir)
    return out


def check_devices(config: dict, num_gpus: float) -> list:
    """Messages for a CUDA trainee or baseline device with ``num_gpus`` 0 (Ray hides the GPUs then)."""
    from mortal.config import typed
    cfg = typed(config)
    return [f'{where} is {device!r} but [fleet] num_gpus is 0: Ray gives such an actor no GPU; '
            'reserve a share of one, e.g. num_gpus = 0.25 for four actors per GPU'
            for where, device in (('[control] device', cfg.control.device),
                                  ('[baseline.train] device', cfg.baseline.train.device))
            if str(device).startswith('cuda') and num_gpus <= 0]


def check_shares(num_cpus: float, num_gpus: float) -> list:
    """Messages for a ``[fleet] num_cpus``/``num_gpus`` share below Ray's unit, 0.0001."""
    return [f'[fleet] {key} is {value:g}: Ray counts a CPU or GPU in steps of 0.0001, so reserve at least that'
            for key, value in (('num_cpus', num_cpus), ('num_gpus', num_gpus)) if 0 < value < 1e-4]


def capacity(nodes: list, num_cpus: float, num_gpus: float) -> int:
    """How many actors of ``num_cpus`` CPUs and ``num_gpus`` GPUs the Ray ``nodes`` (resource dicts) run at once."""
    total = 0
    for resources in nodes:
        fit = math.floor(resources.get('CPU', 0.0) / num_cpus + 1e-9)
        if num_gpus > 0:
            fit = min(fit, math.floor(resources.get('GPU', 0.0) / num_gpus + 1e-9))
        total += fit
    return total


def resource_problem(nodes: list, num_cpus: float, num_gpus: float, actors: int):
    """The message when fewer than ``actors`` actors fit on ``nodes`` at once (:func:`capacity`), else None."""
    fit = capacity(nodes, num_cpus, num_gpus)
    if fit >= actors:
        return None
    have = ', '.join(f"{r.get('CPU', 0.0):g} CPUs {r.get('GPU', 0.0):g} GPUs" for r in nodes) or 'no node'
    want = f'[fleet] num_cpus = {num_cpus:g}' + (f' and num_gpus = {num_gpus:g}' if num_gpus > 0 else '')
    if fit == 0:
        return f'an actor needs {want}, but no node of the Ray cluster ({have}) has that much: Ray would queue ' \
               'every actor; reserve less'
    return (f'{actors} actors need {want} each, but the Ray cluster ({have}) runs {fit} of them at once: Ray '
            f'would queue the other {actors - fit}; start at most {fit} (--actors, [fleet] actors) or '
            'reserve less')


def ray_address(arg, key: str, env=os.environ) -> str:
    """The cluster to join: ``arg`` (--address), else ``key`` ([fleet] address), else ``$RAY_ADDRESS``; '': local."""
    return (key if arg is None else arg) or env.get('RAY_ADDRESS', '')


def unreachable(address: str):
    """Why nothing answers at ``host:port`` (also ``ray://``), or None (reached, or a form left to Ray)."""
    host, sep, port = address.split('://', 1)[-1].rpartition(':')
    if not sep or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip('[]'), int(port)), timeout=CONNECT_SECONDS).close()  # [::1]:6379 too
    except (OSError, ValueError) as ex:  # ValueError: a port out of range
        return f'nothing answers at {address} ({ex})'
    return None


def _stop(signum, frame):
    raise KeyboardInterrupt  # SIGTERM ends the fleet as Ctrl-C does: the actors and a local Ray are shut down


class SelfPlayActor:
    """One self-play client inside a Ray actor; a client that cannot start leaves ``self.error``."""

    def __init__(self, config: dict, profile: str, cwd: str, num_threads: int = 1):
        import contextlib
        import dataclasses
        import torch
        from mortal import entry
        from mortal.client import Client, hold_log_dir
        from mortal.config import train_play_profile
        entry.drop_rust_backtrace()
        logging.basicConfig(level=logging.INFO, format=entry.LOG_FORMAT, force=True)
        if path.isdir(cwd):
            os.chdir(cwd)
        torch.set_num_threads(max(1, num_threads))
        # the node's own MORTAL_SP_THREADS still applies; the profile and the config come from the driver
        overrides = dataclasses.replace(entry.apply_env(), profile=profile)
        self.client, self.error = None, None
        self.held = contextlib.ExitStack()  # the log_dir's lock, for the actor's life (its process's end frees it)
        try:
            os.makedirs(train_play_profile(config, overrides).log_dir, exist_ok=True)  # here, not in each round
            self.held.enter_context(hold_log_dir(config, overrides))  # runlock.LockHeld: another client has it
            self.client = Client(config, env=overrides)
        except Exception as ex:  # whatever stops the start: the driver reports it and drops this actor
            self.held.close()
            self.error = f'{type(ex).__name__}: {ex}'
            logger.error('the client cannot start: %s', self.error)

    def ready(self) -> dict:
        """``{'pid', 'node', 'error'}`` of this actor (``error``: why its client did not start, or None)."""
        return {'pid': os.getpid(), 'node': socket.gethostname(), 'error': self.error}

    def run_round(self) -> dict:
        """One client round (``Client.run_round``): ``{'rankings': [4 ints]}``, the trainee's rank counts."""
        return {'rankings': [int(x) for x in self.client.run_round()]}


class FleetRecord:
    """The actors' rounds summed into fleet rounds; ``add`` returns a finished fleet round's log line, else None."""

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
        """Add one actor round's (4,) rank counts; returns the line of a finished fleet round, else None."""
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
            for tag, value in (('fleet/avg_rank', avg_rank), ('fleet/avg_pt', avg_pt),
                               ('fleet/window_avg_rank', ma_rank), ('fleet/window_avg_pt', ma_pt),
                               ('fleet/hanchan_per_hour', per_hour), ('fleet/actors', live),
                               ('fleet/restarts', self.restarts)):
                self.writer.add_scalar(tag, value, self.fleet_rounds)
            self.writer.flush()
        return (f'fleet round {self.fleet_rounds}: {rounds} rounds of {live} actors, {games} games in '
                f'{seconds:.1f} s ({per_hour:.0f} hanchan/h); trainee rankings: {rankings.tolist()} '
                f'({avg_rank:.6}, {avg_pt:.6}pt); last {len(self.history)} fleet rounds: {total.tolist()} '
                f'({ma_rank:.6}, {ma_pt:.6}pt); restarts {self.restarts}')


class Fleet:
    """The driver: starts the actors of ``plans`` on ``ray`` and keeps one call in flight per actor."""

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
        self.failures = {}  # actor index -> rounds failed in a row
        self.held = {}  # actor index -> monotonic time of its next start (backoff_seconds)
        self.in_flight = {}  # ObjectRef -> (actor index, 'ready' | 'round')
        for i, actor in self.actors.items():
            self.in_flight[actor.ready.remote()] = (i, 'ready')

    def drop(self, i: int, why: str) -> None:
        """Stop actor ``i`` for good (no restart) and forget its calls; logged as an error."""
        logger.error('actor %d dropped: %s', i, why)
        self.ray.kill(self.actors.pop(i), no_restart=True)
        self.held.pop(i, None)
        self.in_flight = {ref: call for ref, call in self.in_flight.items() if call[0] != i}

    def notice_waiting(self) -> None:
        """Log the actors still starting and the cluster's free resources (Ray queues silently)."""
        waiting = sorted(i for i, kind in self.in_flight.values() if kind == 'ready')
        if waiting:
            free = self.ray.available_resources()
            logger.warning('actors %s not started yet: Ray has not placed them (free in the cluster: %g CPUs, %g '
                           'GPUs) or their clients are waiting (see their lines)', ', '.join(map(str, waiting)),
                           free.get('CPU', 0.0), free.get('GPU', 0.0))

    def on_ready(self, i: int, info: dict) -> bool:
        """Log actor ``i`` as started or restarted; drop it when its client could not start. Whether it plays."""
        if info.get('error'):
            self.drop(i, f'its client could not start: {info["error"]}')
            return False
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
        return True

    def run(self, rounds: int = 0) -> int:
        """Play until ``rounds`` actor rounds are done (0: forever); 0, or 1 when every actor was dropped."""
        ray = self.ray
        done = 0
        while (self.in_flight or self.held) and (not rounds or done < rounds):
            now = time.monotonic()
            for i in [i for i, due in self.held.items() if due <= now]:
                del self.held[i]
                self.in_flight[self.actors[i].ready.remote()] = (i, 'ready')
            if not self.in_flight:  # every actor is held back
                time.sleep(max(0.0, min(self.held.values()) - now))
                continue
            timeout = min([NOTICE_SECONDS] + [due - now for due in self.held.values()])
            ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=timeout)
            if not ready:
                if timeout >= NOTICE_SECONDS:
                    self.notice_waiting()
                continue
            i, kind = self.in_flight.pop(ready[0])
            actor = self.actors.get(i)
            if actor is None:
                continue
            try:
                value = ray.get(ready[0])
            except ray.exceptions.RayActorError as ex:
                self._actor_error(i, kind, actor, ex)
                continue
            except ray.exceptions.RayTaskError as ex:  # the round raised
                self._round_error(i, actor, ex)
                continue
            if kind == 'ready':
                if not self.on_ready(i, value):
                    continue
            else:
                done += 1
                self.failures.pop(i, None)
                line = self.record.add(value['rankings'], len(self.actors))
                if line:
                    logger.info('%s', line)
            if not rounds or done + sum(k == 'round' for _, k in self.in_flight.values()) < rounds:
                self.in_flight[actor.run_round.remote()] = (i, 'round')
        if self.record.pending_rounds:
            logger.info('%s', self.record.flush(len(self.actors)))
        if not self.actors:
            logger.error('no actor is left')
            return 1
        return 0

    def _actor_error(self, i: int, kind: str, actor, ex) -> None:
        """Actor ``i`` died during ``kind`` ('ready' or 'round'): ask it to be ready again, or drop it."""
        unavailable = isinstance(ex, self.ray.exceptions.ActorUnavailableError)  # Ray restarts it, or a blip
        if kind == 'round':
            logger.warning('actor %d died during a round: %s', i, _last_line(ex))
        elif not unavailable:  # dead for good: its start failed, or no restart is left
            self.drop(i, f'the actor is dead and Ray does not restart it: {_last_line(ex)}')
            return
        if unavailable:
            time.sleep(RETRY_SECONDS)
        self.in_flight[actor.ready.remote()] = (i, 'ready')

    def _round_error(self, i: int, actor, ex) -> None:
        """Actor ``i``'s round raised: drop it if the server refused it, else restart it after a back-off."""
        from mortal.net.wire import RequestRefused
        if isinstance(ex.cause, RequestRefused):  # e.g. a round too big for the server: retrying cannot help
            self.drop(i, f'its round was refused: {ex.cause}')
            return
        failures = self.failures[i] = self.failures.get(i, 0) + 1
        wait = backoff_seconds(failures)
        held = f'; next start in {wait:g} s ({failures} failed rounds in a row)' if wait else ''
        logger.error('actor %d: its round failed (%s): restarting it%s', i, _last_line(ex), held)
        self.ray.kill(actor, no_restart=False)  # a fresh client, within max_restarts
        self.held[i] = time.monotonic() + wait


def _last_line(ex: BaseException) -> str:
    text = str(ex).strip()
    return text.splitlines()[-1] if text else type(ex).__name__


def _start_ray(ray, address: str, where: str, fleet, actors: int):
    """Join ``address`` or start a local Ray and check it runs ``actors`` actors; an error message or None."""
    # 'local': a new instance even where `ray start` left one to join (ray.init() would join it)
    local = {} if address else {'object_store_memory': LOCAL_OBJECT_STORE_BYTES}
    try:
        ray.init(address=address or 'local', include_dashboard=False, log_to_driver=True, **local)
    except (ValueError, ConnectionError, RuntimeError) as ex:  # a bad address, no cluster there, a failed start
        what = f'join the Ray cluster at {address} ({where})' if address else 'start a local Ray instance'
        return f'cannot {what}: {_last_line(ex)}'
    signal.signal(signal.SIGTERM, _stop)  # again: ray.init put in its own, which aborts the driver (status -6)
    problem = resource_problem([n['Resources'] for n in ray.nodes() if n.get('Alive')], fleet.num_cpus,
                               fleet.num_gpus, actors)
    if problem and not address:  # a local instance never grows
        return problem
    if problem:
        logger.warning('%s (or the cluster grows: Ray starts them then)', problem)
    return None


def main(argv=None):
    """``python -m mortal.tools.fleet [-c CONFIG] [--actors N] [--address ADDR] [--rounds R]``; 2, 1 or 0."""
    from mortal import entry
    from mortal.config import CLIENT_SECTIONS, ConfigError, resolve_path, typed
    parser = entry.parser(__doc__.splitlines()[0])
    parser.add_argument('--actors', type=int, default=None, help='actors to start (default: [fleet] actors)')
    parser.add_argument('--address', default=None,
                        help="Ray cluster to join, e.g. ray-head:6379 or 'auto' (default: [fleet] address, else "
                             "$RAY_ADDRESS; empty: a local Ray instance)")
    parser.add_argument('--rounds', type=int, default=0, help='stop after this many actor rounds (0 = never)')
    args = entry.start(parser, argv)
    config = entry.load_config_or_exit(args, CLIENT_SECTIONS)
    entry.check_devices(config, entry.CLIENT_DEVICES)
    config_path = resolve_path(args.config, args.overrides)
    cfg = typed(config)
    fleet = cfg.fleet
    actors = fleet.actors if args.actors is None else args.actors
    if actors < 1:
        parser.error('--actors must be >= 1')
    if args.rounds < 0:
        parser.error('--rounds must be >= 0')
    try:
        plans = plan_actors(config, actors, fleet.profiles, config_path)
    except ConfigError as ex:
        return entry.error(ex)
    if problems := check_shares(fleet.num_cpus, fleet.num_gpus) + check_devices(config, fleet.num_gpus):
        return entry.error('; '.join(problems))
    address = ray_address(args.address, fleet.address)
    where = f'--address, [fleet] address in {config_path}, or $RAY_ADDRESS'
    if address and (problem := unreachable(address)):
        return entry.error(f'cannot join the Ray cluster at {address} ({where}): {problem}')
    tb_dir = fleet.tensorboard_dir or path.join(cfg.control.tensorboard_dir, 'fleet')
    from torch.utils.tensorboard import SummaryWriter
    try:
        writer = SummaryWriter(tb_dir)  # before Ray starts: a directory it cannot write stops nothing running
    except OSError as ex:
        return entry.error(f'cannot write the fleet\'s TensorBoard records to {tb_dir} ([fleet] tensorboard_dir or '
                           f'[control] tensorboard_dir in {config_path}): {ex}')
    os.environ.setdefault('RAY_DEDUP_LOGS', '0')  # before the import, which reads it: every actor's lines shown
    ray = import_ray()
    old_handler = signal.signal(signal.SIGTERM, _stop)
    try:
        if problem := _start_ray(ray, address, where, fleet, actors):
            return entry.error(problem)
        record = FleetRecord(cfg.online.history_window, writer)
        return Fleet(ray, config, fleet, plans, record).run(args.rounds)
    except KeyboardInterrupt:
        logger.info('stopping the fleet')
        return 0
    finally:
        writer.close()
        ray.shutdown()
        signal.signal(signal.SIGTERM, old_handler)


if __name__ == '__main__':
    raise SystemExit(main())
