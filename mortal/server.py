"""Parameter store and replay buffer between self-play clients and the trainer (Mortal's ``server.py``).

Behaviour as Mortal's server, with its faults fixed:
- ``get_param`` answers 'samples overflow' while the buffer holds >= ``capacity`` logs, 'empty param' before the
  trainer's first submission, 'trainer is busy' under ``force_sequential`` when the client already has the newest
  idle version, else the parameters.
- ``submit_replay`` stores each log as ``{submission_id}_{name}`` (two submissions never overwrite each other),
  written under a temporary name and renamed, so a crash leaves no half-written log; each log remembers the
  ``param_version`` it was played with, so the trainer can measure staleness. Every log must start with an mjai
  ``start_game`` line (gzip or plain), else the request is a 'bad request' and nothing is stored. A submission
  is stored whole or not at all: a disk failure (e.g. an unwritable ``buffer_dir``) is answered 'error'.
- ``submit_param`` bumps ``param_version`` (and the idle version when ``is_idle``). Its key names, dtypes and
  shapes (read from the safetensors headers; no network is built) must match the first accepted submission of
  this server's lifetime unless the request says ``arch_change: true``; empty state dicts are always refused.
- ``submit_param`` may carry the trainer's play settings (``steps``, ``epsilon_factor``, ``temp_factor``,
  ``baseline_version``: ``mortal.learning.schedule``, ``mortal.learning.gate``); they are checked (finite, in range) and handed to
  every client with the parameters. A trainer that sends none leaves Mortal's (factors 1, version 0).
- ``submit_baseline`` stores the trainer's ``[baseline.train]`` weights (safetensors, key names, dtypes and shapes
  read from the headers), their architecture, version and digest (``wire.baseline_digest``, checked by the client
  that fetches them); every 'ok' ``get_param`` reply then names the digest, and ``get_baseline`` hands the
  weights to a client whose own file lacks or differs from them ('empty baseline' before any submission). Kept
  in memory only: the trainer submits it again at each start and after a server restart.
- ``drain`` moves the whole buffer into a freshly emptied ``drain_dir`` (under ``force_sequential`` only once the
  buffer is full) and answers ``{count, drain_dir, files, param_versions, ...}``. A drain that fails midway
  answers 'error' and keeps the logs it moved in ``drain_dir`` for the next drain: none is lost or duplicated.
- Both dirs are cleared and recreated at start. Counts come only from files this server wrote: stray entries are
  logged and ignored in ``buffer_dir``, logged and removed when ``drain_dir`` is emptied.
- Every request is one connection; a malformed frame closes that connection only (see ``mortal/net/wire.py``).
  The header's MAC is checked before any payload is read; at most ``max_pending`` connections may be waiting
  for their header at once (others are closed at once), and payloads being read or handled hold at most
  ``max_inflight_bytes`` bytes together (a frame waits until its length fits; small frames such as get_param
  have a share of their own); a payload must arrive at ``payload_min_bytes_per_s`` on average or is closed. An
  authentic frame above ``max_frame_bytes`` is answered 'bad request' naming the limit.
- Each server instance has a random ``server_id``; a client or trainer that reconnects after a restart is
  recognised as holding no parameters of this instance (otherwise ``force_sequential`` would deadlock).
"""

if __package__ in (None, ''):  # run as a script: python mortal/server.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import errno
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
import zlib
from collections import OrderedDict, deque
from os import path
from socketserver import BaseRequestHandler, ThreadingTCPServer
from typing import Optional

from mortal.net import wire
from mortal.util.fsutil import empty_dir
from mortal.net.address import is_loopback  # bind security below (also this module's API)

logger = logging.getLogger('mortal.server' if __name__ == '__main__' else __name__)

# Names a client may give a log: one path component, no hidden/temporary names, no separators.
_SAFE_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9._-]{0,199}')
_TMP_PREFIX = '.incoming-'
UNKNOWN_VERSION = -1
_GZIP_MAGIC = b'\x1f\x8b'
_UTF8_BOM = b'\xef\xbb\xbf'
# Decompressed bytes searched for a log's first line: a start_game line is ~200 bytes, so this is ample, and a
# gzip bomb costs at most this much.
FIRST_LINE_LIMIT = 64 * 1024
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


class BadRequest(ValueError):
    """A well-formed frame whose content is not a valid request (wrong field type, unsafe file name, ...)."""


def check_log_head(name: str, content: bytes) -> None:
    """BadRequest (naming the log) unless the first non-blank line of ``content`` (gzip or plain mjai JSON lines)
    is a JSON ``start_game`` event. Decompresses at most ``FIRST_LINE_LIMIT`` bytes, leading blank lines and a
    UTF-8 byte order mark (accepted and dropped, as the trainer's reader does) included."""
    if content[:2] == _GZIP_MAGIC:
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(content, FIRST_LINE_LIMIT)
        except zlib.error as ex:
            raise BadRequest(f'log {name!r} is not an mjai log: corrupt gzip data ({ex})') from None
    else:
        head = content[:FIRST_LINE_LIMIT]
    more = len(head) >= FIRST_LINE_LIMIT  # bytes may follow what was looked at
    if head.startswith(_UTF8_BOM):  # mortal.data.mjai_log.read_log_text drops a leading byte order mark too
        head = head[len(_UTF8_BOM):]
    text = head.lstrip()
    skipped = len(head) - len(text)  # leading blank lines, skipped within the same budget
    if not text and more:
        raise BadRequest(f'log {name!r} is not an mjai log: its first {FIRST_LINE_LIMIT} bytes are blank lines '
                         f'(the server looks for the start_game line within that many bytes)')
    end = text.find(b'\n')
    if end < 0 and more:
        after = f' after {skipped} bytes of leading blank lines' if skipped else ''
        raise BadRequest(f'log {name!r} is not an mjai log: its first line{after} does not end within its first '
                         f'{FIRST_LINE_LIMIT} bytes')
    line = text if end < 0 else text[:end]
    try:
        event = json.loads(line)
    except (ValueError, RecursionError) as ex:  # UnicodeDecodeError is a ValueError
        raise BadRequest(f'log {name!r} is not an mjai log: first line is not JSON ({type(ex).__name__})') from None
    kind = event.get('type') if isinstance(event, dict) else None
    if kind != 'start_game':
        raise BadRequest(f'log {name!r} is not an mjai log: first event is {kind!r}, expected \'start_game\'')


def _remove_quietly(p: str) -> None:
    try:
        os.remove(p)
    except OSError:
        pass


def _move(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``; across file systems copy to a temporary name, rename, then remove ``src``.
    On any failure the file is left at ``src`` only (never at both places); the OSError propagates."""
    try:
        os.replace(src, dst)
        return
    except OSError as ex:
        if ex.errno != errno.EXDEV:
            raise
    tmp = path.join(path.dirname(dst), _TMP_PREFIX + path.basename(dst))
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        _remove_quietly(tmp)
        raise
    try:
        os.remove(src)
    except OSError:
        _remove_quietly(dst)
        raise


def _field(msg: dict, key: str, types, *, default=...):
    if key not in msg:
        if default is ...:
            raise BadRequest(f'missing field {key!r}')
        return default
    value = msg[key]
    # bool is an int subclass: never accept it where an int is meant
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f'field {key!r} is a bool, expected {types}')
    if not isinstance(value, types):
        raise BadRequest(f'field {key!r} is a {type(value).__name__}, expected {types}')
    return value


def play_settings_of(msg: dict) -> dict:
    """``wire.check_play_settings`` of a submit_param request; BadRequest instead of its ValueError."""
    try:
        return wire.check_play_settings(msg)
    except ValueError as ex:
        raise BadRequest(str(ex)) from None


class ReplayStore:
    """Thread-safe state of the server: parameters, versions and the on-disk replay buffer.

    buffer_dir/drain_dir: directories this store owns (cleared by ``reset_dirs``); capacity: number of buffered
    logs at which clients are refused new parameters; force_sequential: clients wait for each new idle version and
    the trainer drains only full buffers. Methods take/return the request/reply maps of ``mortal/net/wire.py``.
    """

    def __init__(self, buffer_dir: str, drain_dir: str, capacity: int, force_sequential: bool = False):
        self.buffer_dir = path.abspath(buffer_dir)
        self.drain_dir = path.abspath(drain_dir)
        self.capacity = int(capacity)
        self.force_sequential = bool(force_sequential)
        self.server_id = secrets.token_hex(8)
        self.dir_lock = threading.Lock()
        self.param_lock = threading.Lock()
        # protected by dir_lock: buffered file name -> param_version it was played with (UNKNOWN_VERSION if unknown)
        self.buffer = {}
        self.drained = set()
        # moved into drain_dir by a drain that then failed: name -> param_version, delivered by the next drain
        self.pending = OrderedDict()
        self.submission_id = 0
        self.reported_strays = set()
        self.storage_state = {}  # operation -> (errno, exception type) of its current failure; absent when fine
        # protected by param_lock
        self.mortal_param: Optional[bytes] = None
        self.dqn_param: Optional[bytes] = None
        self.param_signature: Optional[dict] = None  # {'mortal': signature, 'dqn': signature} of accepted params
        self.param_version = 0
        self.idle_param_version = 0
        self.play_settings = dict(wire.DEFAULT_PLAY_SETTINGS)  # what travels with the parameters to the clients
        self.baseline: Optional[dict] = None  # the last submit_baseline's fields (get_baseline's reply)

    def reset_dirs(self) -> None:
        """Empty buffer_dir and drain_dir, creating them when missing (logged), as Mortal's server does at start."""
        with self.dir_lock:
            for d in (self.buffer_dir, self.drain_dir):
                existed = path.lexists(d)
                empty_dir(d)
                logger.info('%s %s', 'cleared and recreated' if existed else 'created', d)
            self.buffer.clear()
            self.drained.clear()
            self.pending.clear()

    # -- requests --------------------------------------------------------------------------------------------

    def handle(self, msg: dict) -> dict:
        """Dispatch one decoded request; BadRequest for an unknown type or invalid fields."""
        kind = msg.get('type')
        if kind == 'get_param':
            return self.get_param(
                _field(msg, 'param_version', int),
                _field(msg, 'server_id', (str, type(None)), default=None),
            )
        if kind == 'submit_replay':
            return self.submit_replay(
                _field(msg, 'logs', dict),
                _field(msg, 'param_version', int, default=UNKNOWN_VERSION),
                _field(msg, 'server_id', (str, type(None)), default=None),
            )
        if kind == 'submit_param':
            return self.submit_param(
                _field(msg, 'mortal', bytes),
                _field(msg, 'dqn', bytes),
                _field(msg, 'is_idle', bool, default=False),
                arch_change=_field(msg, 'arch_change', bool, default=False),
                settings=play_settings_of(msg),
            )
        if kind == 'drain':
            return self.drain()
        if kind == 'submit_baseline':
            return self.submit_baseline(msg)
        if kind == 'get_baseline':
            return self.get_baseline()
        raise BadRequest(f'unknown request type {kind!r} (expected one of {wire.REQUEST_TYPES})')

    def get_param(self, client_version: int, client_server_id: Optional[str] = None) -> dict:
        """Parameters for a self-play client, or the reason it must wait (Mortal's three refusals)."""
        with self.dir_lock:
            overflow = len(self.buffer) + len(self.pending) >= self.capacity
        if overflow:
            return {'status': wire.STATUS_OVERFLOW}
        if client_server_id != self.server_id:
            client_version = UNKNOWN_VERSION  # versions of another server instance mean nothing here
        with self.param_lock:
            if self.mortal_param is None or self.dqn_param is None:
                return {'status': wire.STATUS_EMPTY_PARAM}
            if self.force_sequential and self.idle_param_version <= client_version:
                return {'status': wire.STATUS_BUSY}
            return {
                'status': wire.STATUS_OK,
                'mortal': self.mortal_param,
                'dqn': self.dqn_param,
                'param_version': self.param_version,
                'server_id': self.server_id,
                **self.play_settings,
                **({'baseline_digest': self.baseline['baseline_digest']} if self.baseline else {}),
            }

    def submit_baseline(self, msg: dict) -> dict:
        """Store the trainer's baseline (``mortal``/``dqn`` safetensors bytes, ``arch``, ``baseline_version``,
        ``baseline_digest``); BadRequest naming the field when one is missing or invalid (nothing is stored)."""
        fields = {'mortal': _field(msg, 'mortal', bytes), 'dqn': _field(msg, 'dqn', bytes)}
        for key, data in fields.items():
            if not wire.state_dict_signature(data):  # ProtocolError (a bad request) when not safetensors
                raise BadRequest(f'field {key!r} is an empty state dict')
        try:
            fields['arch'] = wire.check_baseline_arch(_field(msg, 'arch', dict))
            fields['baseline_digest'] = wire.check_digest(_field(msg, 'baseline_digest', str))
        except ValueError as ex:
            raise BadRequest(str(ex)) from None
        fields['baseline_version'] = _field(msg, 'baseline_version', int)
        if fields['baseline_version'] < 0:
            raise BadRequest(f"field 'baseline_version' must be >= 0, got {fields['baseline_version']}")
        with self.param_lock:
            known = self.baseline is not None and self.baseline['baseline_digest'] == fields['baseline_digest']
            self.baseline = fields
        if not known:
            logger.info('baseline version %d stored (digest %s, version %d, %dx%d)', fields['baseline_version'],
                        fields['baseline_digest'][:12], fields['arch']['version'], fields['arch']['conv_channels'],
                        fields['arch']['num_blocks'])
        return {'status': wire.STATUS_OK, 'baseline_version': fields['baseline_version']}

    def get_baseline(self) -> dict:
        """The stored baseline (the fields of ``submit_baseline``), or 'empty baseline' before any."""
        with self.param_lock:
            if self.baseline is None:
                return {'status': wire.STATUS_EMPTY_BASELINE}
            return {'status': wire.STATUS_OK, **self.baseline}

    def submit_replay(self, logs: dict, param_version: int, client_server_id: Optional[str] = None) -> dict:
        """Store the logs ``{name: bytes}`` as ``{submission_id}_{name}``, all or none.

        Raises BadRequest (nothing stored) if any name is unsafe or any content is not bytes or not an mjai log
        (``check_log_head``). A disk failure is answered ``{'status': 'error', 'reason': 'buffer_dir not
        writable: ...'}`` with nothing stored (logged once per change of state)."""
        for name, content in logs.items():
            if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or '..' in name:
                raise BadRequest(f'unsafe log name {name!r}')
            if not isinstance(content, bytes):
                raise BadRequest(f'log {name!r} is a {type(content).__name__}, expected bytes')
        for name, content in logs.items():
            check_log_head(name, content)
        if client_server_id != self.server_id:
            param_version = UNKNOWN_VERSION
        with self.dir_lock:
            sid = self.submission_id
            self.submission_id += 1
            staged, renamed = [], []
            try:
                for i, (name, content) in enumerate(logs.items()):
                    tmp = path.join(self.buffer_dir, f'{_TMP_PREFIX}{sid}-{i}')
                    staged.append((tmp, f'{sid}_{name}'))
                    with open(tmp, 'wb') as f:
                        f.write(content)
                for tmp, final in staged:
                    os.replace(tmp, path.join(self.buffer_dir, final))
                    renamed.append(final)
            except OSError as ex:
                # undo the whole submission: the client resubmits it, which must not store a log twice
                for tmp, _ in staged:
                    _remove_quietly(tmp)
                for final in renamed:
                    _remove_quietly(path.join(self.buffer_dir, final))
                return self._storage_failed('buffer_dir', f'buffer_dir not writable: {ex}', ex)
            self._storage_ok('buffer_dir', f'buffer_dir {self.buffer_dir} writable again')
            for final in renamed:
                self.buffer[final] = param_version
            size = len(self.buffer)
        logger.info('submission %d: %d logs (param version %d); total buffer size: %d',
                    sid, len(logs), param_version, size)
        return {'status': wire.STATUS_OK, 'count': len(logs), 'submission_id': sid}

    def submit_param(self, mortal: bytes, dqn: bytes, is_idle: bool, *, arch_change: bool = False,
                     settings: Optional[dict] = None) -> dict:
        """Replace the served parameters (safetensors bytes, checked to parse) and bump the version.

        Raises ProtocolError (not safetensors) or BadRequest: an empty state dict, or key names/dtypes/shapes
        other than those of the first accepted submission (naming the first differing key and both shapes)
        unless ``arch_change``, which makes this submission the new reference."""
        wire.unpack_state_dict(mortal)  # ProtocolError if not a state dict: never serve garbage to clients
        wire.unpack_state_dict(dqn)
        sig = {'mortal': wire.state_dict_signature(mortal), 'dqn': wire.state_dict_signature(dqn)}
        for field, entries in sig.items():
            if not entries:
                raise BadRequest(f'field {field!r} is an empty state dict')
        with self.param_lock:
            if self.param_signature is not None:
                for field, entries in sig.items():
                    diff = wire.signature_difference(self.param_signature[field], entries)
                    if diff is None:
                        continue
                    if not arch_change:
                        raise BadRequest(
                            f'field {field!r} does not match the parameters this server accepted first: {diff} '
                            '(send arch_change = true to change the architecture on purpose, or restart the '
                            'server)')
                    logger.warning('architecture change accepted (arch_change): %s: %s', field, diff)
            self.param_signature = sig
            self.mortal_param = mortal
            self.dqn_param = dqn
            self.play_settings = {**wire.DEFAULT_PLAY_SETTINGS, **(settings or {})}
            self.param_version += 1
            if is_idle:
                self.idle_param_version = self.param_version
            version = self.param_version
        logger.info('param version %d submitted%s', version, ' (idle)' if is_idle else '')
        return {'status': wire.STATUS_OK, 'param_version': version, 'server_id': self.server_id}

    def drain(self) -> dict:
        """Move every buffered log into a freshly emptied drain_dir (under force_sequential only when the buffer
        is full). Reply: count, drain_dir, files (names in drain_dir), param_versions (one per file, -1 unknown),
        param_version (current), has_param (False after a server restart: the trainer should resubmit).

        A disk failure midway answers ``{'status': 'error', 'reason': ...}``: each log is then either still in
        buffer_dir or already in drain_dir, and the next drain delivers both kinds exactly once."""
        with self.param_lock:
            current = self.param_version
            has_param = self.mortal_param is not None
        moved, versions = [], []
        with self.dir_lock:
            count = len(self.buffer) + len(self.pending)
            if count > 0 and (not self.force_sequential or count >= self.capacity):
                try:
                    self._report_strays(self.buffer_dir, set(self.buffer))
                    self._empty_drain_dir()
                    for name, version in sorted(self.buffer.items()):
                        src = path.join(self.buffer_dir, name)
                        try:
                            _move(src, path.join(self.drain_dir, name))
                        except OSError:
                            if path.lexists(src):
                                raise
                            logger.warning('buffered log %s vanished from %s; skipped', name, self.buffer_dir)
                            del self.buffer[name]
                            continue
                        del self.buffer[name]
                        self.pending[name] = version
                except OSError as ex:
                    return self._storage_failed(
                        'drain', f'drain from buffer_dir to drain_dir failed ({len(self.pending)} moved, '
                        f'{len(self.buffer)} still buffered; the next drain delivers all): {ex}', ex)
                self._storage_ok('drain', 'drain works again')
                moved = sorted(self.pending)
                versions = [self.pending[name] for name in moved]
                self.drained = set(moved)
                self.pending.clear()
                logger.info('files transferred to trainer: %d; total buffer size: 0', len(moved))
        return {
            'status': wire.STATUS_OK,
            'count': len(moved),
            'drain_dir': self.drain_dir,
            'files': moved,
            'param_versions': versions,
            'param_version': current,
            'has_param': has_param,
            'server_id': self.server_id,
        }

    def _storage_failed(self, operation: str, reason: str, ex: OSError) -> dict:
        """The 'error' reply for a disk failure; logs it only when it differs from the last one (errno, type)."""
        state = (ex.errno, type(ex).__name__)
        if self.storage_state.get(operation) != state:
            self.storage_state[operation] = state
            logger.error('%s; answering error until this is fixed', reason)
        return {'status': wire.STATUS_ERROR, 'reason': reason}

    def _storage_ok(self, operation: str, message: str) -> None:
        if self.storage_state.pop(operation, None) is not None:
            logger.info('%s', message)

    # -- helpers (dir_lock held) -----------------------------------------------------------------------------

    def _report_strays(self, directory: str, known: set) -> None:
        for entry in os.listdir(directory):
            if entry in known or entry.startswith(_TMP_PREFIX):
                continue
            key = (directory, entry)
            if key not in self.reported_strays:
                self.reported_strays.add(key)
                logger.warning('ignoring stray entry %s in %s (not written by this server)', entry, directory)

    def _empty_drain_dir(self) -> None:
        for entry in os.listdir(self.drain_dir):
            if entry in self.pending:
                continue  # moved by a failed drain, not delivered yet
            p = path.join(self.drain_dir, entry)
            if entry not in self.drained and not entry.startswith(_TMP_PREFIX):
                logger.warning('removing stray entry %s from %s while emptying it', entry, self.drain_dir)
            if path.isdir(p) and not path.islink(p):
                shutil.rmtree(p)
            else:
                os.remove(p)


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
        super().__init__(address, Handler)

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


class ServerStartError(RuntimeError):
    """The server cannot listen on its address (e.g. the port is taken by a server already running with this
    config); raised before anything on disk is touched."""


def build_server(config: dict, *, host: Optional[str] = None, port: Optional[int] = None) -> ParamServer:
    """Create the store from ``[online.server]``, bind to ``[online.remote]`` (or host/port), then clear the dirs.

    Binding comes first: a second server started with the same config must fail on the busy port before it
    wipes the buffer of the one already running. Raises ServerStartError (the address cannot be bound),
    ValueError (unsafe bind, bad limits), OSError (the dirs cannot be recreated)."""
    cfg = config['online']['server']
    remote = wire.Remote.from_config(config)
    store = ReplayStore(cfg['buffer_dir'], cfg['drain_dir'], cfg['capacity'], cfg.get('force_sequential', False))
    address = (remote.host if host is None else host, remote.port if port is None else port)
    check_bind_security(address[0], remote.token)
    try:
        server = ParamServer(address, store, token=remote.token, max_frame_size=remote.max_frame_size,
                             timeout=remote.timeout,
                             max_pending=int(cfg.get('max_pending_connections', DEFAULT_MAX_PENDING)),
                             max_inflight_bytes=int(cfg.get('max_inflight_bytes', 0)),
                             payload_min_rate=int(cfg.get('payload_min_bytes_per_s', DEFAULT_PAYLOAD_MIN_RATE)))
    except OSError as ex:
        hint = (' (is a server with this config already running? its buffer_dir and drain_dir were left alone)'
                if ex.errno == errno.EADDRINUSE else '')
        raise ServerStartError(f'cannot listen on {address[0]}:{address[1]} ([online.remote] host/port): '
                               f'{ex.strerror or ex}{hint}') from None
    try:
        store.reset_dirs()
    except BaseException:
        server.server_close()
        raise
    return server


def main(argv=None):
    """Entry point: ``python mortal/server.py`` (config from MORTAL_CFG or ``--config``)."""
    from mortal import entry
    from mortal.config import SERVER_SECTIONS
    args = entry.start(entry.parser(__doc__.splitlines()[0]), argv)
    config = entry.load_config_or_exit(args, SERVER_SECTIONS)
    try:
        server = build_server(config)
    except ServerStartError as ex:
        logger.error('%s', ex)  # one line, no traceback: nothing was started or touched
        raise SystemExit(2) from None
    with server:
        host, port = server.server_address[:2]
        logger.info('listening on %s:%d (capacity %d, force_sequential %s)', host, port,
                    server.store.capacity, server.store.force_sequential)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


if __name__ == '__main__':
    main()
