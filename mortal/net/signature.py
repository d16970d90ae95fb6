"""State-dict signatures (key names, dtypes, shapes) read from a safetensors header only, and how two differ."""

import json
import struct
from collections import OrderedDict
from typing import Optional

from mortal.net.wire import ProtocolError, _key_order

MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # bytes; safetensors' own limit


def state_dict_signature(data) -> 'OrderedDict':
    """``{key: (dtype, shape)}`` of a safetensors state dict from its header (dtype e.g. 'F32'), in key order.

    Raises ProtocolError when ``data`` is not bytes or its header is malformed."""
    if not isinstance(data, (bytes, bytearray)):
        raise ProtocolError(f'state dict field is a {type(data).__name__}, expected bytes')
    try:
        (header_len,) = struct.unpack_from('<Q', data)
        if header_len > min(len(data) - 8, MAX_SAFETENSORS_HEADER):
            raise ValueError(f'header of {header_len} bytes in {len(data)} bytes')
        header = json.loads(bytes(data[8:8 + header_len]))
        if not isinstance(header, dict):
            raise ValueError('header is not a JSON object')
        sig = {}
        for key, info in header.items():
            if key == '__metadata__':
                continue
            dtype, shape = info['dtype'], info['shape']
            if not isinstance(dtype, str) or not isinstance(shape, list) or \
                    not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
                raise ValueError(f'bad dtype/shape for {key!r}')
            sig[key] = (dtype, tuple(shape))
    except (ValueError, TypeError, KeyError, RecursionError, struct.error) as ex:
        raise ProtocolError(f'invalid safetensors state dict: {ex}') from None
    return OrderedDict((k, sig[k]) for k in _key_order(data, sig))


def signature_difference(expected: dict, got: dict) -> Optional[str]:
    """None when two signatures agree, else a sentence naming the first differing key with both."""
    def fmt(entry):
        return f'{entry[0]} {list(entry[1])}'
    for key, want in expected.items():
        if key not in got:
            return f'key {key!r} is missing (expected {fmt(want)})'
        if got[key] != want:
            return f'key {key!r} is {fmt(got[key])}, expected {fmt(want)}'
    for key in got:
        if key not in expected:
            return f'unexpected key {key!r} ({fmt(got[key])})'
    return None
