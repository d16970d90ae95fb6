"""The learner's side of the server traffic: publishing parameters and draining played logs.

``ServerTraffic`` is a part of ``mortal.train.Trainer`` (a mixin, so that ``trainer.submit_param()``,
``trainer.drain()`` and the rest stay the trainer's own methods). ``submit_param`` sends the played weights with the
play settings (the schedules' exploration factors, the baseline version) through ``mortal.net.wire``; ``drain``
polls the server every ``DRAIN_POLL_INTERVAL`` seconds until logs arrive, claims them into the learner's folder
(``mortal.data.claims``) and writes the data-health tags (``data/logs_per_drain``, ``data/wait_seconds``,
``data/staleness_mean``, ``data/staleness_max``). Its lines are logged as ``mortal.train``, the trainer's logger.
"""

import logging
import socket
import time
from os import path

from mortal.data.claims import ClaimLedger, claim_dir_for, staleness
from mortal.learning.schedule import schedule_factor
from mortal.net import wire

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)

DRAIN_POLL_INTERVAL = 5.0  # seconds between empty drains (Mortal)


class ServerTraffic:
    """The trainer's server methods. The host (``mortal.train.Trainer``) provides ``config`` (and ``cfg``, its typed
    sections), ``version``, ``remote`` (a ``wire.Remote``), ``sleep``, ``writer``, ``steps``, ``schedules``, ``guard``,
    ``guards`` (``mortal.learning.guards.Guards``), ``played()`` and the state this class keeps: ``ledger``,
    ``lost_logs``, ``resubmitted_to``, ``resumed``, ``epoch_drained``."""

    def submit_param(self, is_idle: bool = False) -> None:
        """Send the current mortal/dqn weights to the server (retrying while it is unreachable).

        A refusal (e.g. an architecture other than the one the running server accepted first, or another learner
        live on that server) is logged as one error line and ends the learner with SystemExit(2): retrying cannot
        help."""
        mortal, dqn = self.played()
        msg = {
            'type': 'submit_param',
            'mortal': wire.pack_state_dict(mortal.state_dict()),
            'dqn': wire.pack_state_dict(dqn.state_dict()),
            'is_idle': is_idle,
            'learner': self.learner_id(),
            **self.play_settings(),
        }
        try:
            reply = wire.request_with_retry(self.remote, msg, sleep=self.sleep)
        except wire.RequestRefused as ex:
            logger.error('%s', ex)
            raise SystemExit(2) from None
        logger.info('param has been submitted (version %d%s)', reply.get('param_version', -1),
                    ', idle' if is_idle else '')

    def learner_id(self) -> str:
        """This learner's run as the server tells learners apart: ``<host>:<[control] state_file, absolute>``. The
        supervisor's restarts (and a restart after a kill) keep it, so the server takes them as the same learner;
        a second learner, of another state file or machine, is refused while this one is live."""
        return f'{socket.gethostname()}:{path.abspath(self.state_file)}'

    def play_settings(self) -> dict:
        """What travels with the parameters to the clients (``mortal.learning.schedule``, ``mortal.learning.gate``):
        ``steps``, ``epsilon_factor`` ([schedule.epsilon] x the rollbacks' ``[guard] epsilon_factor``), ``temp_factor``
        ([schedule.temp]) and ``baseline_version`` (bumped by each rotation)."""
        return {
            'steps': self.steps,
            'epsilon_factor': schedule_factor(self.schedules['epsilon'], self.steps) * self.guard['epsilon_scale'],
            # never 0: a temperature of 0 cannot sample (the server refuses it)
            'temp_factor': max(schedule_factor(self.schedules['temp'], self.steps), wire.MIN_TEMP_FACTOR),
            'baseline_version': self.guard['baseline_version'],
        }

    def sync_baseline(self, *, rotated: bool = False) -> None:
        """Submit ``[baseline.train] state_file`` to the server for the clients (``mortal.learning.guards.Guards``)."""
        self.guards.sync_baseline(rotated=rotated)

    def claims(self, claim_dir: str):
        """The ``mortal.data.claims.ClaimLedger`` of ``claim_dir``, opened (from its manifest) on first use."""
        claim_dir = path.abspath(claim_dir)
        if self.ledger is not None and self.ledger.claim_dir == claim_dir:
            return self.ledger
        if self.ledger is not None:
            logger.warning('the server drains to another folder now: claims move from %s to %s; the %d logs left '
                           'in the old one are not trained', self.ledger.claim_dir, claim_dir,
                           len(self.ledger.pending()))
        # the checkpoint's step settles a commit a kill cut short (ClaimLedger.open)
        self.ledger = ClaimLedger.for_dataset(claim_dir, self.cfg.dataset, self.version, steps=self.steps)
        if self.ledger.lost_samples:  # reported now: this learner may end (test play) before its epoch does
            self.writer.add_scalar('data/samples_dropped', self.ledger.lost_samples, self.steps)
            self.ledger.lost_samples = 0
        return self.ledger

    def online_files(self) -> tuple:
        """(files, ['trainee']) of an online epoch (``mortal.train.Trainer.file_list``): the first epoch of a
        learner finishes the claimed logs a previous one left (the claim folder is found from ``[online.server]
        drain_dir``) without draining; later epochs drain and train the new logs together with what earlier epochs
        left over. Sets ``epoch_drained`` (and ``resumed``, once)."""
        self.epoch_drained = False
        server = self.cfg.online.server  # the trainer's machine may run no server: then no claim folder of it
        drain_dir = server.drain_dir if server is not None else None
        if not self.resumed:
            self.resumed = True
            if drain_dir:
                ledger = self.claims(claim_dir_for(drain_dir))
                pending = ledger.pending()
                if pending:
                    logger.info('resuming %d claimed logs not yet read (%d of them partly trained) before '
                                'draining again', len(pending), ledger.partly_trained())
                    return pending, ['trainee']
        self.drain()
        self.epoch_drained = True
        return self.ledger.pending(), ['trainee']

    def drain(self) -> list:
        """Wait for replays (polling every 5 s), claim them (``ClaimLedger.claim`` of the ledger ``claims``)
        and return the claimed file paths; logs data-health tags. Logs claimed earlier and not yet fully trained
        stay in the claim folder.

        A poll that finds the server without parameters (it restarted) makes the learner resubmit its current ones
        as idle, once per server instance (``server_id``). Logs that vanished before they were claimed (a server
        restart right after the drain) are counted in ``lost_logs`` and logged once per drain.
        """
        start = time.monotonic()
        while True:
            reply = wire.request_with_retry(self.remote, {'type': 'drain'}, sleep=self.sleep)
            server_id = reply.get('server_id')
            if not reply.get('has_param', True) and server_id not in self.resubmitted_to:
                logger.info('server holds no parameters (restarted?): resubmitting')
                self.sync_baseline()
                self.submit_param(is_idle=True)
                self.resubmitted_to.add(server_id)
            if reply['count'] > 0:
                ledger = self.claims(claim_dir_for(reply['drain_dir']))
                files, vanished = ledger.claim(reply['drain_dir'], reply['files'])
                if vanished:
                    self.lost_logs += len(vanished)
                    logger.warning('%d of %d drained logs vanished from %s before the learner could read them '
                                   '(server restarted?): lost, %d in total', len(vanished), reply['count'],
                                   reply['drain_dir'], self.lost_logs)
                if files:
                    break
            self.sleep(DRAIN_POLL_INTERVAL)
        waited = time.monotonic() - start
        lost = set(vanished)
        versions = [v for name, v in zip(reply['files'], reply.get('param_versions', [])) if name not in lost]
        behind = staleness({**reply, 'param_versions': versions})
        self.writer.add_scalar('data/logs_per_drain', len(files), self.steps)
        self.writer.add_scalar('data/wait_seconds', waited, self.steps)
        if behind:
            self.writer.add_scalar('data/staleness_mean', sum(behind) / len(behind), self.steps)
            self.writer.add_scalar('data/staleness_max', max(behind), self.steps)
        logger.info('drained %d logs after %.1f s; staleness %s', len(files), waited,
                    f'mean {sum(behind) / len(behind):.2f}, max {max(behind)}' if behind else 'unknown')
        return files
