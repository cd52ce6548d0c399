"""A proxyless gRPC client in its own process (the xDS bootstrap is per process).

    GRPC_XDS_BOOTSTRAP_CONFIG=... python grpc_xds_probe.py xds:///<authority>

Reads `call N [METHOD [KEY=VALUE...]]` lines on stdin; for each, makes N unary calls
(to /meshbridge.test.Echo/<METHOD>, `Who` by default, with the given metadata) and
prints one JSON line: which backend answered how many times, and the status codes of
the calls that failed.
"""

from __future__ import annotations

import json
import sys

import grpc

METHOD = "/meshbridge.test.Echo/Who"


def main() -> int:
    target = sys.argv[1]
    with grpc.insecure_channel(target) as channel:
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] != "call":
                print(json.dumps({"error": f"unknown command {line!r}"}), flush=True)
                continue
            method = METHOD.rsplit("/", 1)[0] + "/" + (words[2] if len(words) > 2 else "Who")
            metadata = [tuple(w.split("=", 1)) for w in words[3:]]
            call = channel.unary_unary(method)
            backends: dict[str, int] = {}
            errors: dict[str, int] = {}
            for _ in range(int(words[1])):
                try:
                    name = call(b"", timeout=60, wait_for_ready=True,  # a hang guard, not a budget
                                metadata=metadata or None).decode()
                    backends[name] = backends.get(name, 0) + 1
                except grpc.RpcError as e:
                    code = e.code().name
                    errors[code] = errors.get(code, 0) + 1
            print(json.dumps({"backends": backends, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
