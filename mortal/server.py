"""Parameter store and replay buffer between self-play clients and the trainer (Mortal's ``server.py``).

Behaviour as Mortal's server, with its faults fixed:
- ``get_param`` answers 'samples overflow' while the buffer holds >= ``capacity`` logs, 'empty param' before the
  trainer's first submission, 'trainer is busy' under ``force_sequential`` when the client already has the newest
  idle version, else the parameters.
- ``submit_replay`` stores each log as ``{submission_id}_{name}`` (two submissions never overwrite each other),
  written under a temporary name and renamed, so a crash leaves no half-written log; each log remembers the
  ``param_version`` it was played with, so the trainer can measure staleness.
- ``submit_param`` bumps ``param_version`` (and the idle version when ``is_idle``).
- ``drain`` moves the whole buffer into a freshly emptied ``drain_dir`` (under ``force_sequential`` only once the
  buffer is full) and answers ``{count, drain_dir, files, param_versions, ...}``.
- Both dirs are cleared and recreated at start. Counts come only from files this server wrote: stray entries are
  logged and ignored in ``buffer_dir``, logged and removed when ``drain_dir`` is emptied.
- Every request is one connection; a malformed frame closes that connection only (see ``mortal/wire.py``).
- Each server instance has a random ``server_id``; a client or trainer that reconnects after a restart is
  recognised as holding no parameters of this instance (otherwise ``force_sequential`` would deadlock).
"""

if __package__ in (None, ''):  # run as a script: python mortal/server.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import ipaddress
import logging
import os
import re
import secrets
import shutil
import socket
import threading
from os import path
from socketserver import BaseRequestHandler, ThreadingTCPServer
from typing import Optional

from mortal import wire

logger = logging.getLogger('mortal.server' if __name__ == '__main__' else __name__)

# Names a client may give a log: one path component, no hidden/temporary names, no separators.
_SAFE_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9._-]{0,199}')
_TMP_PREFIX = '.incoming-'
UNKNOWN_VERSION = -1


class BadRequest(ValueError):
    """A well-formed frame whose content is not a valid request (wrong field type, unsafe file name, ...)."""


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


class ReplayStore:
    """Thread-safe state of the server: parameters, versions and the on-disk replay buffer.

    buffer_dir/drain_dir: directories this store owns (cleared by ``reset_dirs``); capacity: number of buffered
    logs at which clients are refused new parameters; force_sequential: clients wait for each new idle version and
    the trainer drains only full buffers. Methods take/return the request/reply maps of ``mortal/wire.py``.
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
        self.submission_id = 0
        self.reported_strays = set()
        # protected by param_lock
        self.mortal_param: Optional[bytes] = None
        self.dqn_param: Optional[bytes] = None
        self.param_version = 0
        self.idle_param_version = 0

    def reset_dirs(self) -> None:
        """Delete and recreate buffer_dir and drain_dir (logged), as Mortal's server does at start."""
        with self.dir_lock:
            for d in (self.buffer_dir, self.drain_dir):
                existed = path.lexists(d)
                if path.isdir(d) and not path.islink(d):
                    shutil.rmtree(d)
                elif existed:
                    os.remove(d)
                os.makedirs(d)
                logger.info('%s %s', 'cleared and recreated' if existed else 'created', d)
            self.buffer.clear()
            self.drained.clear()

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
            )
        if kind == 'drain':
            return self.drain()
        raise BadRequest(f'unknown request type {kind!r} (expected one of {wire.REQUEST_TYPES})')

    def get_param(self, client_version: int, client_server_id: Optional[str] = None) -> dict:
        """Parameters for a self-play client, or the reason it must wait (Mortal's three refusals)."""
        with self.dir_lock:
            overflow = len(self.buffer) >= self.capacity
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
            }

    def submit_replay(self, logs: dict, param_version: int, client_server_id: Optional[str] = None) -> dict:
        """Store the logs ``{name: bytes}`` as ``{submission_id}_{name}``; BadRequest (nothing stored) if any
        name is unsafe or any content is not bytes."""
        for name, content in logs.items():
            if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or '..' in name:
                raise BadRequest(f'unsafe log name {name!r}')
            if not isinstance(content, bytes):
                raise BadRequest(f'log {name!r} is a {type(content).__name__}, expected bytes')
        if client_server_id != self.server_id:
            param_version = UNKNOWN_VERSION
        with self.dir_lock:
            sid = self.submission_id
            self.submission_id += 1
            staged = []
            try:
                for i, (name, content) in enumerate(logs.items()):
                    tmp = path.join(self.buffer_dir, f'{_TMP_PREFIX}{sid}-{i}')
                    with open(tmp, 'wb') as f:
                        f.write(content)
                    staged.append((tmp, f'{sid}_{name}'))
                for tmp, final in staged:
                    os.replace(tmp, path.join(self.buffer_dir, final))
                    self.buffer[final] = param_version
            except OSError:
                for tmp, _ in staged:
                    if path.exists(tmp):
                        os.remove(tmp)
                raise
            size = len(self.buffer)
        logger.info('submission %d: %d logs (param version %d); total buffer size: %d',
                    sid, len(logs), param_version, size)
        return {'status': wire.STATUS_OK, 'count': len(logs), 'submission_id': sid}

    def submit_param(self, mortal: bytes, dqn: bytes, is_idle: bool) -> dict:
        """Replace the served parameters (safetensors bytes, checked to parse) and bump the version."""
        wire.unpack_state_dict(mortal)  # ProtocolError if not a state dict: never serve garbage to clients
        wire.unpack_state_dict(dqn)
        with self.param_lock:
            self.mortal_param = mortal
            self.dqn_param = dqn
            self.param_version += 1
            if is_idle:
                self.idle_param_version = self.param_version
            version = self.param_version
        logger.info('param version %d submitted%s', version, ' (idle)' if is_idle else '')
        return {'status': wire.STATUS_OK, 'param_version': version, 'server_id': self.server_id}

    def drain(self) -> dict:
        """Move every buffered log into a freshly emptied drain_dir (under force_sequential only when the buffer
        is full). Reply: count, drain_dir, files (names in drain_dir), param_versions (one per file, -1 unknown),
        param_version (current), has_param (False after a server restart: the trainer should resubmit)."""
        with self.param_lock:
            current = self.param_version
            has_param = self.mortal_param is not None
        moved, versions = [], []
        with self.dir_lock:
            count = len(self.buffer)
            if count > 0 and (not self.force_sequential or count >= self.capacity):
                self._report_strays(self.buffer_dir, set(self.buffer))
                self._empty_drain_dir()
                for name, version in sorted(self.buffer.items()):
                    try:
                        shutil.move(path.join(self.buffer_dir, name), path.join(self.drain_dir, name))
                    except FileNotFoundError:
                        logger.warning('buffered log %s vanished from %s; skipped', name, self.buffer_dir)
                        continue
                    moved.append(name)
                    versions.append(version)
                self.drained = set(moved)
                self.buffer.clear()
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
            p = path.join(self.drain_dir, entry)
            if entry not in self.drained:
                logger.warning('removing stray entry %s from %s while emptying it', entry, self.drain_dir)
            if path.isdir(p) and not path.islink(p):
                shutil.rmtree(p)
            else:
                os.remove(p)


class Handler(BaseRequestHandler):
    """One connection = one request frame and one reply frame."""

    def handle(self):
        srv: ParamServer = self.server
        peer = '%s:%s' % self.client_address[:2]
        sock = self.request
        sock.settimeout(srv.timeout)
        try:
            msg = wire.recv_msg(sock, srv.max_frame_size)
        except wire.PeerClosed:
            return
        except wire.ProtocolError as ex:
            logger.warning('closing connection from %s: %s', peer, ex)
            return
        except OSError as ex:
            logger.warning('closing connection from %s: %s: %s', peer, type(ex).__name__, ex)
            return
        if not wire.token_matches(srv.token, msg.get('token')):
            logger.warning('closing connection from %s: missing or wrong token', peer)
            reply = {'status': wire.STATUS_UNAUTHORIZED, 'reason': 'missing or wrong token'}
        else:
            try:
                reply = srv.store.handle(msg)
            except (BadRequest, wire.ProtocolError) as ex:
                logger.warning('bad %r request from %s: %s', msg.get('type'), peer, ex)
                reply = {'status': wire.STATUS_BAD_REQUEST, 'reason': str(ex)}
        try:
            wire.send_msg(sock, reply)
        except OSError as ex:
            logger.warning('could not reply to %s: %s', peer, ex)


class ParamServer(ThreadingTCPServer):
    """Threaded TCP server around a ReplayStore. Bind errors propagate; per-connection errors are logged."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, address, store: ReplayStore, *, token: Optional[str] = None,
                 max_frame_size: int = wire.DEFAULT_MAX_FRAME_SIZE, timeout: float = wire.DEFAULT_TIMEOUT):
        check_bind_security(address[0], token)
        self.store = store
        self.token = token
        self.max_frame_size = max_frame_size
        self.timeout = timeout
        super().__init__(address, Handler)

    def handle_error(self, request, client_address):
        logger.exception('unexpected error while serving %s', client_address)


def is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address (127.0.0.0/8, ::1)."""
    if host in ('', '0.0.0.0', '::'):
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0].split('%')[0]).is_loopback for info in infos)


def check_bind_security(host: str, token: Optional[str]) -> None:
    """Refuse (ValueError naming the key) to serve beyond loopback without ``[online.remote] token``."""
    if not token and not is_loopback(host):
        raise ValueError(
            f'[online.remote] host = {host!r} is reachable beyond this machine, so [online.remote] token must be '
            'set (a shared secret that clients and the trainer send with every request)')


def build_server(config: dict, *, host: Optional[str] = None, port: Optional[int] = None) -> ParamServer:
    """Create the store from ``[online.server]``, clear its dirs and bind to ``[online.remote]`` (or host/port)."""
    cfg = config['online']['server']
    remote = wire.Remote.from_config(config)
    store = ReplayStore(cfg['buffer_dir'], cfg['drain_dir'], cfg['capacity'], cfg.get('force_sequential', False))
    address = (remote.host if host is None else host, remote.port if port is None else port)
    check_bind_security(address[0], remote.token)
    store.reset_dirs()
    return ParamServer(address, store, token=remote.token, max_frame_size=remote.max_frame_size,
                       timeout=remote.timeout)


def main(argv=None):
    """Entry point: ``python mortal/server.py`` (config from MORTAL_CFG or ``--config``)."""
    os.environ.pop('RUST_BACKTRACE', None)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('-c', '--config', help='config file (default: $MORTAL_CFG or config.toml)')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
    from mortal.config import SERVER_SECTIONS, load_config_or_exit
    config = load_config_or_exit(args.config, required=SERVER_SECTIONS)
    server = build_server(config)
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
