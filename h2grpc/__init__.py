"""meshbridge's own gRPC server: gRPC over HTTP/2 on asyncio (see server.py).

A bare `§N` in this package is a section of RFC 9113 as docs/protocol/http2.md
restates it; HPACK (RFC 7541) and RFC 9110 sections carry their RFC's name.
"""
