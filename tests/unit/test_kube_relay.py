"""What the relay (bridge/sources/kube_relay.py) holds for the server process: body
pieces joined up to a MiB, the end not joined. The relay as a process, and against a
real API server: tests/integration/test_kube_relay.py."""

from __future__ import annotations

from bridge.sources import kube_relay
from bridge.sources.kube_relay import PIECE


def test_body_pieces_are_joined_up_to_a_piece_and_the_end_is_not() -> None:
    pending = kube_relay._Pending()
    pending.put(b"H", b"{}")
    for part in (b"a" * 100, b"b" * 100, b"c" * (PIECE - 150), b"d"):
        pending.put(b"D", part)
    pending.put(b"Z", b"")
    assert pending.take() == (b"H", b"{}")
    assert pending.take() == (b"D", b"a" * 100 + b"b" * 100)  # the next would pass PIECE
    assert pending.take() == (b"D", b"c" * (PIECE - 150) + b"d")
    assert pending.take() == (b"Z", b"")
    assert pending.size == 0
