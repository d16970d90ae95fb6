"""The learner's side of the server traffic: publishing parameters and draining played logs."""

import logging
import socket
import time
from os import path

from mortal.data.claims import ClaimLedger, claim_dir_for, is_plain_name, staleness
from mortal.model.checkpoint import describe_error
from mortal.net import wire

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)

DRAIN_POLL_INTERVAL = 5.0  # seconds between empty drains (Mortal)


def play_settings(steps: int, guard: dict) -> dict:
    """What travels with the parameters to the clients at ``steps`` (``temp_factor`` stays 1 for wire peers)."""
    return {'steps': steps, 'epsilon_factor': guard['epsilon_scale'], 'temp_factor': 1.0,
            'baseline_version': guard['baseline_version']}


class ServerTraffic:
    """One learner's traffic with its server (``remote`` None offline); ``drain_dir``: ``[online.server] drain_dir``
    when this machine runs the server, else None; ``ledger``: the ClaimLedger of the claim folder."""

    def __init__(self, remote, *, state_file: str, sleep, writer, dataset_cfg=None, version: int = 0, drain_dir=None):
        self.remote = remote
        self.state_file = state_file
        self.sleep = sleep
        self.writer = writer
        self.dataset_cfg = dataset_cfg
        self.version = version
        self.drain_dir = drain_dir
        self.ledger = None
        self.lost_logs = 0
        self.resubmitted_to = set()
        self.resumed = False
        self.epoch_drained = False

    def learner_id(self) -> str:
        """``<host>:<abs state_file>``: restarts of this learner keep it; the server refuses a second live learner."""
        return f'{socket.gethostname()}:{path.abspath(self.state_file)}'

    def submit(self, mortal, dqn, *, is_idle: bool, settings: dict) -> None:
        """Send the weights of ``mortal`` and ``dqn`` with ``settings``, retrying while the server is unreachable; a
        refusal is logged and ends the learner with SystemExit(2)."""
        msg = {'type': 'submit_param', 'mortal': wire.pack_state_dict(mortal.state_dict()),
               'dqn': wire.pack_state_dict(dqn.state_dict()), 'is_idle': is_idle, 'learner': self.learner_id(),
               **settings}
        try:
            reply = wire.request_with_retry(self.remote, msg, sleep=self.sleep)
        except wire.RequestRefused as ex:
            logger.error('%s', ex)
            raise SystemExit(2) from None
        logger.info('param has been submitted (version %s%s)', reply.get('param_version', -1),
                    ', idle' if is_idle else '')

    def own_drain_dir(self, drain_dir: str) -> str:
        """This config's ``[online.server] drain_dir`` when the server's ``drain_dir`` is that folder: the learner
        makes, empties and links into ``<drain_dir>.trainer`` only for its own config's folder. Otherwise (another
        config, or a hostile server) SystemExit(2) with the reason. Without that key the server's word is taken."""
        if self.drain_dir is None:
            return drain_dir
        if path.realpath(drain_dir) == path.realpath(self.drain_dir):
            return self.drain_dir  # the claim folder resuming uses, however the server spells the path
        logger.error('the server drained to %s, but this config\'s [online.server] drain_dir is %s (%s): the learner '
                     'claims drained logs only in its own folder; run the server and the learner with the same '
                     'folder (an absolute path, or one under {config_dir})', path.realpath(drain_dir),
                     self.drain_dir, path.realpath(self.drain_dir))
        raise SystemExit(2)

    def claims(self, claim_dir: str, steps: int):
        """The ClaimLedger of ``claim_dir``, opened on first use (``steps`` settle a commit a kill cut short)."""
        claim_dir = path.abspath(claim_dir)
        if self.ledger is not None and self.ledger.claim_dir == claim_dir:
            return self.ledger
        if self.ledger is not None:
            logger.warning('the server drains to another folder now: claims move from %s to %s; the %d logs left '
                           'in the old one are not trained', self.ledger.claim_dir, claim_dir,
                           len(self.ledger.pending()))
        self.ledger = ClaimLedger.for_dataset(claim_dir, self.dataset_cfg, self.version, steps=steps)
        if self.ledger.lost_samples:  # reported now: this learner may end (test play) before its epoch does
            self.writer.add_scalar('data/samples_dropped', self.ledger.lost_samples, steps)
            self.ledger.lost_samples = 0
        return self.ledger

    def online_files(self, steps: int, resubmit) -> tuple:
        """(files, ['trainee']) of an online epoch: the first finishes the claimed logs a previous learner left,
        later ones drain and train new logs with the leftovers."""
        self.epoch_drained = False
        if not self.resumed:
            self.resumed = True
            if self.drain_dir:
                ledger = self.claims(claim_dir_for(self.drain_dir), steps)
                pending = ledger.pending()
                if pending:
                    logger.info('resuming %d claimed logs not fully trained (%d of them partly) before draining '
                                'again', len(pending), ledger.partly_trained())
                    return pending, ['trainee']
        drained = self.drain(steps, resubmit)
        self.epoch_drained = True
        pending = self.ledger.pending()
        if len(pending) > len(drained):  # so the file list size that follows adds up
            logger.info('with %d claimed logs left from before: %d to train', len(pending) - len(drained),
                        len(pending))
        return pending, ['trainee']

    def drain(self, steps: int, resubmit) -> list:
        """Poll until replays arrive, claim them and return their paths; writes the data-health tags at ``steps``.
        A server without parameters (restarted) gets ``resubmit()`` once per ``server_id``."""
        start = time.monotonic()
        while True:
            reply = wire.request_with_retry(self.remote, {'type': 'drain'}, sleep=self.sleep)
            server_id = reply.get('server_id')
            if not reply.get('has_param', True) and server_id not in self.resubmitted_to:
                logger.info('server holds no parameters (restarted?): resubmitting')
                resubmit()
                self.resubmitted_to.add(server_id)
            count, names, drain_dir = reply.get('count'), reply.get('files'), reply.get('drain_dir')
            if not (isinstance(count, int) and isinstance(names, list) and isinstance(drain_dir, str)):
                logger.warning('malformed drain reply (count %s, files %s, drain_dir %s): asked again',
                               type(count).__name__, type(names).__name__, type(drain_dir).__name__)
            elif count > 0:
                try:
                    ledger = self.claims(claim_dir_for(self.own_drain_dir(drain_dir)), steps)
                    files, vanished = ledger.claim(drain_dir, names)
                except OSError as ex:
                    logger.error('cannot claim the drained logs of %s: %s', drain_dir, describe_error(ex))
                    raise SystemExit(2) from None
                if vanished:
                    self.lost_logs += len(vanished)
                    logger.warning('%d of %d drained logs vanished from %s before the learner could read them '
                                   '(server restarted?): lost, %d in total', len(vanished), count, drain_dir,
                                   self.lost_logs)
                if files:
                    break
            self.sleep(DRAIN_POLL_INTERVAL)
        waited = time.monotonic() - start
        lost = set(vanished)
        sent = reply.get('param_versions')
        versions = [v for name, v in zip(names, sent if isinstance(sent, list) else []) if is_plain_name(name)
                    and name not in lost]  # those of the claimed logs
        behind = staleness({**reply, 'param_versions': versions})
        self.writer.add_scalar('data/logs_per_drain', len(files), steps)
        self.writer.add_scalar('data/wait_seconds', waited, steps)
        if behind:
            self.writer.add_scalar('data/staleness_mean', sum(behind) / len(behind), steps)
            self.writer.add_scalar('data/staleness_max', max(behind), steps)
        logger.info('drained %d logs after %.1f s; staleness %s', len(files), waited,
                    f'mean {sum(behind) / len(behind):.2f}, max {max(behind)}' if behind else 'unknown')
        return files
