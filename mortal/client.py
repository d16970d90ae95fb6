"""Self-play worker of online training (Mortal's ``mortal/client.py``).

Loop forever: fetch the trainee's parameters (retrying every 3 s while the server refuses or is unreachable), play
one round with ``TrainPlayer``, log the round's rank and pt figures, submit the logs with the parameter version
they were played with. With ``[baseline.train] from_server`` the client also fetches and plays against the
trainer's baseline. Parameters that do not fit this client's networks are not loaded (one warning per version).
Details: docs/operations.md."""

if __package__ in (None, ''):  # run as a script: python mortal/client.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import gc
import logging
import os
import time
from collections import deque
from os import path

import numpy as np
import torch
from filelock import FileLock, Timeout

from mortal.config import ENV_PROFILE, profile_name, profile_table, train_play_profile, typed
from mortal.net import wire
from mortal.model.checkpoint import CheckpointError, check_loadable, first_non_finite, read_baseline
from mortal.stat import rank_summary  # of the display pts, as Mortal's client prints it
from mortal.util import runlock

logger = logging.getLogger('mortal.client' if __name__ == '__main__' else __name__)
# The lock is held for seconds while a client writes the baseline; longer means a stuck holder.
BASELINE_LOCK_SECONDS = 60.0


class RankHistory:
    """Moving window of per-round rank counts (``[online] history_window`` rounds)."""

    def __init__(self, window: int):
        self.rounds = deque(maxlen=window)

    def add(self, rankings) -> np.ndarray:
        """Append one round's (4,) counts; return the (4,) int64 sum over the window."""
        self.rounds.append(np.asarray(rankings, dtype=np.int64))
        return np.sum(self.rounds, axis=0)

    def __len__(self):
        return len(self.rounds)


def format_round(rankings, history: RankHistory, total) -> tuple:
    """The two log lines Mortal's client prints after each round."""
    avg_rank, avg_pt = rank_summary(rankings)
    ma_rank, ma_pt = rank_summary(total)
    return (
        f'trainee rankings: {np.asarray(rankings).tolist()} ({avg_rank:.6}, {avg_pt:.6}pt)',
        f'last {len(history)} sessions: {np.asarray(total).tolist()} ({ma_rank:.6}, {ma_pt:.6}pt)',
    )


WAIT_REASONS = {  # get_param's refusals as a client logs them: what it waits for
    wire.STATUS_EMPTY_PARAM: 'waiting for the trainer (train.py) to submit parameters: the server holds none yet',
    wire.STATUS_BUSY: 'waiting for the trainer (train.py) to submit parameters newer than version {version} '
                      '([online.server] force_sequential)',
    wire.STATUS_OVERFLOW: "waiting for the trainer (train.py) to drain the server's full buffer",
}


def fetch_param(remote: wire.Remote, param_version: int, server_id, *, sleep=time.sleep, on_wait=None,
                warn_minutes: float = 0.0) -> dict:
    """Ask until the server answers 'ok', logging each new refusal reason once; ``on_wait()`` before each wait."""
    last = {'status': None}
    then = (f', a warning after {warn_minutes:g} min without new ones ([online] no_param_warn_minutes)'
            if warn_minutes else '')

    def on_refusal(reply):
        status = reply.get('status')
        if status != last['status']:
            last['status'] = status
            reason = WAIT_REASONS.get(status)
            if reason is None:
                logger.info('waiting for parameters: %s', status)
            else:
                logger.info('%s (%s); asking again every %g s%s', reason.format(version=param_version), status,
                            wire.RETRY_INTERVAL, then)

    msg = {'type': 'get_param', 'param_version': param_version, 'server_id': server_id}
    return wire.request_with_retry(remote, msg, on_refusal=on_refusal, sleep=sleep, on_wait=on_wait)


def fetch_baseline(remote: wire.Remote, *, wait: bool, sleep=time.sleep):
    """The server's get_baseline 'ok' reply; with ``wait`` ask until there is one, else None while it has none."""
    logged = []

    def accept(reply):
        return reply.get('status') == wire.STATUS_OK or (
            not wait and reply.get('status') == wire.STATUS_EMPTY_BASELINE)

    def on_refusal(reply):
        if not logged:
            logger.info("waiting for the trainer's baseline: %s", reply.get('status'))
            logged.append(reply.get('status'))

    reply = wire.request_with_retry(remote, {'type': 'get_baseline'}, accept=accept, on_refusal=on_refusal,
                                    sleep=sleep)
    return reply if reply.get('status') == wire.STATUS_OK else None


def unpack_baseline(reply: dict) -> tuple:
    """``(mortal, dqn, arch, digest)`` of a get_baseline reply, checked (arch bounds, loadable, digest).

    Raises ValueError (CheckpointError for the shapes) or wire.ProtocolError naming what is wrong."""
    from mortal.model.networks import Brain, DQN
    arch = wire.check_baseline_arch(reply.get('arch'))
    digest = wire.check_digest(reply.get('baseline_digest'))
    mortal = wire.unpack_state_dict(reply.get('mortal'))
    dqn = wire.unpack_state_dict(reply.get('dqn'))
    with torch.device('meta'):  # shapes only: an arch at its bounds would need hundreds of GB of real weights
        brain = Brain(version=arch['version'], conv_channels=arch['conv_channels'], num_blocks=arch['num_blocks'])
        head = DQN(version=arch['version'])
    check_loadable(brain, mortal, 'baseline mortal')
    check_loadable(head, dqn, 'baseline dqn')
    if wire.baseline_digest(mortal, dqn) != digest:
        raise ValueError(f'the baseline weights do not match their digest {digest[:12]}')
    return mortal, dqn, arch, digest


def file_digest(state_file: str):
    """``wire.baseline_digest`` of a baseline checkpoint file, or None when it is missing or unusable."""
    try:
        mortal, dqn, _ = read_baseline(state_file)
    except (OSError, CheckpointError):
        return None
    return wire.baseline_digest(mortal, dqn)


class BaselineSync:
    """The play settings a client follows from each parameter reply: the ε/T factors and the trainer's baseline.

    ``version``/``digest``: the baseline last followed; ``bad_digest``: a served one that failed its checks."""

    def __init__(self, remote: wire.Remote, baseline, *, sleep=time.sleep):
        self.remote = remote
        self.sleep = sleep
        self.state_file = baseline.state_file
        self.from_server = baseline.from_server
        self.digest = None  # digest of the baseline played against, once known (from_server)
        self.bad_digest = None
        self.version = None  # the trainer's baseline version last seen (None: none seen yet)
        self.factors = (1.0, 1.0)  # (epsilon_factor, temp_factor) last applied

    def fetch_missing(self) -> None:
        """With ``from_server``, fetch a missing ``state_file``, asking until the server has one."""
        if self.from_server and not path.exists(self.state_file):
            logger.info("%s does not exist: fetching the trainer's baseline from the server", self.state_file)
            while self.install(wait=True) is None:
                self.sleep(wire.RETRY_INTERVAL)

    def apply_play_settings(self, rsp: dict, player) -> None:
        """Follow a get_param reply's play settings on ``player``; a reply without them changes nothing."""
        try:
            settings = wire.check_play_settings(rsp)
        except ValueError as ex:
            logger.warning('ignoring the play settings of parameters version %s: %s', rsp.get('param_version'), ex)
            return
        factors = (settings['epsilon_factor'], settings['temp_factor'])
        if factors != self.factors and hasattr(player, 'set_factors'):
            player.set_factors(*factors)
            self.factors = factors
            epsilon, temp = player.effective_exploration()
            logger.info('exploration from the trainer: boltzmann_epsilon %.4g, boltzmann_temp %.4g', epsilon, temp)
        version = settings['baseline_version']
        digest = rsp.get('baseline_digest')
        if self.from_server and isinstance(digest, str):  # a server holding the trainer's baseline
            if digest != self.digest and digest != self.bad_digest:
                self.follow(digest, version, player)
            self.version = version
            return
        changed = version != self.version if self.version is not None else (
            getattr(player, 'baseline_stale', lambda: False)())  # rotated before our first fetch
        if changed and not self.reload(version, player):
            return
        self.version = version

    def reload(self, version: int, player) -> bool:
        """Load ``state_file`` again into ``player``; False (logged, old opponent kept) when it cannot be loaded."""
        logger.info('the baseline was rotated (version %s -> %d): reloading it', self.version, version)
        try:
            player.reload_baseline()
        except Exception as ex:  # anything the file does wrong: keep playing against the old one
            logger.warning('cannot reload the baseline (%s: %s): playing on against the old one',
                           type(ex).__name__, ex)
            return False
        return True

    def install(self, *, wait: bool = False):
        """Fetch, check and write the trainer's baseline to ``state_file`` (under its ``.lock``); -> digest or None.

        None (logged) when the server has none, it fails its checks, it cannot be written or the lock stays held."""
        from mortal.model.rotation import install_baseline
        try:
            reply = fetch_baseline(self.remote, wait=wait, sleep=self.sleep)
        except wire.RequestRefused as ex:  # e.g. a server of an older release
            if wait:
                raise
            logger.warning("cannot fetch the trainer's baseline: %s", ex)
            return None
        if reply is None:
            return None
        try:
            mortal, dqn, arch, digest = unpack_baseline(reply)
        except (ValueError, RuntimeError, wire.ProtocolError) as ex:  # RuntimeError: torch refused the arch
            if reply.get('baseline_digest') != self.bad_digest:  # once per digest, also while waiting at start
                logger.warning("cannot use the trainer's baseline from the server: %s", ex)
            self.bad_digest = reply.get('baseline_digest')
            return None
        try:
            # clients on one node (a fleet) share the file: one writes it, the others find it done
            with FileLock(self.state_file + '.lock', timeout=BASELINE_LOCK_SECONDS):
                if file_digest(self.state_file) == digest:
                    logger.info("the trainer's baseline (digest %s) is already in %s", digest[:12], self.state_file)
                    return digest
                backup = install_baseline(self.state_file, mortal, dqn, arch)
        except Timeout:
            logger.warning('cannot write the baseline to %s: its lock %s.lock has been held by another process for '
                           '%g s', self.state_file, self.state_file, BASELINE_LOCK_SECONDS)
            return None
        except OSError as ex:
            logger.warning('cannot write the baseline to %s: %s', self.state_file, ex)
            return None
        logger.info("the trainer's baseline (version %s, digest %s) written to %s%s", reply.get('baseline_version'),
                    digest[:12], self.state_file, f' (previous kept as {backup})' if backup else '')
        return digest

    def follow(self, digest: str, version: int, player) -> None:
        """Play against the trainer's baseline ``digest`` from the next round, fetching it when the file differs."""
        local = file_digest(self.state_file)
        reload = self.digest is not None or getattr(player, 'baseline_stale', lambda: False)()
        if local != digest:
            logger.info("the trainer's baseline (version %d, digest %s) is not %s: fetching it", version,
                        digest[:12], self.state_file)
            local = self.install()
            if local is None:
                return
            reload = True
        if reload and not self.reload(version, player):
            return
        self.digest = local


class Client:
    """One self-play worker; ``run_round()`` does one fetch-play-submit cycle.

    ``param_version``/``server_id``: the trainer's parameters held (-1 and None before the first). ``train_player``
    is built from the config when None; ``env`` supplies ``TRAIN_PLAY_PROFILE``; tests replace ``sleep``/``clock``."""

    def __init__(self, config: dict, *, train_player=None, remote=None, env=os.environ, sleep=time.sleep,
                 clock=time.monotonic):
        from mortal.model.networks import Brain, DQN

        cfg = typed(config)  # the typed sections, defaults from mortal/config_schema.py
        version = cfg.control.version
        self.device = torch.device(cfg.control.device)
        self.remote = remote or wire.Remote.from_config(cfg.online.remote, cfg.online.server)
        self.sleep = sleep
        self.clock = clock
        self.baseline = BaselineSync(self.remote, cfg.baseline.train, sleep=sleep)
        if train_player is None:
            self.baseline.fetch_missing()  # before the TrainPlayer, which loads it
        self.mortal = Brain(version=version, conv_channels=cfg.resnet.conv_channels,
                            num_blocks=cfg.resnet.num_blocks).to(self.device).eval()
        self.dqn = DQN(version=version).to(self.device).eval()
        if cfg.online.enable_compile:
            self.mortal.compile()
            self.dqn.compile()
        self.param_version = -1
        self.server_id = None
        self.bad_param = None  # (server_id, param_version) of the last parameters that could not be loaded
        self.warn_minutes = cfg.online.no_param_warn_minutes  # 0 = never
        self.param_since = clock()  # when the parameters last changed (or the client started)
        self.stale_warned = None  # when warn_if_stale last warned
        if train_player is None:
            from mortal.play.player import TrainPlayer
            train_player = TrainPlayer(config, env)
        self.train_player = train_player
        self.history = RankHistory(cfg.online.history_window)
        self.phase = 'idle'  # 'fetch', 'play' or 'upload' while a round runs: what a stop discards
        self.rounds = 0  # rounds submitted
        self.pending_logs = 0  # logs of the round being submitted

    def run_round(self) -> np.ndarray:
        """Fetch parameters, play one round, log the ranks, submit the logs; returns the (4,) rank counts."""
        self.phase = 'fetch'
        self.sync_params()

        self.phase = 'play'
        rankings, file_list = self.train_player.train_play(self.mortal, self.dqn, self.device)
        total = self.history.add(rankings)
        for line in format_round(rankings, self.history, total):
            logger.info('%s', line)

        self.phase, self.pending_logs = 'upload', len(file_list)
        self.upload(file_list)
        self.phase = 'idle'
        self.rounds += 1
        gc.collect()
        if self.device.type == 'cuda':
            torch.cuda.empty_cache()
        return rankings

    def sync_params(self) -> None:
        """Load newer parameters from the server; with none loadable yet, ask again every ``wire.RETRY_INTERVAL`` s."""
        while not self.update_param(fetch_param(self.remote, self.param_version, self.server_id, sleep=self.sleep,
                                                on_wait=self.warn_if_stale, warn_minutes=self.warn_minutes)):
            if self.param_version >= 0:
                break  # play on with the parameters already loaded
            self.warn_if_stale()
            self.sleep(wire.RETRY_INTERVAL)
        self.warn_if_stale()

    def update_param(self, rsp: dict) -> bool:
        """Load a get_param 'ok' reply's parameters; False (one warning per version) when they cannot be loaded."""
        key = (rsp.get('server_id'), rsp.get('param_version'))
        try:
            mortal = wire.unpack_state_dict(rsp['mortal'], self.device)
            dqn = wire.unpack_state_dict(rsp['dqn'], self.device)
            check_loadable(self.mortal, mortal, 'mortal')
            check_loadable(self.dqn, dqn, 'dqn')
            if (bad := first_non_finite({'mortal': mortal, 'dqn': dqn})) is not None:
                raise ValueError(f'{bad} holds NaN or inf')
            if not isinstance(key[1], int) or isinstance(key[1], bool) or key[1] < 0:
                raise ValueError(f'param_version is {key[1]!r}, expected an int >= 0')
        except (wire.ProtocolError, ValueError, KeyError) as ex:
            if key != self.bad_param:
                self.bad_param = key
                keeping = (f'keeping version {self.param_version}' if self.param_version >= 0
                           else 'waiting for loadable ones')
                logger.warning('cannot load parameters version %s from the server (%s): %s', key[1], keeping, ex)
            return False
        self.mortal.load_state_dict(mortal)
        self.dqn.load_state_dict(dqn)
        if key != (self.server_id, self.param_version):
            self.param_since, self.stale_warned = self.clock(), None
        self.server_id, self.param_version = key
        logger.info('param has been updated (version %d)', self.param_version)
        self.baseline.apply_play_settings(rsp, self.train_player)
        return True

    def warn_if_stale(self) -> None:
        """A WARNING, at most once a minute, after ``[online] no_param_warn_minutes`` without new parameters."""
        now = self.clock()
        idle = now - self.param_since
        if not self.warn_minutes or idle < self.warn_minutes * 60.0:
            return
        if self.stale_warned is not None and now - self.stale_warned < 60.0:
            return
        self.stale_warned = now
        held = f'still version {self.param_version}' if self.param_version >= 0 else 'none loaded yet'
        logger.warning('no new parameters for %.0f min (%s): is the trainer running? (its log says why it stopped '
                       'or waits; [online] no_param_warn_minutes sets this warning)', idle / 60, held)

    def stop_summary(self) -> str:
        """What a stop now keeps and discards: the round in progress or not yet submitted; the rounds submitted."""
        if self.phase == 'play':
            games = self.train_player.seed_count * 4
            try:
                of = f'{len(os.listdir(self.train_player.log_dir))} of {games} games'
            except OSError:
                of = f'{games} games'
            what = f'round in progress discarded ({of}, parameters version {self.param_version})'
        elif self.phase == 'upload':
            what = f'round not yet submitted discarded ({self.pending_logs} logs)'
        else:
            what = 'no round in progress'
        return f'{what}; {self.rounds} rounds submitted'

    def upload(self, file_list) -> None:
        """Submit the round's ``{basename: bytes}`` with its param version, retrying until stored."""
        logs = {}
        for filename in file_list:
            with open(filename, 'rb') as f:
                logs[path.basename(filename)] = f.read()
        msg = {'type': 'submit_replay', 'logs': logs, 'param_version': self.param_version, 'server_id': self.server_id}
        wire.request_with_retry(self.remote, msg, sleep=self.sleep)
        logger.info('%d logs have been submitted', len(logs))


def hold_log_dir(config: dict, env=os.environ):
    """The lock of this client's ``log_dir`` for its whole run. Raises ``runlock.LockHeld`` naming the holder."""
    profile = profile_name(env)
    key = f'[{profile_table(profile)}] log_dir'
    return runlock.hold(train_play_profile(config, env).log_dir, who='client', key=key,
                        fix=f'set another {key}, or run this client with a profile of its own (a '
                            f'[train_play.<name>] table with another log_dir, chosen by {ENV_PROFILE}=<name>)')


def main(argv=None):
    """Entry point: ``python mortal/client.py`` (``--rounds N`` stops after N rounds)."""
    from mortal import entry
    from mortal.config import CLIENT_SECTIONS
    parser = entry.parser(__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=0, help='stop after this many rounds (0 = never)')
    args = entry.start(parser, argv)
    config = entry.load_config_or_exit(args, CLIENT_SECTIONS)
    entry.check_devices(config, entry.CLIENT_DEVICES)
    entry.log_settings(logger, config, 'client', args.config, args.overrides)
    entry.stop_on_sigterm()
    done = 0
    client = None
    try:
        with hold_log_dir(config, args.overrides):
            client = Client(config, env=args.overrides)
            while not args.rounds or done < args.rounds:
                client.run_round()
                done += 1
        logger.info('stopped after %d rounds (--rounds)', done)
    except (runlock.LockHeld, CheckpointError) as ex:  # CheckpointError: a model file, left as it is
        raise SystemExit(entry.error(ex)) from None
    except KeyboardInterrupt as exc:  # also SIGTERM (entry.stop_on_sigterm)
        logger.info('stopped on %s; %s', entry.stop_cause(exc),
                    client.stop_summary() if client is not None else 'while starting; nothing played')
        raise SystemExit(entry.stop_status(exc)) from None
    except wire.RequestRefused as ex:  # e.g. a round too big for the server's max_frame_bytes: retrying cannot help
        logger.error('%s', ex)
        raise SystemExit(2) from None


if __name__ == '__main__':
    main()
