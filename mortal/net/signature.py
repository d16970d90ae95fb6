"""State-dict signatures: the key names, dtypes and shapes of a safetensors state dict, read from its JSON
header only (no tensor is built), and the sentence naming how two signatures differ. The server checks every
``submit_param`` against the first one it accepted, and a ``submit_baseline`` for an empty state dict, this way.
"""

import json
import struct
from collections import OrderedDict
from typing import Optional

from mortal.net.wire import ProtocolError, _key_order

MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # bytes; safetensors' own limit


def state_dict_signature(data) -> 'OrderedDict':
    """``{key: (dtype, shape)}`` of a safetensors state dict, read from its JSON header only (no tensor is built;
    dtype is safetensors' name such as 'F32', shape a tuple of ints), in the sender's key order.

    Raises ProtocolError when ``data`` is not bytes or its header is malformed.
    """
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
    """None when two ``state_dict_signature`` results agree, else a sentence naming the first differing key
    (in ``expected``'s order, then keys only ``got`` has) with both dtypes/shapes."""
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
