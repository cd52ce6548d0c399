"""Which request header lists are well formed (RFC 9113 §8.2, §8.3).

A malformed request is a stream error PROTOCOL_ERROR (§8.1.1): the stream is reset,
the connection goes on. Checked here, once, so that nothing past the transport sees
a name with capitals, a connection-specific header, or a pseudo-header out of place.
"""

from __future__ import annotations

from dataclasses import dataclass

# §8.3.1: the request pseudo-headers; anything else starting with ':' is malformed.
REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path"})
# §8.2.2: hop-by-hop headers have no place in HTTP/2.
CONNECTION_SPECIFIC = frozenset({b"connection", b"proxy-connection", b"keep-alive",
                                 b"transfer-encoding", b"upgrade"})
# RFC 9110 §5.6.2 token characters, lowercase only (§8.2.1: names are lowercase).
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")
_BAD_VALUE = frozenset(b"\x00\r\n")
_EDGE_WHITESPACE = frozenset(b" \t")


class MalformedHeaders(Exception):
    """A header list that breaks RFC 9113 §8.2-8.3: reset the stream with PROTOCOL_ERROR."""


@dataclass(frozen=True, slots=True)
class Request:
    method: bytes
    path: bytes
    authority: bytes
    fields: list[tuple[bytes, bytes]]  # the regular fields, in order
    content_length: int | None


def parse_request(headers: list[tuple[bytes, bytes]]) -> Request:
    pseudo: dict[bytes, bytes] = {}
    regular: list[tuple[bytes, bytes]] = []
    content_length: int | None = None
    for name, value in headers:
        _check_value(name, value)
        if name[:1] == b":":
            if regular:
                raise MalformedHeaders(f"pseudo-header {name!r} after a regular field")
            if name not in REQUEST_PSEUDO:
                raise MalformedHeaders(f"pseudo-header {name!r} is not a request's")
            if name in pseudo:
                raise MalformedHeaders(f"pseudo-header {name!r} twice")
            pseudo[name] = value
            continue
        _check_name(name)
        if name == b"te" and value != b"trailers":
            raise MalformedHeaders("te other than 'trailers'")
        if name == b"content-length":
            if not value.isdigit() or content_length is not None:
                raise MalformedHeaders("bad content-length")
            content_length = int(value)
        regular.append((name, value))
    method = pseudo.get(b":method", b"")
    if not method:
        raise MalformedHeaders("no :method")
    if method == b"CONNECT":  # §8.5: only :method and :authority
        if b":scheme" in pseudo or b":path" in pseudo or b":authority" not in pseudo:
            raise MalformedHeaders("CONNECT with :scheme or :path, or without :authority")
    elif not pseudo.get(b":scheme") or not pseudo.get(b":path"):
        raise MalformedHeaders("no :scheme or empty :path")
    return Request(method, pseudo.get(b":path", b""), pseudo.get(b":authority", b""),
                   regular, content_length)


def check_trailers(headers: list[tuple[bytes, bytes]]) -> None:
    """Trailers carry no pseudo-headers (§8.1) and follow the field rules."""
    for name, value in headers:
        _check_value(name, value)
        if name[:1] == b":":
            raise MalformedHeaders(f"pseudo-header {name!r} in trailers")
        _check_name(name)


def _check_name(name: bytes) -> None:
    if not name:
        raise MalformedHeaders("empty field name")
    if not _TOKEN.issuperset(name):
        raise MalformedHeaders(f"field name {name[:40]!r} is not a lowercase token")
    if name in CONNECTION_SPECIFIC:
        raise MalformedHeaders(f"connection-specific field {name!r}")


def _check_value(name: bytes, value: bytes) -> None:
    if value and (_BAD_VALUE.intersection(value) or value[0] in _EDGE_WHITESPACE
                  or value[-1] in _EDGE_WHITESPACE):
        raise MalformedHeaders(f"field {name[:40]!r} has a forbidden character in its value")
