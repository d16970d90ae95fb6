"""Bounds on a msgpack request checked before it is decoded: a payload of tiny objects must not cost 70 times its
size in Python objects (``mortal.net.wire.decode_payload``)."""

# Decoding builds one Python object (~70 bytes) per msgpack object, even a 1-byte one; a request holds a few
# objects, or a name and a log (hundreds of bytes) per submitted log, so bound the count by the size.
REQUEST_MIN_OBJECTS = 1024  # objects any request may hold, however short
REQUEST_BYTES_PER_OBJECT = 256  # beyond them, at least this many payload bytes per object
REQUEST_MAX_DEPTH = 4  # nesting: the request map, the logs map, its entries (and one more level of slack)
_FIXED_SIZES = {0xc0: 0, 0xc2: 0, 0xc3: 0, 0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2,
                0xd2: 4, 0xd3: 8, 0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17}  # bytes after the type byte
_LENGTH_PREFIXED = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4,  # bin, str: size of the length
                    0xc7: 1, 0xc8: 2, 0xc9: 4}  # ext: length, then a type byte
_CONTAINERS = {0xdc: (2, 1), 0xdd: (4, 1), 0xde: (2, 2), 0xdf: (4, 2)}  # array/map 16/32: length size, items each


def request_limits(length: int) -> tuple:
    """``(max_objects, max_depth)`` for ``length`` request bytes: decoding costs < 1.3 x ``length`` + 72 KiB."""
    return REQUEST_MIN_OBJECTS + length // REQUEST_BYTES_PER_OBJECT, REQUEST_MAX_DEPTH


def check_shape(payload, max_objects: int, max_depth: int) -> int:
    """Count the msgpack objects of ``payload`` without building them (strings skipped over).

    Raises ValueError, naming the limit, above ``max_objects`` or ``max_depth``; malformed payloads are left to the
    decoder."""
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
            raise ValueError(f'payload holds more than {max_objects} msgpack objects, the most a request of '
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
                raise ValueError(f'payload nests msgpack containers deeper than {max_depth} levels')
            pending.append(items)
    return objects
