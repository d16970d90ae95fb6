"""The server's state: the parameters it serves, their versions and play settings, the trainer's baseline, and the
on-disk replay buffer (``buffer_dir``) with its hand-over to the trainer (``drain_dir``). No sockets here.
Logs as ``mortal.server``."""

import contextlib
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
from os import path
from typing import Optional

from mortal.net import wire
from mortal.net.signature import signature_difference, state_dict_signature
from mortal.net.wire import BadRequest
from mortal.util.fsutil import empty_dir

logger = logging.getLogger('mortal.server')  # the server's name (log format)

# Names a client may give a log: one path component, no hidden/temporary names, no separators.
_SAFE_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9._-]{0,199}')
_TMP_PREFIX = '.incoming-'
UNKNOWN_VERSION = -1
_GZIP_MAGIC = b'\x1f\x8b'
_UTF8_BOM = b'\xef\xbb\xbf'
# Decompressed bytes searched for a log's first line (~200 bytes): also what a gzip bomb costs at most.
FIRST_LINE_LIMIT = 64 * 1024


def check_log_head(name: str, content: bytes) -> None:
    """BadRequest (naming the log) unless the first non-blank line of ``content`` (gzip or plain) is a
    ``start_game`` event; decompresses at most ``FIRST_LINE_LIMIT`` bytes (a UTF-8 BOM is dropped)."""
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
    with contextlib.suppress(OSError):
        os.remove(p)


def _move(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` (across file systems via a temporary name); on failure the file stays at ``src``."""
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


def _learner_id(msg: dict) -> Optional[str]:
    """submit_param's optional 'learner'; BadRequest unless a short printable string (it is logged)."""
    learner = _field(msg, 'learner', (str, type(None)), default=None)
    if learner is not None and not 0 < len(learner) <= MAX_LEARNER_ID:
        raise BadRequest(f"field 'learner' must be 1-{MAX_LEARNER_ID} characters, got {len(learner)}")
    if learner is not None and not learner.isprintable():
        raise BadRequest(f"field 'learner' must be printable characters only (no control character), got "
                         f"{ascii(learner[:80])}")
    return learner


# Seconds a learner's run counts as live after its last submit_param (its restarts keep the run).
LEARNER_LIVENESS = 600.0
MAX_LEARNER_ID = 1024  # characters of submit_param's 'learner' (it is logged and sent back)


class ReplayStore:
    """Thread-safe state of the server: parameters and baseline under ``param_lock``, the buffer under ``dir_lock``.

    capacity: buffered logs at which clients are refused new parameters; force_sequential: clients wait for each new
    idle version and the trainer drains only full buffers; learner_liveness: s a learner counts as live."""

    def __init__(self, buffer_dir: str, drain_dir: str, capacity: int, force_sequential: bool = False, *,
                 learner_liveness: float = LEARNER_LIVENESS):
        self.force_sequential = bool(force_sequential)
        self.server_id = secrets.token_hex(8)
        self.param_lock = threading.Lock()
        # protected by param_lock
        self.mortal_param: Optional[bytes] = None
        self.dqn_param: Optional[bytes] = None
        self.param_signature: Optional[dict] = None  # {'mortal': signature, 'dqn': signature} of accepted params
        self.param_version = 0
        self.idle_param_version = 0
        self.play_settings = dict(wire.DEFAULT_PLAY_SETTINGS)  # what travels with the parameters to the clients
        self.baseline: Optional[dict] = None  # the last submit_baseline's fields (get_baseline's reply)
        self.learner_liveness = float(learner_liveness)
        self.learner: Optional[str] = None  # the run of the last learner that sent one, and when (monotonic)
        self.learner_seen = 0.0
        self.buffer_dir = path.abspath(buffer_dir)
        self.drain_dir = path.abspath(drain_dir)
        self.capacity = int(capacity)
        self.dir_lock = threading.Lock()
        # protected by dir_lock: buffered file name -> param_version it was played with (UNKNOWN_VERSION if unknown)
        self.buffer = {}
        self.drained = set()
        # moved into drain_dir by a drain that then failed: name -> param_version, delivered by the next drain
        self.pending = {}
        self.submission_id = 0
        self.reported_strays = set()
        self.storage_state = {}  # operation -> (errno, exception type) of its current failure; absent when fine
        self.last_drain = time.monotonic()  # when the trainer last asked for a drain (or the store was made)

    def handle(self, msg: dict) -> dict:
        """Dispatch one decoded request; BadRequest for an unknown type or invalid fields."""
        kind = msg.get('type')
        if kind == 'get_param':
            return self.get_param(
                _field(msg, 'param_version', int),
                _field(msg, 'server_id', (str, type(None)), default=None),
            )
        if kind == 'submit_replay':
            return self.submit_replay(_field(msg, 'logs', dict),
                                      _field(msg, 'param_version', int, default=UNKNOWN_VERSION),
                                      _field(msg, 'server_id', (str, type(None)), default=None))
        if kind == 'submit_param':
            return self.submit_param(_field(msg, 'mortal', bytes), _field(msg, 'dqn', bytes),
                                     _field(msg, 'is_idle', bool, default=False),
                                     arch_change=_field(msg, 'arch_change', bool, default=False),
                                     settings=wire.check_play_settings(msg), learner=_learner_id(msg))
        if kind == 'drain':
            return self.drain()
        if kind == 'submit_baseline':
            return self.submit_baseline(msg)
        if kind == 'get_baseline':
            return self.get_baseline()
        raise BadRequest(f'unknown request type {kind!r} (expected one of {wire.REQUEST_TYPES})')

    def get_param(self, client_version: int, client_server_id: Optional[str] = None) -> dict:
        """Parameters for a self-play client, or the reason it must wait (Mortal's three refusals)."""
        if self.buffered() >= self.capacity:  # the trainer has not drained: clients get no parameters
            return {'status': wire.STATUS_OVERFLOW}
        if client_server_id != self.server_id:
            client_version = UNKNOWN_VERSION  # versions of another server instance mean nothing here
        with self.param_lock:
            if self.mortal_param is None or self.dqn_param is None:
                return {'status': wire.STATUS_EMPTY_PARAM}
            if self.force_sequential and self.idle_param_version <= client_version:
                return {'status': wire.STATUS_BUSY}
            return {'status': wire.STATUS_OK, 'mortal': self.mortal_param, 'dqn': self.dqn_param,
                    'param_version': self.param_version, 'server_id': self.server_id, **self.play_settings,
                    **({'baseline_digest': self.baseline['baseline_digest']} if self.baseline else {})}

    def drain(self) -> dict:
        """Move every buffered log into a freshly emptied drain_dir; reply: count, drain_dir, files,
        param_versions (-1 unknown), param_version, has_param.

        A disk failure midway answers 'error'; the next drain delivers every log exactly once."""
        self.last_drain = time.monotonic()
        with self.param_lock:
            current = self.param_version
            has_param = self.mortal_param is not None
        moved = []  # [(name, param_version)] sorted by name
        with self.dir_lock:
            count = len(self.buffer) + len(self.pending)
            if count > 0 and (not self.force_sequential or count >= self.capacity):
                try:
                    self._report_strays()
                    self._empty_drain_dir()
                    for name, version in sorted(self.buffer.items()):
                        src = path.join(self.buffer_dir, name)
                        try:
                            _move(src, path.join(self.drain_dir, name))
                            self.pending[name] = version
                        except OSError:
                            if path.lexists(src):
                                raise
                            logger.warning('buffered log %s vanished from %s; skipped', name, self.buffer_dir)
                        del self.buffer[name]
                except OSError as ex:
                    return self._storage_failed(
                        'drain', f'drain from buffer_dir to drain_dir failed ({len(self.pending)} moved, '
                        f'{len(self.buffer)} still buffered; the next drain delivers all): {ex}', ex)
                self._storage_ok('drain', 'drain works again')
                moved = sorted(self.pending.items())
                self.drained = set(self.pending)
                self.pending.clear()
                logger.info('files transferred to trainer: %d; total buffer size: 0', len(moved))
        return {'status': wire.STATUS_OK, 'count': len(moved), 'drain_dir': self.drain_dir,
                'files': [name for name, _ in moved], 'param_versions': [version for _, version in moved],
                'param_version': current, 'has_param': has_param, 'server_id': self.server_id}

    def submit_param(self, mortal: bytes, dqn: bytes, is_idle: bool, *, arch_change: bool = False,
                     settings: Optional[dict] = None, learner: Optional[str] = None) -> dict:
        """Replace the served parameters (safetensors bytes) and bump the version.

        Refused ('another learner is live') while another learner's run submitted within ``learner_liveness`` s. Raises
        ProtocolError or BadRequest (empty, or a signature other than the first accepted one unless ``arch_change``)."""
        wire.unpack_state_dict(mortal)  # ProtocolError if not a state dict: never serve garbage to clients
        wire.unpack_state_dict(dqn)
        sig = {'mortal': state_dict_signature(mortal), 'dqn': state_dict_signature(dqn)}
        for field, entries in sig.items():
            if not entries:
                raise BadRequest(f'field {field!r} is an empty state dict')
        with self.param_lock:
            now = time.monotonic()
            age = now - self.learner_seen
            if self.learner not in (None, learner) and age < self.learner_liveness:
                this = learner if learner is not None else 'a learner without an id'
                logger.warning('refused the parameters of %s: learner %s submitted %.0f s ago',
                               this if learner is None else f'learner {learner}', self.learner, age)
                return {'status': wire.STATUS_OTHER_LEARNER, 'reason': (
                    f'learner {self.learner} submitted parameters {age:.0f} s ago, and this server takes one '
                    f'learner at a time (this one is {this}): stop one of them, or point this one at its own '
                    f'server ([online.remote] port); if that learner has ended, start this one again in '
                    f'{self.learner_liveness - age:.0f} s or restart the server')}
            if self.param_signature is not None:
                for field, entries in sig.items():
                    diff = signature_difference(self.param_signature[field], entries)
                    if diff is None:
                        continue
                    if not arch_change:
                        raise BadRequest(
                            f'field {field!r} does not match the parameters this server accepted first: {diff} '
                            '(send arch_change = true to change the architecture on purpose, or restart the '
                            'server)')
                    logger.warning('architecture change accepted (arch_change): %s: %s', field, diff)
            if learner is not None:
                if self.learner not in (None, learner):
                    logger.info('learner %s takes over from %s (silent for %.0f s)', learner, self.learner, age)
                self.learner, self.learner_seen = learner, now
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

    def submit_baseline(self, msg: dict) -> dict:
        """Store the trainer's baseline; BadRequest naming a missing or invalid field (nothing stored)."""
        fields = {'mortal': _field(msg, 'mortal', bytes), 'dqn': _field(msg, 'dqn', bytes)}
        for key, data in fields.items():
            if not state_dict_signature(data):  # ProtocolError (a bad request) when not safetensors
                raise BadRequest(f'field {key!r} is an empty state dict')
        fields['arch'] = wire.check_baseline_arch(_field(msg, 'arch', dict))
        fields['baseline_digest'] = wire.check_digest(_field(msg, 'baseline_digest', str))
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

    def buffered(self) -> int:
        """Logs in the buffer, those of a failed drain (``pending``) included."""
        with self.dir_lock:
            return len(self.buffer) + len(self.pending)

    def submit_replay(self, logs: dict, param_version: int, client_server_id: Optional[str] = None) -> dict:
        """Store the logs ``{name: bytes}`` as ``{submission_id}_{name}``, all or none.

        Raises BadRequest for an unsafe name or a non-log; a disk failure answers 'error' with nothing stored."""
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

    def _report_strays(self) -> None:
        """Warn once per entry of buffer_dir that this server did not write."""
        for entry in os.listdir(self.buffer_dir):
            if entry not in self.buffer and not entry.startswith(_TMP_PREFIX) and entry not in self.reported_strays:
                self.reported_strays.add(entry)
                logger.warning('ignoring stray entry %s in %s (not written by this server)', entry, self.buffer_dir)

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
