"""Wire protocol between server, clients and trainer (safe replacement of Mortal's torch.save framing).

Mortal (``mortal/common.py``) sends a u64 LE length followed by a ``torch.save`` pickle and reads it back with
``torch.load(weights_only=False)``: any peer that can reach the port can run code. This module keeps the message
set and the one-request-per-connection pattern but changes the encoding:

    frame   = header | payload
    header  = MAGIC (4 bytes b'MJRL') | protocol version (u16 LE) | payload length (u64 LE)
              | SHA-256 of the payload (32 bytes) | MAC (32 bytes)
    MAC     = HMAC-SHA256(key = token as UTF-8, or empty without a token, message = the 46 header bytes before it)
    payload = one msgpack map (no ext types are interpreted; nothing executes on decode)
    state dicts travel as ``safetensors`` bytes inside the map (``pack_state_dict`` / ``unpack_state_dict``)

The MAC lets a server with a token refuse a peer after reading 78 header bytes, before it reads (and holds) any
payload; the token itself never travels. The digest then binds the payload to the authenticated header. Replies
are framed the same way (signed with the server's token) but peers do not check their MAC.

Requests (client/trainer -> server):
    {'type': 'get_param', 'param_version': int, 'server_id': str|None}
    {'type': 'submit_replay', 'logs': {name: gz bytes}, 'param_version': int, 'server_id': str|None}
    {'type': 'submit_param', 'mortal': bytes, 'dqn': bytes, 'is_idle': bool, 'arch_change': bool (optional),
     'steps': int, 'epsilon_factor': float, 'temp_factor': float, 'baseline_version': int (optional, all four;
     handed to clients in get_param's 'ok' reply), 'learner': str (optional: the learner's run, printable
     characters only; refused 'another learner is live' while another run's learner, or any learner when this
     field is absent, submitted within the server's liveness window)}
    {'type': 'drain'}
    {'type': 'submit_baseline', 'mortal': bytes, 'dqn': bytes, 'arch': {'version': int, 'conv_channels': int,
     'num_blocks': int}, 'baseline_version': int, 'baseline_digest': str}   (the trainer's [baseline.train])
    {'type': 'get_baseline'}   (a client without that baseline; get_param's 'ok' reply names its digest)
Replies (server -> peer) always carry ``status``: 'ok', 'samples overflow', 'empty param', 'trainer is busy',
'empty baseline' (get_baseline before the trainer submitted one), 'another learner is live' (submit_param;
``reason`` names the live one),
'unauthorized', 'bad request' (retrying cannot help; ``reason`` says why) or 'error' (the server could not do it,
e.g. an unwritable ``buffer_dir``; ``reason`` says why; retrying may help). See ``mortal/server.py`` for the
fields of each 'ok' reply.

Any violation (bad magic, other protocol version, frame above the size limit, truncated frame, payload that does
not match its digest, undecodable payload, payload that is not a map with a string ``type``) raises
``ProtocolError``; the server logs the reason and closes that connection only.
"""

import hashlib
import hmac
import json
import logging
import socket
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import msgpack

from mortal.config_schema import DEFAULT_MAX_FRAME_BYTES, SUPPORTED_VERSIONS

logger = logging.getLogger('mortal.wire')  # the name before the package split (log format)

MAGIC = b'MJRL'
PROTOCOL_VERSION = 2  # 2: header MAC and payload digest (1: magic, version, length only)
PREFIX = struct.Struct('<4sH')  # magic, protocol version: read first, so a peer of another version is told at once
REST = struct.Struct('<Q32s32s')  # payload length, SHA-256 of the payload, HMAC-SHA256 of everything before it
HEADER_SIZE = PREFIX.size + REST.size  # 78 bytes
MAC_SIZE = 32
DEFAULT_MAX_FRAME_SIZE = DEFAULT_MAX_FRAME_BYTES  # largest frame, bytes: [online.server] max_frame_bytes default
DEFAULT_TIMEOUT = 300.0  # seconds of silence on a socket before giving up on the peer
# Seconds a server waits for a whole header: a peer cannot hold an unauthenticated slot byte by byte. A real peer
# sends its 78 bytes right after connecting, so they arrive within a round trip or two.
HEADER_TIMEOUT = 5.0
RECV_CHUNK = 1 << 20
WHOLE_AT_ONCE = 256 * 1024  # a payload up to this size is taken from the server's budget at once, not as it comes
RETRY_INTERVAL = 3.0  # seconds, as Mortal's client loop

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


# submit_param's optional play settings (mortal.train.Trainer.play_settings), handed to clients by get_param,
# and their defaults (Mortal's behaviour).
DEFAULT_PLAY_SETTINGS = {'steps': -1, 'epsilon_factor': 1.0, 'temp_factor': 1.0, 'baseline_version': 0}
MAX_FACTOR = 1e6  # a factor beyond this is a bug of the sender, not a schedule
MIN_TEMP_FACTOR = 1e-6  # below this a Boltzmann softmax over Q overflows in float32


def check_play_settings(msg: dict) -> dict:
    """The play settings of a submit_param request or a get_param reply, defaults for absent ones. Raises
    ValueError naming the field for a wrong type (bools are not numbers), a non-finite or out-of-range factor
    (epsilon_factor in [0, 1e6], temp_factor in [1e-6, 1e6]) or a negative baseline_version."""
    import math
    out = {}
    for key in ('steps', 'baseline_version'):
        value = msg.get(key, DEFAULT_PLAY_SETTINGS[key])
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f'field {key!r} is a {type(value).__name__}, expected an int')
        out[key] = value
    if out['baseline_version'] < 0:
        raise ValueError(f"field 'baseline_version' must be >= 0, got {out['baseline_version']}")
    for key, low in (('epsilon_factor', 0.0), ('temp_factor', MIN_TEMP_FACTOR)):
        value = msg.get(key, DEFAULT_PLAY_SETTINGS[key])
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f'field {key!r} is a {type(value).__name__}, expected a number')
        value = float(value)
        if not math.isfinite(value) or not low <= value <= MAX_FACTOR:
            raise ValueError(f'field {key!r} must be a finite number within [{low:g}, {MAX_FACTOR:g}], '
                             f'got {value!r}')
        out[key] = value
    return out


# A baseline's architecture as it travels (submit_baseline, get_baseline): the checkpoint config entries that
# mortal.model.checkpoint.load_model_pair reads, with their bounds.
BASELINE_ARCH = {'version': (min(SUPPORTED_VERSIONS), max(SUPPORTED_VERSIONS)), 'conv_channels': (1, 4096),
                 'num_blocks': (1, 1024)}
_HEX = frozenset('0123456789abcdef')


def check_baseline_arch(arch) -> dict:
    """The ``arch`` map of a baseline (``BASELINE_ARCH``: ``version``, ``conv_channels``, ``num_blocks``, ints
    within their bounds). Raises ValueError naming the field."""
    if not isinstance(arch, dict):
        raise ValueError(f"field 'arch' is a {type(arch).__name__}, expected a map")
    out = {}
    for key, (low, high) in BASELINE_ARCH.items():
        value = arch.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"field 'arch.{key}' must be an int within [{low}, {high}], got {value!r}")
        out[key] = value
    return out


def check_digest(digest) -> str:
    """A ``baseline_digest``: 64 lowercase hex characters (SHA-256). Raises ValueError otherwise."""
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
        raise ValueError(f"field 'baseline_digest' must be 64 lowercase hex characters, got {digest!r}")
    return digest


def baseline_digest(mortal: dict, dqn: dict) -> str:
    """SHA-256 (hex) of a baseline's weights: for ``mortal`` then ``dqn`` (state dicts, str -> Tensor), each key
    in sorted order with its dtype, shape and bytes. It depends on the values only, not on how they were stored
    (a checkpoint file, safetensors), so a client compares its own file with the trainer's baseline by it."""
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
    """The peer closed the connection before sending any byte of a frame (not an error by itself)."""


class FrameTooLarge(ProtocolError):
    """A well-formed header whose payload length exceeds the receiver's limit; ``header`` is the decoded header
    (so that a server can check its MAC and tell an authentic sender why, instead of just closing)."""

    def __init__(self, message: str, header: 'FrameHeader', limit: int):
        super().__init__(message)
        self.header = header
        self.limit = limit


class RequestRefused(Exception):
    """The server answered with a non-'ok' status that the caller cannot wait out (e.g. 'unauthorized')."""


@dataclass(frozen=True)
class FrameHeader:
    """A decoded frame header: ``length`` (payload bytes), ``digest`` (SHA-256 of the payload), ``mac``, and
    ``signed`` (the 46 bytes the MAC covers)."""
    length: int
    digest: bytes
    mac: bytes
    signed: bytes

    def authentic(self, token: Optional[str]) -> bool:
        """Constant-time check of the MAC against ``token``; True for any header when no token is configured."""
        if not token:
            return True
        return hmac.compare_digest(self.mac, _mac(token, self.signed))


def _mac(token: Optional[str], signed: bytes) -> bytes:
    return hmac.new((token or '').encode(), signed, hashlib.sha256).digest()


def encode_header(payload: bytes, token: Optional[str] = None) -> bytes:
    """The 78-byte header of ``payload``, signed with ``token`` (an empty key when None)."""
    signed = PREFIX.pack(MAGIC, PROTOCOL_VERSION) + struct.pack('<Q32s', len(payload), hashlib.sha256(payload).digest())
    return signed + _mac(token, signed)


def encode_frame(msg: dict, token: Optional[str] = None) -> bytes:
    """Serialize ``msg`` (a dict of msgpack-able values: None/bool/int/float/str/bytes/list/dict) to one frame
    whose header is signed with ``token``.

    Raises TypeError for values msgpack cannot encode (e.g. a tensor: use ``pack_state_dict``).
    """
    payload = msgpack.packb(msg, use_bin_type=True)
    return encode_header(payload, token) + payload


def decode_prefix(prefix: bytes) -> None:
    """Check the first 6 header bytes (magic, protocol version); ProtocolError when invalid."""
    magic, version = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f'bad magic {magic!r} (expected {MAGIC!r}): not a frame of this protocol')
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f'protocol version {version}, this side speaks {PROTOCOL_VERSION}')


def decode_header(header: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> FrameHeader:
    """Check a 78-byte frame header (magic, version, length <= ``max_frame_size`` bytes) and return it decoded;
    ProtocolError when invalid (FrameTooLarge for a length above the limit). The MAC is not checked here
    (``FrameHeader.authentic``)."""
    decode_prefix(header[:PREFIX.size])
    length, digest, mac = REST.unpack(header[PREFIX.size:])
    decoded = FrameHeader(length, digest, mac, header[:-MAC_SIZE])
    if length > max_frame_size:
        raise FrameTooLarge(f'frame of {length} bytes exceeds the limit of {max_frame_size} bytes', decoded,
                            max_frame_size)
    return decoded


# What a request may contain, checked before it is decoded (``request_limits``). Decoding builds one Python object
# per msgpack object, and the smallest of those (an empty list or map: 1 byte) costs about 70 bytes, so a payload of
# tiny objects would cost 70 times its size. A request is a map of scalars, byte strings and small maps (logs,
# arch): a few objects, or one name and one log (hundreds of bytes at least) per submitted log.
REQUEST_MIN_OBJECTS = 1024  # objects any request may hold, however short
REQUEST_BYTES_PER_OBJECT = 256  # beyond them, at least this many payload bytes per object
REQUEST_MAX_DEPTH = 4  # nesting: the request map, the logs map, its entries (and one more level of slack)
_FIXED_SIZES = {0xc0: 0, 0xc2: 0, 0xc3: 0, 0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2,
                0xd2: 4, 0xd3: 8, 0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17}  # bytes after the type byte
_LENGTH_PREFIXED = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4,  # bin, str: size of the length
                    0xc7: 1, 0xc8: 2, 0xc9: 4}  # ext: length, then a type byte
_CONTAINERS = {0xdc: (2, 1), 0xdd: (4, 1), 0xde: (2, 2), 0xdf: (4, 2)}  # array/map 16/32: length size, items each


def request_limits(length: int) -> tuple:
    """``(max_objects, max_depth)`` for a request payload of ``length`` bytes (``check_shape``): at least
    ``REQUEST_MIN_OBJECTS`` objects, one more per ``REQUEST_BYTES_PER_OBJECT`` bytes, so decoding it costs at most
    about ``length`` bytes plus 70 bytes per object: under 1.3 x ``length`` + 72 KiB."""
    return REQUEST_MIN_OBJECTS + length // REQUEST_BYTES_PER_OBJECT, REQUEST_MAX_DEPTH


def check_shape(payload, max_objects: int, max_depth: int) -> int:
    """Walk the msgpack objects of ``payload`` (bytes-like) without building them and return how many there are.

    Raises ProtocolError when there are more than ``max_objects`` (counting every object: containers, their
    items, map keys) or containers nest deeper than ``max_depth``, naming the limit. A malformed payload is
    left to the decoder, which reports it. It costs one step per object, and strings and byte strings are
    skipped over, so a request of a few large fields is checked at once."""
    data = memoryview(payload)
    size = len(data)
    pos = objects = 0
    pending = [1]  # objects still due at each open nesting level
    while pending:
        if not pending[-1]:
            pending.pop()
            continue
        pending[-1] -= 1
        if pos >= size:
            return objects  # truncated: the decoder says so
        objects += 1
        if objects > max_objects:
            raise ProtocolError(f'payload holds more than {max_objects} msgpack objects, the most a request of '
                                f'{size} bytes may hold (a decoding bomb?)')
        kind = data[pos]
        pos += 1
        if kind <= 0x7f or kind >= 0xe0:
            continue  # fixint
        if kind <= 0x9f:  # fixmap, fixarray
            items = (kind & 0x0f) * 2 if kind <= 0x8f else kind & 0x0f
        elif kind <= 0xbf:  # fixstr
            pos += kind & 0x1f
            continue
        elif kind in _FIXED_SIZES:
            pos += _FIXED_SIZES[kind]
            continue
        elif kind in _LENGTH_PREFIXED:
            width = _LENGTH_PREFIXED[kind]
            pos += width + int.from_bytes(data[pos:pos + width], 'big') + (kind in (0xc7, 0xc8, 0xc9))
            continue
        elif kind in _CONTAINERS:
            width, each = _CONTAINERS[kind]
            items = int.from_bytes(data[pos:pos + width], 'big') * each
            pos += width
        else:
            return objects  # 0xc1 (never used): the decoder says so
        if items:
            if len(pending) >= max_depth:
                raise ProtocolError(f'payload nests msgpack containers deeper than {max_depth} levels')
            pending.append(items)
    return objects


def decode_payload(payload: bytes, limits: Optional[tuple] = None) -> dict:
    """Decode a msgpack payload into a dict with a string ``type`` or ``status``; ProtocolError otherwise.

    ``limits``: ``(max_objects, max_depth)`` checked by ``check_shape`` before anything is built (a server
    decoding a request: ``request_limits``); None for none (a peer decoding the server's reply)."""
    if limits is not None:
        check_shape(payload, *limits)
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
                deadline: Optional[float] = None, into: Optional[bytearray] = None, hasher=None,
                shown: Optional[tuple] = None) -> bytes:
    # Memory grows with the bytes that actually arrive, not with the length a peer claims in its header.
    # deadline (time.monotonic()): the whole read must end by then, however slowly the bytes trickle in.
    # shown: (offset, total) of this read within the part named in errors (the header is read in two reads).
    offset, total = shown or (0, size)
    buf = bytearray() if into is None else into
    got = 0
    timeout = sock.gettimeout()
    try:
        while got < size:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError(f'{what} incomplete after the time allowed '
                                        f'({offset + got} of {total} bytes)')
                sock.settimeout(left if timeout is None else min(left, timeout))
            try:
                chunk = sock.recv(min(size - got, RECV_CHUNK))
            except socket.timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise ProtocolError(f'{what} incomplete after the time allowed '
                                        f'({offset + got} of {total} bytes)') from None
                raise
            if not chunk:
                if got == 0 and allow_clean_eof:
                    raise PeerClosed('peer closed the connection')
                raise ProtocolError(f'truncated frame: connection closed after {offset + got} of {total} {what} '
                                    'bytes')
            buf += chunk
            if hasher is not None:
                hasher.update(chunk)
            got += len(chunk)
    finally:
        if deadline is not None:
            sock.settimeout(timeout)
    return bytes(buf) if into is None else buf


def recv_header(sock: socket.socket, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, *,
                deadline: Optional[float] = None) -> FrameHeader:
    """Read and check one frame header (magic and version first, then the rest); the MAC is left to the caller.

    Raises PeerClosed (closed before the first byte), ProtocolError (bad header, truncated, or not complete by
    ``deadline``, a ``time.monotonic()`` value), socket.timeout/OSError from the socket.
    """
    prefix = _recv_exact(sock, PREFIX.size, what='header', allow_clean_eof=True, deadline=deadline,
                         shown=(0, HEADER_SIZE))
    decode_prefix(prefix)
    rest = _recv_exact(sock, REST.size, what='header', deadline=deadline, shown=(PREFIX.size, HEADER_SIZE))
    return decode_header(prefix + rest, max_frame_size)


def recv_payload(sock: socket.socket, header: FrameHeader, *, deadline: Optional[float] = None) -> dict:
    """Read the payload announced by ``header``, check its digest and decode it (``decode_payload``).

    ``deadline`` (a ``time.monotonic()`` value): the whole payload must have arrived by then, however slowly
    its bytes trickle in (None: only the socket's per-recv timeout applies).
    Raises ProtocolError (truncated, not complete by ``deadline``, digest mismatch, undecodable),
    socket.timeout/OSError from the socket.
    """
    hasher = hashlib.sha256()
    payload = _recv_exact(sock, header.length, what='payload', into=bytearray(), hasher=hasher,
                          deadline=deadline)
    if not hmac.compare_digest(hasher.digest(), header.digest):
        raise ProtocolError('payload does not match the SHA-256 digest in its header (corrupted in transit?)')
    return decode_payload(payload)


def recv_payload_paced(sock: socket.socket, header: FrameHeader, *, min_rate: int, window: float,
                       take: Callable[[int], Any], give: Callable[[int], Any]) -> dict:
    """Read the payload announced by ``header`` as ``recv_payload`` does, holding memory only for bytes that came.

    Pace: in every ``window`` seconds at least ``min(min_rate * window, bytes still due)`` bytes must arrive
    (``min_rate`` in bytes/s), checked at each window's end, so a stalled or trickling sender is closed within two
    windows whatever length it declared. Budget: before each read the reader calls ``take(n)`` (n: the whole
    payload up to ``WHOLE_AT_ONCE``, else the bytes already waiting in the socket, up to 1 MiB; it may wait,
    and raises to refuse) and ``give(k)`` for what that read did not use, so a sender that declared a large
    frame and went silent, or trickles, holds only what came. Time spent in ``take`` does not count
    against the pace. On success the whole ``header.length`` is still taken: the caller gives it back once the
    message is handled; on an exception the caller gives back what was taken.
    The payload is a request: ``check_shape`` bounds its objects by ``request_limits`` before it is decoded.
    Raises ProtocolError (stalled, truncated, digest mismatch, too many objects, undecodable), OSError from the
    socket, and
    whatever ``take`` raises.
    """
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
            # A frame of at most WHOLE_AT_ONCE takes it whole at once; a larger one only what has arrived, so that
            # trickling in it holds, and waits for, no more than that.
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
            give(size - len(chunk))
            if not chunk:
                raise ProtocolError(f'truncated frame: connection closed after {len(buf)} of {length} payload '
                                    'bytes')
            buf += chunk
            hasher.update(chunk)
            del chunk
    finally:
        sock.settimeout(timeout)
    if not hmac.compare_digest(hasher.digest(), header.digest):
        raise ProtocolError('payload does not match the SHA-256 digest in its header (corrupted in transit?)')
    return decode_payload(buf, request_limits(length))


def _readable(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive buffer (FIONREAD), or 0 where that cannot be asked."""
    try:
        import fcntl
        import termios
        return struct.unpack('i', fcntl.ioctl(sock.fileno(), termios.FIONREAD, b'\0\0\0\0'))[0]
    except (ImportError, OSError, AttributeError):
        return 0


def discard(sock: socket.socket, size: int, *, deadline: float) -> int:
    """Read and drop up to ``size`` bytes (in a fixed 64 KiB buffer) until the peer stops or ``deadline``
    (``time.monotonic()``) passes; returns the bytes dropped. Never raises for socket errors."""
    buf = bytearray(1 << 16)
    dropped = 0
    try:
        while dropped < size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            n = sock.recv_into(buf, min(len(buf), size - dropped))
            if not n:
                break
            dropped += n
    except OSError:
        pass
    return dropped


def send_msg(sock: socket.socket, msg: dict, token: Optional[str] = None) -> None:
    """Send one message as one frame signed with ``token`` (blocking). OSError on a broken connection."""
    payload = msgpack.packb(msg, use_bin_type=True)
    sock.sendall(encode_header(payload, token))
    sock.sendall(payload)  # two calls: no copy of a large payload just to prepend 78 bytes


# Byte strings of at least this size travel as their own piece (``encode_pieces``): msgpack packs them as bin32.
PIECE_BYTES = 1 << 16


def encode_pieces(msg: dict, token: Optional[str] = None) -> list:
    """``encode_frame(msg, token)`` as a list of pieces whose concatenation is that frame, without copying the
    map's large byte-string values (``PIECE_BYTES`` and over, e.g. served parameters): each is a piece of its own,
    the very object in ``msg``. So a reply that waits on a slow reader holds no copy of the parameters."""
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
    signed = PREFIX.pack(MAGIC, PROTOCOL_VERSION) + struct.pack('<Q32s', sum(map(len, pieces)), hasher.digest())
    return [signed + _mac(token, signed)] + [piece for piece in pieces if piece]


def send_paced(sock: socket.socket, pieces: list, *, min_rate: int, window: float) -> None:
    """Send ``pieces`` (bytes-like, e.g. ``encode_pieces``) in order, at least ``min(min_rate * window, bytes
    still due)`` bytes in every ``window`` seconds (``min_rate`` in bytes/s), so a peer that stops reading is
    given up within two windows instead of holding its connection until the socket timeout.
    Raises ProtocolError ('reply stalled'), OSError from the socket."""
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


def recv_msg(sock: socket.socket, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, token: Optional[str] = None) -> dict:
    """Receive one frame and return its decoded map; with ``token``, its MAC is checked before the payload is read.

    Raises ProtocolError (PeerClosed when the peer closed before the first byte; 'bad MAC' for a header not signed
    with ``token``), socket.timeout/OSError from the socket itself.
    """
    header = recv_header(sock, max_frame_size)
    if not header.authentic(token):
        raise ProtocolError('bad MAC: the frame was not signed with this token')
    return recv_payload(sock, header)


def pack_state_dict(state_dict) -> bytes:
    """Serialize a state dict (str -> Tensor) to safetensors bytes (tensors copied to contiguous CPU memory).

    safetensors stores tensors in its own order; the state dict's key order travels in the metadata.
    """
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


def token_matches(expected: Optional[str], given) -> bool:
    """Constant-time token check; with no token configured every request passes."""
    if not expected:
        return True
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


@dataclass
class Remote:
    """Where the server is and how to talk to it (``[online.remote]``).

    host/port: the server address; token: shared secret sent in every request (None = none);
    timeout: seconds of socket silence before a request fails; max_frame_size: largest reply accepted, bytes.
    """
    host: str = '127.0.0.1'
    port: int = 5000
    token: Optional[str] = None
    timeout: float = DEFAULT_TIMEOUT
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE

    @classmethod
    def from_config(cls, remote, server=None) -> 'Remote':
        """Build from the typed sections (``mortal.config.section``) ``[online.remote]`` (host, port, optional
        token) and ``[online.server]`` (``max_frame_bytes``; its schema default when None, as on a client machine,
        whose file has no such table)."""
        return cls(
            host=remote.host,
            port=remote.port,
            token=remote.token or None,
            max_frame_size=server.max_frame_bytes if server is not None else DEFAULT_MAX_FRAME_SIZE,
        )

    def request(self, msg: dict) -> dict:
        """Open a connection, send ``msg`` in a frame signed with the token, return the reply map.

        Raises OSError (server down, reset, timeout), ProtocolError (bad reply), RequestRefused on 'unauthorized',
        'bad request' or 'another learner is live' (retrying cannot help).
        """
        with socket.create_connection((self.host, self.port), timeout=self.timeout) as sock:
            try:
                send_msg(sock, msg, self.token)
            except OSError as ex:
                # The server may have answered (e.g. 'unauthorized' after the header) and closed before taking
                # the whole payload: read that reply if it is there, else report the send error.
                try:
                    reply = recv_msg(sock, self.max_frame_size)
                except (OSError, ProtocolError):
                    raise ex from None
            else:
                try:
                    reply = recv_msg(sock, self.max_frame_size)
                except PeerClosed:
                    raise ProtocolError('server closed the connection without a reply') from None
        status = reply.get('status')
        if status in (STATUS_UNAUTHORIZED, STATUS_BAD_REQUEST, STATUS_OTHER_LEARNER):
            raise RequestRefused(f'server refused {msg.get("type")!r}: {status}: {reply.get("reason", "")}')
        return reply


def request_with_retry(
    remote: Remote,
    msg: dict,
    *,
    accept: Callable[[dict], bool] = lambda reply: reply.get('status') == STATUS_OK,
    interval: float = RETRY_INTERVAL,
    on_refusal: Optional[Callable[[dict], None]] = None,
    sleep: Callable[[float], Any] = time.sleep,
    on_wait: Optional[Callable[[], None]] = None,
) -> dict:
    """Send ``msg`` until a reply satisfies ``accept``, sleeping ``interval`` seconds between tries.

    A server that is down, restarting, or answers with a broken frame is retried (logged once per outage);
    an 'error' reply (e.g. the server cannot write its buffer_dir) is retried, logged once per distinct reason;
    another refusal (e.g. 'samples overflow') calls ``on_refusal(reply)`` then retries. ``on_wait()`` is called
    before every wait, whatever its cause. RequestRefused propagates.
    """
    outage_logged = False
    error_logged = None
    while True:
        try:
            reply = remote.request(msg)
        except (OSError, ProtocolError) as ex:
            if not outage_logged:
                logger.warning('server %s:%d unreachable for %r (%s); retrying every %.0f s',
                               remote.host, remote.port, msg.get('type'), ex, interval)
                outage_logged = True
            _wait(on_wait, sleep, interval)
            continue
        if outage_logged:
            logger.info('server %s:%d reachable again', remote.host, remote.port)
            outage_logged = False
        if reply.get('status') == STATUS_ERROR:
            reason = str(reply.get('reason', ''))
            if reason != error_logged:
                logger.warning('server %s:%d could not handle %r: %s; retrying every %.0f s',
                               remote.host, remote.port, msg.get('type'), reason, interval)
                error_logged = reason
            _wait(on_wait, sleep, interval)
            continue
        if error_logged is not None:
            logger.info('server %s:%d handles %r again', remote.host, remote.port, msg.get('type'))
            error_logged = None
        if accept(reply):
            return reply
        if on_refusal is not None:
            on_refusal(reply)
        _wait(on_wait, sleep, interval)


def _wait(on_wait, sleep, interval: float) -> None:
    if on_wait is not None:
        on_wait()
    sleep(interval)
