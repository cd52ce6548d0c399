"""HTTP/2 framing (RFC 9113 §4, §6) and the few HPACK literals a gRPC server sends.

Only what a gRPC server needs: frame headers, the frames it writes, and header blocks
built from literal fields that never touch the dynamic table (RFC 7541 §6.2.2), so
that encoding needs no per-connection state. Request header blocks are decoded by
the `hpack` package (the client may use the dynamic table and Huffman coding).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (§6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS identifiers (§6.5.2).
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

# Error codes (§7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

# length (24 bits, as a byte and a short), type, flags, stream id.
HEADER = struct.Struct(">BHBBI")  # a frame header: length (3 bytes), type, flags, id
# gRPC's message prefix: compressed flag, length.
GRPC_PREFIX = struct.Struct(">BI")


class FrameSizeError(Exception):
    """A frame longer than the reader accepts (§4.2)."""


def frames_in(buf: bytearray, max_length: int) -> Iterator[tuple[int, int, int, bytes, int]]:
    """The complete frames at the start of `buf`, in order, as (type, flags, stream id,
    payload, offset just past the frame); the caller removes what it has consumed."""
    offset, size = 0, len(buf)
    unpack = HEADER.unpack_from  # the 9 header bytes in one call
    while size - offset >= 9:
        high, low, kind, flags, stream_id = unpack(buf, offset)
        length = (high << 16) | low
        if length > max_length:
            raise FrameSizeError(f"frame of {length} bytes")
        end = offset + 9 + length
        if end > size:
            return
        yield kind, flags, stream_id & 0x7FFFFFFF, bytes(buf[offset + 9:end]), end
        offset = end


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return HEADER.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id)


def settings_frame(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in values.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


# ---------------------------------------------------------------------- HPACK out


def integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 §5.1 integer with an N-bit prefix; `first` holds the bits above it."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A literal field without indexing, with a literal name (RFC 7541 §6.2.2), no Huffman."""
    return (b"\x00" + integer(len(name), 7) + name + integer(len(value), 7) + value)


STATUS_200 = b"\x88"  # static table entry 8 (:status 200), indexed
RESPONSE_HEADERS = STATUS_200 + literal(b"content-type", b"application/grpc")


def grpc_message_text(details: str) -> bytes:
    """grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2, "Responses")."""
    out = bytearray()
    for b in details.encode("utf-8", "replace"):
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


def trailers_block(code: int, details: str, headers_sent: bool) -> bytes:
    """The closing header block; a trailers-only response also carries the headers."""
    block = b"" if headers_sent else RESPONSE_HEADERS
    block += literal(b"grpc-status", str(code).encode())
    if details:
        block += literal(b"grpc-message", grpc_message_text(details))
    return block
