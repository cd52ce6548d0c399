"""The meshbridge process: composition root, CLI, admin HTTP and debug pages, the
gRPC port's guards and limits, logging, GC tuning, and the one list of protocol
layers (`meshbridge.layers`). The protocol-neutral core is `bridge/`, the transport
`h2grpc/`, the protocol layers `linkerd_api/` and `xds_api/`."""

from meshbridge.allocator import use_malloc

use_malloc()  # `meshbridge serve` runs on malloc (see meshbridge/allocator.py)
