"""Protobuf wire encoding, just enough to assemble messages from bytes already encoded.

A protobuf message's encoding is the concatenation of its fields' encodings, and a
repeated embedded message is simply the same field repeated. So a DiscoveryResponse
for one stream is the shared, once-serialized resources plus a few bytes of its own
(version, type, nonce); a ClusterLoadAssignment is its endpoints' cached encodings
grouped by locality. Field numbers are read from the generated descriptors, never
typed by hand, so a mistake here cannot silently produce a different message.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor

_LEN = 2  # wire type: length-delimited
_VARINT = 0


# Every one-byte varint, encoded: tags, and the lengths of versions and nonces, are
# nearly always one byte, and this runs several times per response per stream.
_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))


def varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        raise ValueError("negative varint")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_number(descriptor: Descriptor, name: str) -> int:
    return int(descriptor.fields_by_name[name].number)


def length_delimited(number: int, payload: bytes) -> bytes:
    """One length-delimited field: an embedded message, bytes or a string."""
    return varint(number << 3 | _LEN) + varint(len(payload)) + payload


def length_delimited_prefix(number: int, size: int) -> bytes:
    """The tag and length of a length-delimited field whose payload follows."""
    return varint(number << 3 | _LEN) + varint(size)


def string_field(number: int, text: str) -> bytes:
    """A proto3 string field; the empty string is the default and is not encoded."""
    if not text:
        return b""
    data = text.encode()
    if number < 16 and len(data) < 0x80:  # one-byte tag and length: the usual case
        return _ONE_BYTE[number << 3 | _LEN] + _ONE_BYTE[len(data)] + data
    return length_delimited(number, data)


def uint_field(number: int, value: int) -> bytes:
    """A proto3 scalar varint field; zero is the default and is not encoded."""
    return varint(number << 3 | _VARINT) + varint(value) if value else b""
