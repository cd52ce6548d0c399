"""meshbridge's own gRPC server: gRPC over HTTP/2 on asyncio (see server.py)."""
