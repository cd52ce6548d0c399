"""A proxyless gRPC client in its own process (the xDS bootstrap is per process).

    GRPC_XDS_BOOTSTRAP_CONFIG=... python grpc_xds_probe.py xds:///<authority>

Reads `call N [METHOD [KEY=VALUE...]]` lines on stdin; for each, makes N unary calls
(to /meshbridge.test.Echo/<METHOD>, `Who` by default, with the given metadata) and
prints one JSON line: which backend answered how many times, and the status codes of
the calls that failed. `timed` instead of `call` adds the slowest call's seconds.
"""

from __future__ import annotations

import json
import sys
import time

import grpc

METHOD = "/meshbridge.test.Echo/Who"
# Each call's own deadline: a guard against a hang, not a budget (a call waits for the
# client's xDS resources, which a loaded machine can take seconds to deliver).
APP_TIMEOUT_S = 60


def main() -> int:
    target = sys.argv[1]
    with grpc.insecure_channel(target) as channel:
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] not in ("call", "timed"):
                print(json.dumps({"error": f"unknown command {line!r}"}), flush=True)
                continue
            method = METHOD.rsplit("/", 1)[0] + "/" + (words[2] if len(words) > 2 else "Who")
            metadata = [tuple(w.split("=", 1)) for w in words[3:]]
            call = channel.unary_unary(method)
            backends: dict[str, int] = {}
            errors: dict[str, int] = {}
            slowest = 0.0
            for _ in range(int(words[1])):
                started = time.monotonic()
                try:
                    name = call(b"", timeout=APP_TIMEOUT_S, wait_for_ready=True,
                                metadata=metadata or None).decode()
                    backends[name] = backends.get(name, 0) + 1
                except grpc.RpcError as e:
                    code = e.code().name
                    errors[code] = errors.get(code, 0) + 1
                slowest = max(slowest, time.monotonic() - started)
            out: dict[str, object] = {"backends": backends, "errors": errors}
            if words[0] == "timed":
                out["seconds"] = round(slowest, 3)
            print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
