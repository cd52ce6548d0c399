"""Writing a message without awaiting, on whichever gRPC server runs the layer.

The native server (h2grpc) can take a serialized message at once, without a task
switch, while its client keeps up (`ServerCall.write_nowait`); that is what makes a
push to thousands of streams cheap. grpc.aio has no such call. `nowait_writer`
hides the difference: a layer always calls what it returns, and awaits
`context.write` only when that says False.
"""

from __future__ import annotations

from collections.abc import Callable

# (bytes) -> True if the message was queued now; False if the caller must await
# `context.write(message)` instead (the message was not taken).
NowaitWriter = Callable[[bytes], bool]


def _never(message: bytes) -> bool:
    return False


def nowait_writer(context: object) -> NowaitWriter:
    """The call's synchronous write if its server has one, else one that never writes."""
    write: NowaitWriter | None = getattr(context, "write_nowait", None)
    return write if write is not None else _never
