"""Wire protocol between server, clients and trainer (safe replacement of Mortal's torch.save framing).

Mortal (``mortal/common.py``) sends a u64 LE length followed by a ``torch.save`` pickle and reads it back with
``torch.load(weights_only=False)``: any peer that can reach the port can run code. This module keeps the message
set and the one-request-per-connection pattern but changes the encoding:

    frame   = MAGIC (4 bytes b'MJRL') | protocol version (u16 LE) | payload length (u64 LE) | payload
    payload = one msgpack map (no ext types are interpreted; nothing executes on decode)
    state dicts travel as ``safetensors`` bytes inside the map (``pack_state_dict`` / ``unpack_state_dict``)

Requests (client/trainer -> server; each may carry ``token``):
    {'type': 'get_param', 'param_version': int, 'server_id': str|None}
    {'type': 'submit_replay', 'logs': {name: gz bytes}, 'param_version': int, 'server_id': str|None}
    {'type': 'submit_param', 'mortal': bytes, 'dqn': bytes, 'is_idle': bool}
    {'type': 'drain'}
Replies (server -> peer) always carry ``status``: 'ok', 'samples overflow', 'empty param', 'trainer is busy',
'unauthorized' or 'bad request'. See ``mortal/server.py`` for the fields of each 'ok' reply.

Any violation (bad magic, other protocol version, frame above the size limit, truncated frame, undecodable
payload, payload that is not a map with a string ``type``) raises ``ProtocolError``; the server logs the reason and
closes that connection only.
"""

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

logger = logging.getLogger(__name__)

MAGIC = b'MJRL'
PROTOCOL_VERSION = 1
HEADER = struct.Struct('<4sHQ')  # magic, protocol version, payload length
# A 40-block, 192-channel Brain is ~ 40 MB as float32 and 800 gz logs are ~ 40 MB; 512 MiB leaves ample room
# (same default as [online.server] max_frame_bytes in mortal/config.py).
DEFAULT_MAX_FRAME_SIZE = 512 * 1024 * 1024
DEFAULT_TIMEOUT = 300.0  # seconds of silence on a socket before giving up on the peer
RECV_CHUNK = 1 << 20
RETRY_INTERVAL = 3.0  # seconds, as Mortal's client loop

REQUEST_TYPES = ('get_param', 'submit_replay', 'submit_param', 'drain')
# Status strings are Mortal's where Mortal has them.
STATUS_OK = 'ok'
STATUS_OVERFLOW = 'samples overflow'
STATUS_EMPTY_PARAM = 'empty param'
STATUS_BUSY = 'trainer is busy'
STATUS_UNAUTHORIZED = 'unauthorized'
STATUS_BAD_REQUEST = 'bad request'


class ProtocolError(Exception):
    """A peer sent something that is not a valid frame of this protocol; the connection must be closed."""


class PeerClosed(ProtocolError):
    """The peer closed the connection before sending any byte of a frame (not an error by itself)."""


class RequestRefused(Exception):
    """The server answered with a non-'ok' status that the caller cannot wait out (e.g. 'unauthorized')."""


def encode_frame(msg: dict) -> bytes:
    """Serialize ``msg`` (a dict of msgpack-able values: None/bool/int/float/str/bytes/list/dict) to one frame.

    Raises TypeError for values msgpack cannot encode (e.g. a tensor: use ``pack_state_dict``).
    """
    payload = msgpack.packb(msg, use_bin_type=True)
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, len(payload)) + payload


def decode_header(header: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> int:
    """Check a 14-byte frame header and return the payload length in bytes; ProtocolError when invalid."""
    magic, version, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f'bad magic {magic!r} (expected {MAGIC!r}): not a frame of this protocol')
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f'protocol version {version}, this side speaks {PROTOCOL_VERSION}')
    if length > max_frame_size:
        raise ProtocolError(f'frame of {length} bytes exceeds the limit of {max_frame_size} bytes')
    return length


def decode_payload(payload: bytes) -> dict:
    """Decode a msgpack payload into a dict with a string ``type`` or ``status``; ProtocolError otherwise."""
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


def _recv_exact(sock: socket.socket, size: int, *, what: str, allow_clean_eof: bool = False) -> bytes:
    # Memory grows with the bytes that actually arrive, not with the length a peer claims in its header.
    chunks = []
    got = 0
    while got < size:
        chunk = sock.recv(min(size - got, RECV_CHUNK))
        if not chunk:
            if got == 0 and allow_clean_eof:
                raise PeerClosed('peer closed the connection')
            raise ProtocolError(f'truncated frame: connection closed after {got} of {size} {what} bytes')
        chunks.append(chunk)
        got += len(chunk)
    return b''.join(chunks)


def send_msg(sock: socket.socket, msg: dict) -> None:
    """Send one message as one frame (blocking). OSError on a broken connection."""
    sock.sendall(encode_frame(msg))


def recv_msg(sock: socket.socket, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> dict:
    """Receive one frame and return its decoded map.

    Raises ProtocolError (PeerClosed when the peer closed before the first byte), socket.timeout/OSError from the
    socket itself.
    """
    header = _recv_exact(sock, HEADER.size, what='header', allow_clean_eof=True)
    length = decode_header(header, max_frame_size)
    payload = _recv_exact(sock, length, what='payload')
    return decode_payload(payload)


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
    except (ValueError, TypeError, AttributeError, struct.error):
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
    def from_config(cls, config: dict) -> 'Remote':
        """Build from ``[online.remote]`` host, port, optional token and ``[online.server] max_frame_bytes``."""
        cfg = config['online']['remote']
        server_cfg = config['online'].get('server') or {}
        return cls(
            host=cfg['host'],
            port=int(cfg['port']),
            token=cfg.get('token') or None,
            max_frame_size=int(server_cfg.get('max_frame_bytes', DEFAULT_MAX_FRAME_SIZE)),
        )

    def request(self, msg: dict) -> dict:
        """Open a connection, send ``msg`` (plus the token), return the reply map.

        Raises OSError (server down, reset, timeout), ProtocolError (bad reply), RequestRefused on 'unauthorized'
        or 'bad request' (retrying cannot help).
        """
        if self.token:
            msg = {**msg, 'token': self.token}
        with socket.create_connection((self.host, self.port), timeout=self.timeout) as sock:
            send_msg(sock, msg)
            try:
                reply = recv_msg(sock, self.max_frame_size)
            except PeerClosed:
                raise ProtocolError('server closed the connection without a reply') from None
        status = reply.get('status')
        if status in (STATUS_UNAUTHORIZED, STATUS_BAD_REQUEST):
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
) -> dict:
    """Send ``msg`` until a reply satisfies ``accept``, sleeping ``interval`` seconds between tries.

    A server that is down, restarting, or answers with a broken frame is retried (logged once per outage);
    a refusal (e.g. 'samples overflow') calls ``on_refusal(reply)`` then retries. RequestRefused propagates.
    """
    outage_logged = False
    while True:
        try:
            reply = remote.request(msg)
        except (OSError, ProtocolError) as ex:
            if not outage_logged:
                logger.warning('server %s:%d unreachable for %r (%s); retrying every %.0f s',
                               remote.host, remote.port, msg.get('type'), ex, interval)
                outage_logged = True
            sleep(interval)
            continue
        if outage_logged:
            logger.info('server %s:%d reachable again', remote.host, remote.port)
            outage_logged = False
        if accept(reply):
            return reply
        if on_refusal is not None:
            on_refusal(reply)
        sleep(interval)
