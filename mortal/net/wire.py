"""Wire protocol between server, clients and trainer: Mortal's messages, one request per connection, without its
``torch.save`` pickles (a peer could run code): a 78-byte header (``PREFIX``, ``REST``: its MAC is keyed with the
token, which never travels) and one msgpack map, state dicts as safetensors bytes (docs/operations.md, "Bad input on
the network"). Requests:
    {'type': 'get_param', 'param_version': int, 'server_id': str|None}
    {'type': 'submit_replay', 'logs': {name: gz bytes}, 'param_version': int, 'server_id': str|None}
    {'type': 'submit_param', 'mortal': bytes, 'dqn': bytes, 'is_idle': bool, 'arch_change': bool (optional),
     'steps', 'epsilon_factor', 'temp_factor', 'baseline_version' (optional play settings, handed to clients),
     'learner': str (optional: the learner's run; another live run's is refused 'another learner is live')}
    {'type': 'drain'}
    {'type': 'submit_baseline', 'mortal': bytes, 'dqn': bytes, 'arch': {'version', 'conv_channels', 'num_blocks'},
     'baseline_version': int, 'baseline_digest': str}   (the trainer's [baseline.train])
    {'type': 'get_baseline'}
Replies carry ``status`` (``STATUS_*``; 'bad request' and 'error' with a ``reason``); their fields:
``mortal.net.replay_store``. A frame that breaks the protocol raises ``ProtocolError`` and closes that connection only.
"""

import hashlib
import hmac
import json
import logging
import math
import socket
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import msgpack

from mortal.config_schema import (DEFAULT_MAX_FRAME_BYTES, MAX_BLOCKS, MAX_CONV_CHANNELS, MIN_CONV_CHANNELS,
                                  SUPPORTED_VERSIONS)
from mortal.net.address import is_loopback
from mortal.net.msgpack_bounds import check_shape, request_limits

logger = logging.getLogger('mortal.wire')  # the wire's logger name (log format)

MAGIC = b'MJRL'
PROTOCOL_VERSION = 2  # 2: header MAC and payload digest (1: magic, version, length only)
PREFIX = struct.Struct('<4sH')  # magic, protocol version: read first, so a peer of another version is told at once
REST = struct.Struct('<Q32s32s')  # payload length, SHA-256 of the payload, HMAC-SHA256 of everything before it
HEADER_SIZE = PREFIX.size + REST.size  # 78 bytes
MAC_SIZE = 32
DEFAULT_TIMEOUT = 300.0  # seconds of silence on a socket before giving up on the peer
REPLY_MIN_BYTES_PER_S = 16 << 10  # a reply gets the socket timeout plus its size at this rate (or the server's floor)
HEADER_TIMEOUT = 5.0  # seconds for a whole header: no unauthenticated slot held byte by byte (a real peer: 1 RTT)
RECV_CHUNK = 1 << 20
WHOLE_AT_ONCE = 256 * 1024  # a payload up to this size is taken from the server's budget at once, not as it comes
RETRY_INTERVAL = 3.0  # seconds, as Mortal's client loop
PIECE_BYTES = 1 << 16  # byte strings from this size travel as their own piece (``encode_pieces``), packed as bin32

REQUEST_TYPES = ('get_param', 'submit_replay', 'submit_param', 'drain', 'submit_baseline', 'get_baseline')
# Status strings are Mortal's where Mortal has them.
STATUS_OK = 'ok'
STATUS_OVERFLOW = 'samples overflow'
STATUS_EMPTY_PARAM = 'empty param'
STATUS_BUSY = 'trainer is busy'
STATUS_EMPTY_BASELINE = 'empty baseline'
STATUS_UNAUTHORIZED = 'unauthorized'
STATUS_BAD_REQUEST = 'bad request'
STATUS_ERROR = 'error'
STATUS_OTHER_LEARNER = 'another learner is live'  # submit_param of a second learner (mortal.net.replay_store)


class BadRequest(ValueError):
    """A well-formed frame whose content is not a valid request (wrong field type, unsafe file name, ...)."""


# submit_param's optional play settings, handed to clients by get_param; the defaults are Mortal's behaviour.
DEFAULT_PLAY_SETTINGS = {'steps': -1, 'epsilon_factor': 1.0, 'temp_factor': 1.0, 'baseline_version': 0}
MAX_FACTOR = 1e6  # a factor beyond this is a bug of the sender, not a schedule
MIN_TEMP_FACTOR = 1e-6  # below this a Boltzmann softmax over Q overflows in float32


def check_play_settings(msg: dict) -> dict:
    """The play settings of a message, defaults for absent ones. Raises BadRequest naming a bad field."""
    out = {}
    for key in ('steps', 'baseline_version'):
        value = msg.get(key, DEFAULT_PLAY_SETTINGS[key])
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadRequest(f'field {key!r} is a {type(value).__name__}, expected an int')
        out[key] = value
    if out['baseline_version'] < 0:
        raise BadRequest(f"field 'baseline_version' must be >= 0, got {out['baseline_version']}")
    for key, low in (('epsilon_factor', 0.0), ('temp_factor', MIN_TEMP_FACTOR)):
        value = msg.get(key, DEFAULT_PLAY_SETTINGS[key])
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise BadRequest(f'field {key!r} is a {type(value).__name__}, expected a number')
        value = float(value)
        if not math.isfinite(value) or not low <= value <= MAX_FACTOR:
            raise BadRequest(f'field {key!r} must be a finite number within [{low:g}, {MAX_FACTOR:g}], '
                             f'got {value!r}')
        out[key] = value
    return out


# A baseline's architecture as it travels: the checkpoint config entries load_model_pair reads, with their bounds.
BASELINE_ARCH = {'version': (min(SUPPORTED_VERSIONS), max(SUPPORTED_VERSIONS)),
                 'conv_channels': (MIN_CONV_CHANNELS, MAX_CONV_CHANNELS), 'num_blocks': (1, MAX_BLOCKS)}


def check_baseline_arch(arch) -> dict:
    """The ``arch`` map of a baseline, ints within bounds. Raises BadRequest naming the field."""
    if not isinstance(arch, dict):
        raise BadRequest(f"field 'arch' is a {type(arch).__name__}, expected a map")
    out = {}
    for key, (low, high) in BASELINE_ARCH.items():
        value = arch.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise BadRequest(f"field 'arch.{key}' must be an int within [{low}, {high}], got {value!r}")
        out[key] = value
    return out


def check_digest(digest) -> str:
    """A ``baseline_digest``: 64 lowercase hex characters (SHA-256). Raises BadRequest otherwise."""
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= set('0123456789abcdef'):
        raise BadRequest(f"field 'baseline_digest' must be 64 lowercase hex characters, got {digest!r}")
    return digest


def baseline_digest(mortal: dict, dqn: dict) -> str:
    """SHA-256 (hex) of a baseline's weights (keys sorted, dtype, shape and bytes): values only, however stored."""
    import torch
    h = hashlib.sha256()
    for part, state in (('mortal', mortal), ('dqn', dqn)):
        for key in sorted(state):
            t = state[key].detach().to('cpu').contiguous()
            h.update(f'{part}/{key}:{t.dtype}:{list(t.shape)};'.encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class ProtocolError(Exception):
    """A peer sent something that is not a valid frame of this protocol; the connection must be closed."""


class PeerClosed(ProtocolError):
    """The peer closed the connection before any byte of a frame (not an error by itself)."""


class BadMac(ProtocolError):
    """A frame whose MAC does not match the receiver's token."""


class FrameTooLarge(ProtocolError):
    """A payload length above the receiver's limit; ``header``: decoded, so a server can tell an authentic sender."""

    def __init__(self, message: str, header: 'FrameHeader'):
        super().__init__(message)
        self.header = header


class RequestRefused(Exception):
    """A status the caller cannot wait out (e.g. 'unauthorized')."""


@dataclass(frozen=True)
class FrameHeader:
    """A decoded frame header: ``length`` (payload bytes), ``digest``, ``mac``, ``signed`` (what the MAC covers)."""
    length: int
    digest: bytes
    mac: bytes
    signed: bytes

    def authentic(self, token: Optional[str]) -> bool:
        """Constant-time MAC check against ``token``; True without a token."""
        if not token:
            return True
        return hmac.compare_digest(self.mac, _mac(token, self.signed))


def _mac(token: Optional[str], signed: bytes) -> bytes:
    return hmac.new((token or '').encode(), signed, hashlib.sha256).digest()


def encode_header(payload: bytes, token: Optional[str] = None) -> bytes:
    """The 78-byte header of ``payload``, signed with ``token`` (an empty key when None)."""
    return _signed_header(len(payload), hashlib.sha256(payload).digest(), token)


def _signed_header(length: int, digest: bytes, token: Optional[str]) -> bytes:
    signed = PREFIX.pack(MAGIC, PROTOCOL_VERSION) + struct.pack('<Q32s', length, digest)
    return signed + _mac(token, signed)


def encode_frame(msg: dict, token: Optional[str] = None) -> bytes:
    """``msg`` (msgpack-able values; a tensor raises TypeError) as one frame signed with ``token``."""
    return b''.join(encode_pieces(msg, token))


def decode_prefix(prefix: bytes) -> None:
    magic, version = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f'bad magic {magic!r} (expected {MAGIC!r}): not a frame of this protocol')
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f'protocol version {version}, this side speaks {PROTOCOL_VERSION}')


def decode_header(header: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_BYTES) -> FrameHeader:
    """Check and decode a 78-byte frame header (not the MAC); ProtocolError (FrameTooLarge above the limit)."""
    decode_prefix(header[:PREFIX.size])
    length, digest, mac = REST.unpack(header[PREFIX.size:])
    decoded = FrameHeader(length, digest, mac, header[:-MAC_SIZE])
    if length > max_frame_size:
        raise FrameTooLarge(f'frame of {length} bytes exceeds the limit of {max_frame_size} bytes', decoded)
    return decoded


def decode_payload(payload: bytes, limits: Optional[tuple] = None) -> dict:
    """Decode a msgpack payload into a dict with a str ``type`` or ``status``; ProtocolError otherwise.

    ``limits``: ``(max_objects, max_depth)`` checked before decoding (a request), or None (a reply)."""
    if limits is not None:
        try:
            check_shape(payload, *limits)
        except ValueError as ex:
            raise ProtocolError(str(ex)) from None
    try:
        # strict_map_key: only str/bytes keys; ext types stay inert ExtType objects, never code.
        msg = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True)
    except Exception as ex:  # msgpack raises a family of unrelated types (ExtraData, ValueError, ...)
        raise ProtocolError(f'undecodable payload: {type(ex).__name__}: {ex}') from None
    if not isinstance(msg, dict):
        raise ProtocolError(f'payload is a {type(msg).__name__}, expected a map')
    if not isinstance(msg.get('type', msg.get('status')), str):
        raise ProtocolError('payload map has neither a string "type" nor a string "status"')
    return msg


def _recv_exact(sock: socket.socket, size: int, *, what: str, allow_clean_eof: bool = False,
                deadline: Optional[float] = None, shown: Optional[tuple] = None) -> bytearray:
    # Memory grows with the bytes that arrive, not the length claimed; shown: (offset, total) for the errors.
    offset, total = shown or (0, size)
    buf = bytearray()
    timeout = sock.gettimeout()
    try:
        while len(buf) < size:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError(f'{what} incomplete after the time allowed '
                                        f'({offset + len(buf)} of {total} bytes)')
                sock.settimeout(left if timeout is None else min(left, timeout))
            try:
                chunk = sock.recv(min(size - len(buf), RECV_CHUNK))
            except socket.timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    continue  # the deadline's check above raises
                raise
            if not chunk:
                if not buf and allow_clean_eof:
                    raise PeerClosed('peer closed the connection')
                raise ProtocolError(f'truncated frame: connection closed after {offset + len(buf)} of {total} '
                                    f'{what} bytes')
            buf += chunk
    finally:
        if deadline is not None:
            sock.settimeout(timeout)
    return buf


def recv_header(sock: socket.socket, max_frame_size: int = DEFAULT_MAX_FRAME_BYTES, *,
                deadline: Optional[float] = None) -> FrameHeader:
    """Read and check one frame header (not the MAC). Raises PeerClosed, ProtocolError, OSError."""
    prefix = _recv_exact(sock, PREFIX.size, what='header', allow_clean_eof=True, deadline=deadline,
                         shown=(0, HEADER_SIZE))
    decode_prefix(prefix)
    rest = _recv_exact(sock, REST.size, what='header', deadline=deadline, shown=(PREFIX.size, HEADER_SIZE))
    return decode_header(bytes(prefix + rest), max_frame_size)


def recv_payload_paced(sock: socket.socket, header: FrameHeader, *, min_rate: int, window: float,
                       take: Callable[[int], Any], give: Callable[[int], Any]) -> dict:
    """Read and decode the request payload announced by ``header``.

    At least ``min(min_rate * window, bytes due)`` bytes must arrive every ``window`` s. ``take(n)`` before each read,
    ``give(k)`` for what it did not use; on success ``header.length`` stays taken for the caller. Raises
    ProtocolError, OSError, what ``take`` raises."""
    hasher = hashlib.sha256()
    buf = bytearray()
    length = header.length
    timeout = sock.gettimeout()
    window_end = time.monotonic() + window
    window_from = 0  # bytes received when the current window began
    try:
        while len(buf) < length:
            now = time.monotonic()
            if now >= window_end:
                due = min(min_rate * window, length - window_from)
                if len(buf) - window_from < due:
                    raise ProtocolError(
                        f'payload stalled: {len(buf) - window_from} bytes in the last {window:g} s, below '
                        f'[online.server] payload_min_bytes_per_s = {min_rate} ({len(buf)} of {length} bytes)')
                window_from, window_end = len(buf), now + window
                continue
            sock.settimeout(window_end - now)
            try:
                ready = sock.recv(1, socket.MSG_PEEK)  # wait for data before taking any budget for it
            except socket.timeout:
                continue  # the window's check above decides
            if not ready:
                raise ProtocolError(f'truncated frame: connection closed after {len(buf)} of {length} payload '
                                    'bytes')
            # up to WHOLE_AT_ONCE: the whole payload at once; larger: only what has arrived (trickling holds little)
            size = min(length - len(buf), RECV_CHUNK)
            if length > WHOLE_AT_ONCE:
                size = min(size, _readable(sock) or size)
            started = time.monotonic()
            take(size)
            window_end += time.monotonic() - started  # waiting for the budget is not the sender's fault
            try:
                chunk = sock.recv(size)  # data is there: returns at once
            except BaseException:
                give(size)
                raise
            give(size - len(chunk))  # none when the peer closed meanwhile: the next peek says so
            buf += chunk
            hasher.update(chunk)
            del chunk
    finally:
        sock.settimeout(timeout)
    _check_digest(hasher.digest(), header)
    return decode_payload(buf, request_limits(length))


def _check_digest(digest: bytes, header: FrameHeader) -> None:
    if not hmac.compare_digest(digest, header.digest):
        raise ProtocolError('payload does not match the SHA-256 digest in its header (corrupted in transit?)')


def _readable(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive buffer (FIONREAD), or 0 where that cannot be asked."""
    try:
        import fcntl
        import termios
        return struct.unpack('i', fcntl.ioctl(sock.fileno(), termios.FIONREAD, b'\0\0\0\0'))[0]
    except (ImportError, OSError, AttributeError):
        return 0


def send_msg(sock: socket.socket, msg: dict, token: Optional[str] = None) -> None:
    """Send one message as one frame signed with ``token`` (blocking). OSError on a broken connection."""
    payload = msgpack.packb(msg, use_bin_type=True)
    sock.sendall(encode_header(payload, token))
    sock.sendall(payload)  # two calls: no copy of a large payload just to prepend 78 bytes


def encode_pieces(msg: dict, token: Optional[str] = None) -> list:
    """``encode_frame``'s pieces, the large byte strings not copied (a slow reader holds no parameter copy)."""
    packer = msgpack.Packer(use_bin_type=True)
    pieces = [packer.pack_map_header(len(msg))]
    for key, value in msg.items():
        if isinstance(value, (bytes, bytearray)) and len(value) >= PIECE_BYTES:
            pieces[-1] += packer.pack(key) + b'\xc6' + struct.pack('>I', len(value))  # bin32 header
            pieces.append(value)
            pieces.append(b'')
        else:
            pieces[-1] += packer.pack(key) + packer.pack(value)
    hasher = hashlib.sha256()
    for piece in pieces:
        hasher.update(piece)
    return [_signed_header(sum(map(len, pieces)), hasher.digest(), token)] + [piece for piece in pieces if piece]


def send_paced(sock: socket.socket, pieces: list, *, min_rate: int, window: float) -> None:
    """Send ``pieces`` at ``min_rate`` bytes/s over every ``window`` s, else ProtocolError ('reply stalled')."""
    total = sum(len(piece) for piece in pieces)
    timeout = sock.gettimeout()
    sent = window_from = 0
    window_end = time.monotonic() + window
    try:
        for piece in pieces:
            view = memoryview(piece)
            offset = 0
            while offset < len(view):
                now = time.monotonic()
                if now >= window_end:
                    if sent - window_from < min(min_rate * window, total - window_from):
                        raise ProtocolError(f'reply stalled: the peer took {sent - window_from} bytes in the last '
                                            f'{window:g} s, below [online.server] payload_min_bytes_per_s = '
                                            f'{min_rate} ({sent} of {total} bytes)')
                    window_from, window_end = sent, now + window
                    continue
                sock.settimeout(window_end - now)
                try:
                    n = sock.send(view[offset:offset + RECV_CHUNK])
                except socket.timeout:
                    continue  # the window's check above decides
                offset += n
                sent += n
    finally:
        sock.settimeout(timeout)


def recv_msg(sock: socket.socket, max_frame_size: int = DEFAULT_MAX_FRAME_BYTES, token: Optional[str] = None, *,
             min_bytes_per_s: float = 0) -> dict:
    """Receive one frame's map; with ``token`` the MAC is checked before the payload; ``min_bytes_per_s`` > 0: the
    frame must arrive within the socket's timeout plus its size at that rate. Raises ProtocolError, OSError."""
    limited = min_bytes_per_s > 0
    start, grace = time.monotonic(), sock.gettimeout() or DEFAULT_TIMEOUT
    header = recv_header(sock, max_frame_size, deadline=start + grace if limited else None)
    if not header.authentic(token):
        raise BadMac('bad MAC: the frame was not signed with this token')
    deadline = start + grace + header.length / min_bytes_per_s if limited else None
    payload = _recv_exact(sock, header.length, what=f'payload (due at {min_bytes_per_s:,.0f} B/s)' if limited
                          else 'payload', deadline=deadline)
    _check_digest(hashlib.sha256(payload).digest(), header)
    return decode_payload(payload)


def pack_state_dict(state_dict) -> bytes:
    """A state dict (str -> Tensor) as safetensors bytes (CPU copies), its key order in the metadata."""
    from safetensors.torch import save
    tensors = {k: v.detach().to('cpu').contiguous().clone() for k, v in state_dict.items()}
    return save(tensors, metadata={'keys': json.dumps(list(tensors))})


def unpack_state_dict(data: bytes, device='cpu') -> 'OrderedDict':
    """Parse safetensors bytes into an OrderedDict of tensors on ``device``; ProtocolError when malformed."""
    from safetensors.torch import load
    if not isinstance(data, (bytes, bytearray)):
        raise ProtocolError(f'state dict field is a {type(data).__name__}, expected bytes')
    try:
        tensors = load(bytes(data))
    except Exception as ex:  # SafetensorError and friends: the bytes are not a safetensors file
        raise ProtocolError(f'invalid safetensors state dict: {ex}') from None
    order = _key_order(data, tensors)
    return OrderedDict((k, tensors[k].to(device)) for k in order)


def _key_order(data: bytes, tensors: dict) -> list:
    """The sender's key order from the safetensors metadata, or sorted keys when absent or inconsistent."""
    try:
        (header_len,) = struct.unpack_from('<Q', data)
        header = json.loads(bytes(data[8:8 + header_len]))
        order = json.loads(header.get('__metadata__', {}).get('keys', '[]'))
    except (ValueError, TypeError, AttributeError, RecursionError, struct.error):
        order = []
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(tensors):
        return sorted(tensors)
    return order


@dataclass
class Remote:
    """The server of ``[online.remote]``: ``token`` (None: none), ``timeout`` s, ``max_frame_size`` bytes."""
    host: str = '127.0.0.1'
    port: int = 5000
    token: Optional[str] = None
    timeout: float = DEFAULT_TIMEOUT
    max_frame_size: int = DEFAULT_MAX_FRAME_BYTES
    reply_min_bytes_per_s: float = REPLY_MIN_BYTES_PER_S

    @classmethod
    def from_config(cls, remote, server=None) -> 'Remote':
        """From the typed ``[online.remote]`` and ``[online.server]`` (None on a client machine: schema default)."""
        limits = {} if server is None else {
            'max_frame_size': server.max_frame_bytes,
            'reply_min_bytes_per_s': min(REPLY_MIN_BYTES_PER_S, server.payload_min_bytes_per_s)}
        return cls(host=remote.host, port=remote.port, token=remote.token or None, **limits)

    def request(self, msg: dict) -> dict:
        """Send ``msg`` on a new connection; the reply map. Raises OSError, ProtocolError, RequestRefused.

        With a token and a server off this machine, the reply's MAC must match the token (a server there always has
        one), so nobody on the path can forge a reply; a mismatch is a refusal (a wrong token, or not the server)."""
        with socket.create_connection((self.host, self.port), timeout=self.timeout) as sock:
            try:
                send_msg(sock, msg, self.token)
            except OSError as ex:
                # The server may have answered (e.g. 'unauthorized') and closed early: read that reply if there.
                try:
                    reply = self._reply(sock, msg)
                except (OSError, ProtocolError):
                    raise ex from None
            else:
                try:
                    reply = self._reply(sock, msg)
                except PeerClosed:
                    raise ProtocolError('server closed the connection without a reply') from None
        status = reply.get('status')
        if status in (STATUS_UNAUTHORIZED, STATUS_BAD_REQUEST, STATUS_OTHER_LEARNER):
            raise RequestRefused(f'server refused {msg.get("type")!r}: {status}: {reply.get("reason", "")}')
        return reply

    def _reply(self, sock: socket.socket, msg: dict) -> dict:
        """The reply to ``msg``; RequestRefused when it must carry the token's MAC (``request``) and does not."""
        check = self.token if self.token and not is_loopback(self.host) else None
        try:
            return recv_msg(sock, self.max_frame_size, check, min_bytes_per_s=self.reply_min_bytes_per_s)
        except BadMac:
            raise RequestRefused(f'the reply of {self.host}:{self.port} to {msg.get("type")!r} is not signed with '
                                 'this [online.remote] token: a wrong token, or not the trainer\'s server') from None


def request_with_retry(remote: Remote, msg: dict, *,
                       accept: Callable[[dict], bool] = lambda reply: reply.get('status') == STATUS_OK,
                       on_refusal: Optional[Callable[[dict], None]] = None,
                       sleep: Callable[[float], Any] = time.sleep,
                       on_wait: Optional[Callable[[], None]] = None) -> dict:
    """Send ``msg`` until a reply satisfies ``accept``, ``RETRY_INTERVAL`` s apart; outages and 'error' replies are
    retried (logged once), other refusals go to ``on_refusal`` (without one: logged once per status).
    RequestRefused propagates."""
    outage_logged = False
    error_logged = None
    refusal_logged = None
    while True:
        try:
            reply = remote.request(msg)
        except (OSError, ProtocolError) as ex:
            if not outage_logged:
                logger.warning('server %s:%d unreachable for %r (%s); retrying every %.0f s',
                               remote.host, remote.port, msg.get('type'), ex, RETRY_INTERVAL)
                outage_logged = True
        else:
            if outage_logged:
                logger.info('server %s:%d reachable again', remote.host, remote.port)
                outage_logged = False
            if reply.get('status') == STATUS_ERROR:
                reason = str(reply.get('reason', ''))
                if reason != error_logged:
                    logger.warning('server %s:%d could not handle %r: %s; retrying every %.0f s',
                                   remote.host, remote.port, msg.get('type'), reason, RETRY_INTERVAL)
                    error_logged = reason
            else:
                if error_logged is not None:
                    logger.info('server %s:%d handles %r again', remote.host, remote.port, msg.get('type'))
                    error_logged = None
                if accept(reply):
                    return reply
                if on_refusal is not None:
                    on_refusal(reply)
                elif (status := repr(reply.get('status'))[:100]) != refusal_logged:
                    refusal_logged = status
                    logger.warning('server %s:%d answered %r with status %s; retrying every %.0f s', remote.host,
                                   remote.port, msg.get('type'), status, RETRY_INTERVAL)
        if on_wait is not None:
            on_wait()
        sleep(RETRY_INTERVAL)
