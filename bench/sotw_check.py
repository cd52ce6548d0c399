"""What a load client makes of each SotW response on one resource type: whether it
says what change `n` must say, and the ACK to send for it, at a cost per message
well below the server's (the benchmarks measure the server, on the same cores).

The first response of each change is decoded in full and checked by the caller's
`check`; every other stream's response of that change must then be the same bytes
up to its nonce (version, resources and type URL: a DiscoveryResponse's fields 1-4,
which protobuf writes in field order before the nonce, field 5). The ACK is
prebuilt per change (type, names, the version) and only the nonce is appended, as
read from the wire: a DiscoveryResponse's `nonce` and a DiscoveryRequest's
`response_nonce` are both field 5, so the field is copied as it stands. A response
that differs from the known bytes is decoded and checked in full again, so every
message is checked: a wrong one is counted wrong, never taken for right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Field 5, length-delimited: a response's nonce, and an ACK's response_nonce too.
NONCE_TAG = 5 << 3 | 2

Check = Callable[[int, Any], bool]  # (change n, the decoded DiscoveryResponse) -> right?


class SotwReader:
    """Checks and ACKs the SotW responses of one type URL and name list (see the
    module)."""

    def __init__(self, type_url: str, names: list[str], check: Check) -> None:
        from envoy.service.discovery.v3 import discovery_pb2

        self.type_url = type_url
        self.names = names
        self.check = check
        self._response = discovery_pb2.DiscoveryResponse
        self._request = discovery_pb2.DiscoveryRequest
        # Per change n: the bytes every right response has before its nonce, and the
        # ACK's bytes before its nonce.
        self._known: dict[int, tuple[bytes, bytes]] = {}
        self.decoded = 0  # responses decoded in full (the rest compared by bytes)

    def read(self, n: int, raw: bytes) -> tuple[bool, bytes]:
        """(says change n, the ACK to send)."""
        known = self._known.get(n)
        if known is not None:
            prefix, ack_head = known
            at = len(prefix)
            if raw.startswith(prefix) and len(raw) > at + 1 and raw[at] == NONCE_TAG \
                    and raw[at + 1] < 0x80:
                return True, ack_head + raw[at:at + 2 + raw[at + 1]]
        return self._read_in_full(n, raw)

    def _read_in_full(self, n: int, raw: bytes) -> tuple[bool, bytes]:
        from google.protobuf.message import DecodeError

        from xds_api import wire

        self.decoded += 1
        try:
            message = self._response.FromString(raw)
        except DecodeError:
            return False, b""
        ack = self._request(type_url=self.type_url, resource_names=self.names,
                            version_info=message.version_info)
        ack_head = ack.SerializeToString()
        ack.response_nonce = message.nonce
        ok = message.type_url == self.type_url and self.check(n, message)
        nonce_at = raw.rfind(wire.string_field(5, message.nonce))
        if ok and nonce_at > 0 and n not in self._known:
            self._known[n] = (raw[:nonce_at], ack_head)
        return ok, ack.SerializeToString()
