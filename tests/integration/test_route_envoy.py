"""What a route says, seen by an application behind a real Envoy (the
docs/proxies/envoy.md bootstrap) in front of real HTTP servers on loopback: matches
reach their backends, a timeout answers 504, a retry turns a first 503 into a 200, a
redirect and header changes reach the client, an unmatched request is a 404 and a
missing backend's share a 500 (Routes §1-3, xDS §4.6).

`web` is a server on 127.0.0.2 and `web-v2` one on 127.0.0.3. Each answers with its
address, the path and the `x-added` header it received; `/slow...` is answered only
when the servers close (so the rule's 300 ms is the only way it can end), and
`/flaky...` answers 503 to every other request."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
from pathlib import Path
from typing import Any

import pytest

from meshbridge.app import App
from testkit.polling import HANG, eventually
from tests.conftest import AppFactory
from tests.integration.test_proxy_docs import outbound_envoy
from tests.integration.test_route_canary import NS
from tests.integration.xds_helpers import Manifests, service_with_addresses

WEB_IP, V2_IP = "127.0.0.2", "127.0.0.3"


class Backends:
    """One small HTTP/1.1 server per address, on one port, counting what it got."""

    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []
        self.port = 0
        self.flaky = 0
        self.closing = asyncio.Event()  # what a /slow request waits for

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      ip: str) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (ln.partition(":") for ln in lines[1:] if ln)}
                status = "200 OK"
                if path.startswith("/slow"):
                    await self.closing.wait()
                if path.startswith("/flaky"):
                    self.flaky += 1
                    if self.flaky % 2:
                        status = "503 Service Unavailable"
                body = f"{ip} {path} x-added={headers.get('x-added', '')}".encode()
                writer.write(b"HTTP/1.1 %s\r\ncontent-length: %d\r\n\r\n%s"
                             % (status.encode(), len(body), body))
                await writer.drain()
        writer.close()

    async def start(self) -> None:
        for _ in range(10):
            try:
                for ip in (WEB_IP, V2_IP):
                    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter,
                                     ip: str = ip) -> None:
                        await self._answer(r, w, ip)
                    server = await asyncio.start_server(answer, ip, self.port)
                    self.port = server.sockets[0].getsockname()[1]
                    self.servers.append(server)
                return
            except OSError:
                self.close()
                self.closing.clear()  # the next attempt's servers are open
                self.port = 0
        raise RuntimeError("no port free on both addresses")

    def close(self) -> None:
        self.closing.set()
        for s in self.servers:
            s.close()
        self.servers = []


def rule(path: str, *backends: str, **extra: Any) -> dict[str, Any]:
    return {"matches": [{"path": {"type": "PathPrefix", "value": path}}],
            "backendRefs": [{"name": b, "port": 80} for b in backends], **extra}


ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
    "metadata": {"name": "web-routes", "namespace": NS},
    "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web", "port": 80}],
             "rules": [
                 {"matches": [{"headers": [{"name": "x-version", "value": "v2"}]}],
                  "backendRefs": [{"name": "web-v2", "port": 80}]},
                 {"matches": [{"path": {"type": "Exact", "value": "/only-v2"}}],
                  "backendRefs": [{"name": "web-v2", "port": 80}]},
                 rule("/slow", "web", timeouts={"request": "300ms"}),
                 rule("/flaky", "web", retry={"attempts": 2, "codes": [503],
                                              "backoff": "10ms"}),
                 {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
                  "filters": [{"type": "RequestRedirect", "requestRedirect": {
                      "hostname": "new.example", "statusCode": 301}}]},
                 rule("/headers", "web", filters=[
                     {"type": "RequestHeaderModifier",
                      "requestHeaderModifier": {"set": [{"name": "x-added", "value": "yes"}]}},
                     {"type": "ResponseHeaderModifier",
                      "responseHeaderModifier": {"add": [{"name": "x-route",
                                                          "value": "web-routes"}]}}]),
                 rule("/missing", "gone"),
                 rule("/app", "web"),
             ]}}


def get(port: int, path: str, headers: dict[str, str] | None = None
        ) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


@pytest.mark.envoy
async def test_a_real_envoy_does_what_each_rule_says(tmp_path: Path,
                                                    make_app: AppFactory) -> None:
    backends = Backends()
    await backends.start()
    try:
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        edits = Manifests(manifests)
        edits.write("web.yaml", service_with_addresses(
            NS, "web", 80, backends.port, [(WEB_IP, "zone-a")], port_name="http"))
        edits.write("web-v2.yaml", service_with_addresses(
            NS, "web-v2", 80, backends.port, [(V2_IP, "zone-a")], port_name="http"))
        edits.write("route.yaml", [ROUTE])
        app: App = await make_app(manifests)
        with outbound_envoy(app.grpc_port, tmp_path) as outbound:
            async def routed() -> bool:
                try:
                    status, _, body = await asyncio.to_thread(get, outbound, "/app")
                except OSError:
                    return False
                return status == 200 and body.startswith(WEB_IP)
            await eventually(routed, HANG, "Envoy routes /app to web")

            async def fetch(path: str, headers: dict[str, str] | None = None
                            ) -> tuple[int, dict[str, str], str]:
                return await asyncio.to_thread(get, outbound, path, headers)

            # Matches reach their backends; the longer prefix outranks a header match.
            assert (await fetch("/", {"x-version": "v2"}))[2].startswith(V2_IP)
            assert (await fetch("/app/x", {"x-version": "v2"}))[2].startswith(WEB_IP)
            assert (await fetch("/only-v2"))[2].startswith(V2_IP)
            assert (await fetch("/only-v2/deeper"))[0] == 404  # Exact is exact
            assert (await fetch("/apple"))[0] == 404  # a prefix matches whole segments
            # The rule's timeout answers 504 on a slow backend.
            assert (await fetch("/slow"))[0] == 504
            # The retry policy turns the backend's first 503 into a 200.
            before = backends.flaky
            status, _, body = await fetch("/flaky")
            assert (status, backends.flaky - before) == (200, 2), body
            # A redirect and header changes are seen by the client and the backend.
            status, headers, _ = await fetch("/old/page")
            assert status == 301 and headers["location"].startswith("http://new.example")
            status, headers, body = await fetch("/headers")
            assert status == 200 and body.endswith("x-added=yes")
            assert headers["x-route"] == "web-routes"
            # No rule matches: 404; a backend that does not exist: 500.
            assert (await fetch("/nothing-here"))[0] == 404
            assert (await fetch("/missing"))[0] == 500
    finally:
        backends.close()
