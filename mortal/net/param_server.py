"""The TCP front of the server: one request frame and one reply frame per connection, over a ``ReplayStore``.

``ParamServer`` (a threaded ``socketserver`` server) authenticates each frame header before it reads any
payload byte, limits the connections still sending their header (``max_pending``) and the payload bytes read or
handled at once (``ByteBudget``; small frames have a budget of their own), and closes payloads that arrive
slower than ``payload_min_rate``. ``check_bind_security`` refuses a bind beyond loopback without a token. Logs
under the logger name ``mortal.server``.
"""

import logging
import threading
import time
from collections import deque
from socketserver import BaseRequestHandler, ThreadingTCPServer
from typing import Optional

from mortal.net import wire
from mortal.net.address import is_loopback  # bind security below
from mortal.net.replay_store import BadRequest, ReplayStore

logger = logging.getLogger('mortal.server')  # the server's name (log format)

DEFAULT_MAX_PENDING = 64  # connections still sending their header ([online.server] max_pending_connections)
DISCARD_SECONDS = 30.0  # how long a refused peer may go on sending (so it reads its 'unauthorized' reply)
DEFAULT_PAYLOAD_MIN_RATE = 128 * 1024  # bytes/s a payload must average ([online.server] payload_min_bytes_per_s)
PAYLOAD_MIN_SECONDS = 30.0  # every payload gets at least this long, whatever its size
# Payloads up to this size (every request but submit_replay/submit_param) are read within a budget of their own,
# SMALL_INFLIGHT_BYTES over all connections, so a stalled big upload never delays them.
SMALL_FRAME_BYTES = 64 * 1024
SMALL_INFLIGHT_BYTES = 8 * 1024 * 1024


def _log_closing(peer, ex) -> None:
    """One warning for a connection closed on a bad frame (the protocol's reason) or a socket error (its type)."""
    if isinstance(ex, wire.ProtocolError):
        logger.warning('closing connection from %s: %s', peer, ex)
    else:
        logger.warning('closing connection from %s: %s: %s', peer, type(ex).__name__, ex)


class ByteBudget:
    """At most ``limit`` bytes reserved at once over all threads; reservations are served in arrival order."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.used = 0
        self._cond = threading.Condition()
        self._queue = deque()

    def acquire(self, size: int, timeout: float) -> bool:
        """Reserve ``size`` bytes, waiting up to ``timeout`` seconds; False (nothing reserved) on timeout or when
        ``size`` exceeds the limit."""
        if size > self.limit:
            return False
        with self._cond:
            ticket = object()
            self._queue.append(ticket)
            ok = self._cond.wait_for(lambda: self._queue[0] is ticket and self.used + size <= self.limit, timeout)
            self._queue.remove(ticket)
            if ok:
                self.used += size
            self._cond.notify_all()
            return ok

    def release(self, size: int) -> None:
        """Give back ``size`` bytes reserved by ``acquire``."""
        with self._cond:
            self.used -= size
            self._cond.notify_all()


class Handler(BaseRequestHandler):
    """One connection = one request frame and one reply frame.

    The header (78 bytes, within ``header_timeout``) is authenticated before any payload byte is read; the
    payload is read only once its length fits in the server's ``inflight`` budget."""

    def handle(self):
        srv: ParamServer = self.server
        self.in_header_phase = True
        try:
            self._serve(srv, '%s:%s' % self.client_address[:2], self.request)
        finally:
            self._leave_header_phase(srv)

    def _leave_header_phase(self, srv):
        if self.in_header_phase:
            self.in_header_phase = False
            srv.leave_header_phase()

    def _serve(self, srv, peer, sock):
        sock.settimeout(srv.timeout)
        try:
            header = wire.recv_header(sock, srv.max_frame_size,
                                      deadline=time.monotonic() + min(srv.header_timeout, srv.timeout))
        except wire.PeerClosed:
            return
        except wire.FrameTooLarge as ex:
            logger.warning('closing connection from %s: %s', peer, ex)
            if ex.header.authentic(srv.token):  # tell an authentic sender why, or it retries the frame forever
                reason = (f'frame of {ex.header.length} bytes exceeds the server\'s [online.server] max_frame_bytes '
                          f'= {ex.limit}')
                self._reply(sock, peer, {'status': wire.STATUS_BAD_REQUEST, 'reason': reason})
                wire.discard(sock, ex.header.length, deadline=time.monotonic() + min(DISCARD_SECONDS, srv.timeout))
            return
        except (wire.ProtocolError, OSError) as ex:
            _log_closing(peer, ex)
            return
        if not header.authentic(srv.token):
            logger.warning('closing connection from %s: missing or wrong token', peer)
            self._reply(sock, peer, {'status': wire.STATUS_UNAUTHORIZED, 'reason': 'missing or wrong token'})
            # let the peer finish sending so that it reads the reply instead of a reset; nothing is kept
            wire.discard(sock, header.length, deadline=time.monotonic() + min(DISCARD_SECONDS, srv.timeout))
            return
        self._leave_header_phase(srv)
        # Small frames (get_param, drain, ...) have a budget of their own: they never wait behind big uploads.
        budget = srv.small_inflight if header.length <= SMALL_FRAME_BYTES else srv.inflight
        if not budget.acquire(header.length, srv.timeout):
            logger.warning('closing connection from %s: its %d payload bytes did not fit in max_inflight_bytes = %d '
                           'within %.0f s', peer, header.length, budget.limit, srv.timeout)
            return
        try:
            try:
                # the whole payload must arrive at payload_min_bytes_per_s: a trickling sender cannot hold its
                # share of the budget for long
                deadline = time.monotonic() + srv.payload_seconds(header.length)
                msg = wire.recv_payload(sock, header, deadline=deadline)
            except (wire.ProtocolError, OSError) as ex:
                _log_closing(peer, ex)
                return
            reply = self._dispatch(srv, peer, msg)
            del msg  # free the payload before the budget is given back
        finally:
            budget.release(header.length)
        self._reply(sock, peer, reply)

    @staticmethod
    def _dispatch(srv, peer, msg) -> dict:
        try:
            return srv.store.handle(msg)
        except (BadRequest, wire.ProtocolError) as ex:
            logger.warning('bad %r request from %s: %s', msg.get('type'), peer, ex)
            return {'status': wire.STATUS_BAD_REQUEST, 'reason': str(ex)}
        except Exception as ex:  # a bug: answer rather than leave the peer waiting for a reply
            logger.exception('error while handling %r from %s', msg.get('type'), peer)
            return {'status': wire.STATUS_ERROR, 'reason': f'internal server error: {type(ex).__name__}: {ex}'}

    def _reply(self, sock, peer, reply):
        try:
            wire.send_msg(sock, reply, self.server.token)
        except OSError as ex:
            logger.warning('could not reply to %s: %s', peer, ex)


TRAINER_QUIET_SECONDS = 60.0  # no drain for this long with a full buffer: a line saying that the clients wait


class ParamServer(ThreadingTCPServer):
    """Threaded TCP server around a ReplayStore. Bind errors propagate; per-connection errors are logged.

    token: shared secret (None = none, loopback only); max_frame_size: largest payload, bytes; timeout: seconds
    of socket silence; max_pending: connections allowed to be sending their header at once (more are closed at
    once); max_inflight_bytes: payload bytes read or being handled at once over all connections (None or 0 =
    max_frame_size; ValueError when below it); header_timeout: seconds for a whole header to arrive;
    payload_min_rate: bytes/s a payload must average (it is closed after ``payload_seconds(length)``). Payloads
    of at most ``SMALL_FRAME_BYTES`` are read within a separate budget of ``SMALL_INFLIGHT_BYTES``.
    """

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128  # listen backlog: bursts of connecting clients are queued, not dropped

    def __init__(self, address, store: ReplayStore, *, token: Optional[str] = None,
                 max_frame_size: int = wire.DEFAULT_MAX_FRAME_SIZE, timeout: float = wire.DEFAULT_TIMEOUT,
                 max_pending: int = DEFAULT_MAX_PENDING, max_inflight_bytes: Optional[int] = None,
                 header_timeout: float = wire.HEADER_TIMEOUT, payload_min_rate: int = DEFAULT_PAYLOAD_MIN_RATE):
        check_bind_security(address[0], token)
        if payload_min_rate < 1:
            raise ValueError(f'[online.server] payload_min_bytes_per_s = {payload_min_rate} must be at least 1')
        if max_inflight_bytes and max_inflight_bytes < max_frame_size:
            raise ValueError(f'[online.server] max_inflight_bytes = {max_inflight_bytes} must be 0 or at least '
                             f'max_frame_bytes = {max_frame_size} (a largest frame must fit)')
        if max_pending < 1:
            raise ValueError(f'[online.server] max_pending_connections = {max_pending} must be at least 1')
        self.store = store
        self.token = token
        self.max_frame_size = max_frame_size
        self.timeout = timeout
        self.header_timeout = header_timeout
        self.max_pending = int(max_pending)
        self.inflight = ByteBudget(max_inflight_bytes or max_frame_size)
        self.small_inflight = ByteBudget(SMALL_INFLIGHT_BYTES)
        self.payload_min_rate = int(payload_min_rate)
        self.pending = 0  # connections in their header phase (pending_lock)
        self.refused = 0  # connections closed for want of a slot since the last "accepting again" (pending_lock)
        self.pending_lock = threading.Lock()
        self.wait_said = None  # when service_actions last said that clients wait for a drain
        self.clock = time.monotonic
        super().__init__(address, Handler)

    def service_actions(self):
        """Between two polls of ``serve_forever``: while the buffer is full and the trainer has not drained it for
        ``TRAINER_QUIET_SECONDS`` (it is stopped, or its supervisor waits for a valid config), a WARNING at most
        that often saying that the clients wait."""
        now = self.clock()
        quiet = now - self.store.last_drain
        said_lately = self.wait_said is not None and now - self.wait_said < TRAINER_QUIET_SECONDS
        if quiet < TRAINER_QUIET_SECONDS or said_lately:
            return
        buffered = self.store.buffered()
        if buffered < self.store.capacity:
            return
        self.wait_said = now
        logger.warning('no drain for %.0f min and the buffer is full (%d logs, capacity %d): the clients wait until '
                       'the trainer drains it (is it running? its log says why)', quiet / 60, buffered,
                       self.store.capacity)

    def payload_seconds(self, length: int) -> float:
        """Seconds allowed for a whole payload of ``length`` bytes to arrive: ``PAYLOAD_MIN_SECONDS`` plus its
        length at ``payload_min_rate`` bytes/s."""
        return PAYLOAD_MIN_SECONDS + length / self.payload_min_rate

    def process_request(self, request, client_address):
        """Start a handler thread, or close the connection at once when ``max_pending`` connections are still
        sending their header (logged when that starts and when it ends, not per connection)."""
        with self.pending_lock:
            full = self.pending >= self.max_pending
            if full:
                self.refused += 1
                if self.refused == 1:
                    logger.warning('%d connections are still sending their frame header: closing new '
                                   'connections until some finish', self.pending)
            else:
                self.pending += 1
        if full:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.leave_header_phase()
            raise

    def leave_header_phase(self) -> None:
        """A connection left its header phase (authenticated, refused or closed): free its slot."""
        with self.pending_lock:
            self.pending -= 1
            if self.refused and self.pending <= self.max_pending // 2:
                logger.info('accepting new connections again (%d closed meanwhile)', self.refused)
                self.refused = 0

    def handle_error(self, request, client_address):
        logger.exception('unexpected error while serving %s', client_address)


def check_bind_security(host: str, token: Optional[str]) -> None:
    """Refuse (ValueError naming the key) to serve beyond loopback without ``[online.remote] token``."""
    if not token and not is_loopback(host):
        raise ValueError(
            f'[online.remote] host = {host!r} is reachable beyond this machine, so [online.remote] token must be '
            'set (a shared secret that clients and the trainer send with every request)')
