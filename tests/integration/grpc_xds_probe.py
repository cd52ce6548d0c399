"""A proxyless gRPC client in its own process (the xDS bootstrap is per process).

    GRPC_XDS_BOOTSTRAP_CONFIG=... python grpc_xds_probe.py xds:///<authority>

Reads `call N` lines on stdin; for each, makes N unary calls to
/meshbridge.test.Echo/Who and prints one JSON line: which backend answered how many
times, and the status codes of the calls that failed.
"""

from __future__ import annotations

import json
import sys

import grpc

METHOD = "/meshbridge.test.Echo/Who"


def main() -> int:
    target = sys.argv[1]
    with grpc.insecure_channel(target) as channel:
        who = channel.unary_unary(METHOD)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] != "call":
                print(json.dumps({"error": f"unknown command {line!r}"}), flush=True)
                continue
            backends: dict[str, int] = {}
            errors: dict[str, int] = {}
            for _ in range(int(words[1])):
                try:
                    name = who(b"", timeout=10, wait_for_ready=True).decode()
                    backends[name] = backends.get(name, 0) + 1
                except grpc.RpcError as e:
                    code = e.code().name
                    errors[code] = errors.get(code, 0) + 1
            print(json.dumps({"backends": backends, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
