"""The TCP front of the server: one request frame and one reply frame per connection, over a ``ReplayStore``.

Each frame header is authenticated before any payload byte is read; unauthenticated connections are bounded
(``max_pending``, ``header_timeout``), payloads take their share of a ``ByteBudget`` as they arrive and must keep
``payload_min_rate``. Limits and their reasons: docs/operations.md. Logs as ``mortal.server``."""

import contextlib
import logging
import socket
import threading
import time
from collections import OrderedDict, deque
from socketserver import BaseRequestHandler, ThreadingTCPServer
from typing import Optional

from mortal.config_schema import DEFAULT_MAX_PENDING, DEFAULT_PAYLOAD_MIN_RATE
from mortal.net import wire
from mortal.net.address import is_loopback  # bind security below
from mortal.net.replay_store import ReplayStore

logger = logging.getLogger('mortal.server')  # the server's name (log format)

# Handler threads at once; beyond it the oldest unauthenticated connection (or else the new one) is closed.
DEFAULT_MAX_CONNECTIONS = 256
PAYLOAD_WINDOW = 2.0  # seconds over which the payload rate is checked: a stall is closed within two
# Small payloads (all but submit_replay/submit_param) have a budget of their own: big uploads never delay them.
SMALL_FRAME_BYTES = 64 * 1024
SMALL_INFLIGHT_BYTES = 8 * 1024 * 1024
# Seconds before a new frame goes first in line and may preempt the slowest frames holding bytes.
PREEMPT_AFTER = 1.0
# Refusals logged one by one per period, then counted: a flood cannot fill the disk with log lines.
REFUSED_LOG_BURST = 10
REFUSED_LOG_PERIOD = 60.0  # seconds


def _closing_reason(ex) -> str:
    """Why a connection is closed: the protocol's reason, or a socket error's type and message."""
    return str(ex) if isinstance(ex, wire.ProtocolError) else f'{type(ex).__name__}: {ex}'


class ByteBudget:
    """At most ``limit`` bytes reserved at once over all threads, by frames that take them as their bytes arrive.

    Frames already holding bytes go before new ones; when every holder waits and the first in line does not fit, the
    one holding least is refused (deadlock). A new frame waiting ``PREEMPT_AFTER`` s closes the slowest readers until
    it fits, so trickling frames cannot keep honest uploads out."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.used = 0
        self.holders = 0  # frames holding bytes
        self.preempted = 0  # frames closed to admit new ones
        self.readers = set()  # Reservations holding bytes (to pick whom to preempt)
        self._cond = threading.Condition()
        # tickets [size, held] of (new frames that preempted one, frames holding bytes, new frames)
        self._queues = (deque(), deque(), deque())

    def acquire(self, size: int, timeout: float, held: int = 0, owner: Optional['Reservation'] = None) -> bool:
        """Reserve ``size`` bytes within ``timeout`` s; False (nothing reserved) on timeout, oversize, deadlock refusal
        or preemption of ``owner``. ``held``: bytes the caller already holds."""
        if size > self.limit:
            return False
        with self._cond:
            ticket = [size, held]
            queue = self._queues[1 if held else 2]
            queue.append(ticket)
            self._cond.notify_all()  # a new waiter may complete a deadlock
            now = time.monotonic()
            end = now + timeout
            next_preempt = now + PREEMPT_AFTER
            granted = False
            while True:
                head = next(q[0] for q in self._queues if q)
                if head is ticket and self.used + size <= self.limit:
                    granted = True
                    break
                now = time.monotonic()
                if end <= now or (held and self._deadlock_victim() is ticket) or (owner and owner.preempted):
                    break
                if not held and owner is not None and now >= next_preempt:
                    # waited long enough: first in line, preempting what it needs when the budget is full
                    next_preempt = now + PREEMPT_AFTER
                    if self.used + size > self.limit:
                        self._preempt_slowest(now, owner, self.used + size - self.limit)
                    if queue is not self._queues[0]:
                        queue.remove(ticket)
                        queue = self._queues[0]
                        queue.append(ticket)
                    continue
                self._cond.wait(min(end, next_preempt) - now if not held and owner is not None else end - now)
            queue.remove(ticket)
            if granted:
                self.used += size
                self.holders += not held
            self._cond.notify_all()
            return granted

    def _preempt_slowest(self, now: float, owner, needed: int) -> None:
        """Preempt the slowest reading frames until they held ``needed`` bytes. _cond held."""
        reading = sorted((r for r in self.readers if r is not owner and not r.preempted and r.held < r.length),
                         key=lambda r: r.rate(now))
        freed = 0
        for victim in reading:
            if freed >= needed:
                break
            freed += victim.held
            self.preempted += 1
            victim.preempt(f'preempted to admit another frame: it held {victim.held} of max_inflight_bytes = '
                           f'{self.limit}, read at {victim.rate(now) / 1024:.0f} KiB/s')
        self._cond.notify_all()

    def _deadlock_victim(self):
        """The ticket to refuse when every holder waits and the first in line does not fit, else None."""
        more = self._queues[1]
        if not more or len(more) < self.holders or self.used + more[0][0] <= self.limit:
            return None
        return min(reversed(more), key=lambda t: t[1])  # the least held; of equals, the newest

    def release(self, size: int, held: int = 0) -> None:
        """Give back ``size`` bytes reserved by ``acquire``; ``held``: what the frame still holds after it."""
        with self._cond:
            self.used -= size
            self.holders -= not held
            self._cond.notify_all()


class Reservation:
    """The bytes of one payload held in a ``ByteBudget``, taken as they arrive (``recv_payload_paced``'s callbacks)."""

    def __init__(self, budget: ByteBudget, wait: float, sock, length: int):
        self.budget = budget
        self.wait = wait
        self.held = 0
        self.sock = sock  # shut down when this frame is preempted
        self.length = length  # the payload's declared bytes
        self.started = time.monotonic()
        self.waited = 0.0  # seconds spent waiting for the budget (not the sender's doing)
        self.preempted = None  # why this frame was preempted (ByteBudget), else None

    def rate(self, now: float) -> float:
        """Bytes/s this frame has read, over the time it was not waiting for the budget."""
        return self.held / max(now - self.started - self.waited, 1e-3)

    def preempt(self, reason: str) -> None:
        """Close this frame's connection so that its bytes go to a new frame."""
        self.preempted = reason
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def take(self, size: int) -> None:
        """Reserve ``size`` more bytes; ProtocolError (naming the limit) when they are refused."""
        started = time.monotonic()
        granted = self.budget.acquire(size, self.wait, held=self.held, owner=self)
        self.waited += time.monotonic() - started
        if not granted:
            raise wire.ProtocolError(self.preempted or (
                f'its payload did not fit in max_inflight_bytes = {self.budget.limit} ({self.held} bytes read, '
                f'{self.budget.holders} frames holding {self.budget.used} bytes)'))
        with self.budget._cond:
            if not self.held:
                self.budget.readers.add(self)
            self.held += size

    def give(self, size: int) -> None:
        """Give back ``size`` of the bytes taken."""
        if size:
            with self.budget._cond:
                self.held -= size
                if not self.held:
                    self.budget.readers.discard(self)
            self.budget.release(size, held=self.held)


class Handler(BaseRequestHandler):
    """One connection = one request frame and one reply frame; the header is authenticated first."""

    def handle(self):
        srv: ParamServer = self.server
        self.unauthenticated = True
        try:
            self._serve(srv, '%s:%s' % self.client_address[:2], self.request)
        finally:
            self._leave_unauthenticated(srv)

    def _leave_unauthenticated(self, srv) -> bool:
        """Leave the unauthenticated set (once); False when the server had closed this connection meanwhile."""
        if not self.unauthenticated:
            return True
        self.unauthenticated = False
        return srv.leave_unauthenticated(self.request)

    def _serve(self, srv, peer, sock):
        sock.settimeout(srv.timeout)
        try:
            header = wire.recv_header(sock, srv.max_frame_size,
                                      deadline=time.monotonic() + min(srv.header_timeout, srv.timeout))
        except wire.PeerClosed:
            return
        except wire.FrameTooLarge as ex:
            if not self._leave_unauthenticated(srv):
                return  # closed to admit a newer connection: nothing to say
            srv.log_refused(peer, str(ex))
            if ex.header.authentic(srv.token):  # tell an authentic sender why, or it retries the frame forever
                reason = (f'frame of {ex.header.length} bytes exceeds the server\'s [online.server] max_frame_bytes '
                          f'= {srv.max_frame_size}')
                self._reply(sock, peer, {'status': wire.STATUS_BAD_REQUEST, 'reason': reason})
            return  # closed at once: the reply stays readable for the peer after the reset
        except (wire.ProtocolError, OSError) as ex:
            if self._leave_unauthenticated(srv):
                srv.log_refused(peer, _closing_reason(ex))
            return
        if not self._leave_unauthenticated(srv):
            return
        if not header.authentic(srv.token):
            srv.log_refused(peer, 'missing or wrong token')
            self._reply(sock, peer, {'status': wire.STATUS_UNAUTHORIZED, 'reason': 'missing or wrong token'})
            return  # closed at once: nothing it sends next is read
        # Small frames (get_param, drain, ...) have a budget of their own: they never wait behind big uploads.
        budget = srv.small_inflight if header.length <= SMALL_FRAME_BYTES else srv.inflight
        held = Reservation(budget, wait=srv.timeout, sock=sock, length=header.length)
        try:
            try:
                msg = wire.recv_payload_paced(sock, header, min_rate=srv.payload_min_rate, window=PAYLOAD_WINDOW,
                                              take=held.take, give=held.give)
            except (wire.ProtocolError, OSError) as ex:
                logger.warning('closing connection from %s: %s', peer, held.preempted or _closing_reason(ex))
                return
            reply = self._dispatch(srv, peer, msg)
            del msg  # free the payload before the budget is given back
        finally:
            held.give(held.held)
        self._reply(sock, peer, reply)

    @staticmethod
    def _dispatch(srv, peer, msg) -> dict:
        try:
            return srv.store.handle(msg)
        except (wire.BadRequest, wire.ProtocolError) as ex:
            logger.warning('bad %r request from %s: %s', msg.get('type'), peer, ex)
            return {'status': wire.STATUS_BAD_REQUEST, 'reason': str(ex)}
        except Exception as ex:  # a bug: answer rather than leave the peer waiting for a reply
            logger.exception('error while handling %r from %s', msg.get('type'), peer)
            return {'status': wire.STATUS_ERROR, 'reason': f'internal server error: {type(ex).__name__}: {ex}'}

    def _reply(self, sock, peer, reply):
        # No copy of the served parameters: a peer that does not read holds only its thread, for two windows.
        srv = self.server
        try:
            wire.send_paced(sock, wire.encode_pieces(reply, srv.token), min_rate=srv.payload_min_rate,
                            window=PAYLOAD_WINDOW)
        except (OSError, wire.ProtocolError) as ex:
            logger.warning('could not reply to %s: %s', peer, _closing_reason(ex))


TRAINER_QUIET_SECONDS = 60.0  # no drain for this long with a full buffer: a line saying that the clients wait


class ParamServer(ThreadingTCPServer):
    """Threaded TCP server around a ReplayStore. Bind errors propagate; per-connection errors are logged.

    token: shared secret (None: loopback only); max_frame_size: bytes; timeout: s of socket silence;
    max_pending: unauthenticated connections at once; max_inflight_bytes: payload bytes held at once (None or 0 =
    max_frame_size; the config check keeps it above); header_timeout: s; payload_min_rate: bytes/s over every
    ``PAYLOAD_WINDOW``; max_connections: threads at once."""

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128  # listen backlog: bursts of connecting clients are queued, not dropped

    def __init__(self, address, store: ReplayStore, *, token: Optional[str] = None,
                 max_frame_size: int = wire.DEFAULT_MAX_FRAME_BYTES, timeout: float = wire.DEFAULT_TIMEOUT,
                 max_pending: int = DEFAULT_MAX_PENDING, max_inflight_bytes: Optional[int] = None,
                 header_timeout: float = wire.HEADER_TIMEOUT, payload_min_rate: int = DEFAULT_PAYLOAD_MIN_RATE,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS):
        check_bind_security(address[0], token)
        if max_connections < max_pending:
            raise ValueError(f'max_connections = {max_connections} must be at least [online.server] '
                             f'max_pending_connections = {max_pending}')
        self.store = store
        self.token = token
        self.max_frame_size = max_frame_size
        self.timeout = timeout
        self.header_timeout = header_timeout
        self.max_pending = int(max_pending)
        self.max_connections = int(max_connections)
        self.serving = 0  # connections with a handler thread (pending_lock)
        self.turned_away = 0  # new connections closed at max_connections since the last "accepting" (pending_lock)
        self.inflight = ByteBudget(max_inflight_bytes or max_frame_size)
        self.small_inflight = ByteBudget(SMALL_INFLIGHT_BYTES)
        self.payload_min_rate = int(payload_min_rate)
        # unauthenticated connections, oldest first (pending_lock); a socket closed to admit a newer one leaves it
        self.unauthenticated = OrderedDict()
        self.evicted = 0  # connections closed to admit newer ones since the last "no longer full" (pending_lock)
        self.pending_lock = threading.Lock()
        self.refused_logged = 0  # refusals logged in this period (log_lock)
        self.refused_quiet = 0  # refusals counted but not logged in this period (log_lock)
        self.refused_last = ''  # the reason of the last quiet one (log_lock)
        self.refused_period_end = 0.0  # time.monotonic() (log_lock)
        self.log_lock = threading.Lock()
        self.wait_said = None  # when service_actions last said that clients wait for a drain
        self.clock = time.monotonic
        super().__init__(address, Handler)

    @property
    def pending(self) -> int:
        """Unauthenticated connections now."""
        return len(self.unauthenticated)

    def service_actions(self):
        """Between polls: log pending refusal counts, and warn (rate-limited) while a full buffer goes undrained."""
        super().service_actions()
        with self.log_lock:
            self._end_refused_period(time.monotonic())
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

    def process_request(self, request, client_address):
        """Start a handler thread, first closing the oldest unauthenticated connection when ``max_pending`` are."""
        with self.pending_lock:
            if self.serving >= self.max_connections and not self.unauthenticated:
                self.turned_away += 1
                if self.turned_away == 1:
                    logger.warning('%d connections are being served, the most at once: closing new ones until some '
                                   'end (each payload and reply must keep payload_min_bytes_per_s)', self.serving)
                self.shutdown_request(request)
                return
            if len(self.unauthenticated) >= self.max_pending or self.serving >= self.max_connections:
                oldest, _ = self.unauthenticated.popitem(last=False)
                self.evicted += 1
                if self.evicted == 1:
                    logger.warning('%d connections are still sending their frame header: closing the oldest to '
                                   'admit new ones', len(self.unauthenticated) + 1)
                # under the lock: its handler cannot have closed it (leave_unauthenticated takes the lock first)
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)  # its handler's recv returns at once
            self.unauthenticated[request] = None
            self.serving += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.leave_unauthenticated(request)
            self._served()
            raise

    def process_request_thread(self, request, client_address):
        """The handler thread of one connection (``ThreadingTCPServer``'s), counted in ``serving``."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._served()

    def _served(self) -> None:
        with self.pending_lock:
            self.serving -= 1
            if self.turned_away and self.serving <= self.max_connections * 3 // 4:
                logger.info('accepting new connections again (%d closed at once meanwhile, %d served now)',
                            self.turned_away, self.serving)
                self.turned_away = 0

    def leave_unauthenticated(self, request) -> bool:
        """Free a connection's pending slot; False when it had been closed to admit a newer one."""
        with self.pending_lock:
            present = request in self.unauthenticated
            self.unauthenticated.pop(request, None)
            if self.evicted and len(self.unauthenticated) <= self.max_pending // 2:
                logger.info('accepting new connections again (%d oldest closed meanwhile)', self.evicted)
                self.evicted = 0
            return present

    def log_refused(self, peer: str, reason: str) -> None:
        """Log a connection closed before authentication, at most ``REFUSED_LOG_BURST`` per period, then a count."""
        with self.log_lock:
            self._end_refused_period(time.monotonic())
            if self.refused_logged < REFUSED_LOG_BURST:
                self.refused_logged += 1
                logger.warning('closing connection from %s: %s', peer, reason)
            else:
                self.refused_quiet += 1
                self.refused_last = reason

    def _end_refused_period(self, now: float) -> None:
        # log_lock held
        if now < self.refused_period_end:
            return
        if self.refused_quiet:
            logger.warning('closed %d more connections before authentication in the last %.0f s (the last: %s)',
                           self.refused_quiet, REFUSED_LOG_PERIOD, self.refused_last)
        self.refused_logged = self.refused_quiet = 0
        self.refused_period_end = now + REFUSED_LOG_PERIOD

    def handle_error(self, request, client_address):
        logger.exception('unexpected error while serving %s', client_address)


def check_bind_security(host: str, token: Optional[str]) -> None:
    """Refuse (ValueError naming the key) to serve beyond loopback without ``[online.remote] token``."""
    if not token and not is_loopback(host):
        raise ValueError(
            f'[online.remote] host = {host!r} is reachable beyond this machine, so [online.remote] token must be '
            'set (a shared secret that clients and the trainer send with every request)')
