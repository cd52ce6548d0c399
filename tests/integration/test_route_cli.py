"""`meshbridge policy NAME` and `meshbridge xds NAME --type rds` print one port's routes
in one format, so that what a Linkerd proxy and what an Envoy is told read alike
(the demo's canary route, served by a real meshbridge)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from meshbridge.app import App
from testkit.polling import HANG
from tests.conftest import AppFactory

# web's ServiceProfile routes it (Routes §7): its catch-all, after its two routes.
SPLIT = "web.emojivoto.svc.cluster.local:80 9000, web-canary.emojivoto.svc.cluster.local:80 1000"
CANARY_ROW = (f"prefix / -> {SPLIT}  (ServiceProfile emojivoto/web.emojivoto.svc.cluster.local "
              "rule 2)")


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meshbridge.cli", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 2 * HANG)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_policy_and_rds_print_the_same_route_table(demo_dir: Path,
                                                         make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    server = f"127.0.0.1:{app.grpc_port}"
    code, policy, err = await cli("policy", "web.emojivoto:80", "--server", server,
                                  "--count", "1", "--timeout", "60")
    assert code == 0, err
    assert policy.splitlines()[0] == (
        "policy web.emojivoto.svc.cluster.local:80 (detect (http1, http2)):")
    assert CANARY_ROW in policy
    for client in ("envoy", "grpc"):
        code, rds, err = await cli("xds", "web.emojivoto:80", "--type", "rds", "--server",
                                   server, "--count", "1", "--timeout", "60",
                                   "--node-metadata", f"meshbridge.io/client={client}")
        assert code == 0, err
        assert CANARY_ROW in rds
    # A ClusterIP names the same port; a port without routes shows the default route.
    code, by_ip, _ = await cli("policy", "10.96.10.10:80", "--server", server, "--count", "1")
    assert code == 0 and CANARY_ROW in by_ip
    code, plain, _ = await cli("policy", "catalog.shop:80", "--server", server,
                               "--count", "1")
    assert code == 0 and "1. prefix / -> catalog.shop.svc.cluster.local:80" in plain


async def test_debug_endpoints_shows_the_routes_of_each_client_kind_side_by_side(
        demo_dir: Path, make_app: AppFactory) -> None:
    import json
    import urllib.request

    (demo_dir / "60-mirror.yaml").write_text(json.dumps({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "mirror", "namespace": "shop"},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "catalog",
                                 "port": 80}],
                 "rules": [{"filters": [{"type": "RequestMirror", "requestMirror": {
                     "backendRef": {"name": "search", "port": 80}}}],
                            "backendRefs": [{"name": "catalog", "port": 80}]}]}}))
    app: App = await make_app(demo_dir)

    def fetch(authority: str, fmt: str) -> str:
        url = (f"http://127.0.0.1:{app.admin_port}/debug/endpoints?authority={authority}"
               f"&format={fmt}")
        with urllib.request.urlopen(url, timeout=HANG) as resp:
            return str(resp.read().decode())

    async def get(authority: str, fmt: str = "json") -> str:
        return await asyncio.to_thread(fetch, authority, fmt)  # the server shares this loop

    doc = json.loads(await get("web.emojivoto.svc.cluster.local:80"))
    routes = doc["routes"]
    assert sorted(routes) == ["envoy", "grpc", "linkerd"]
    for kind in routes.values():
        assert {row["to"] for row in kind["rows"]} == {SPLIT}
    # Every kind is sent web's profile; what each cannot say is listed.
    assert len(routes["envoy"]["rows"]) == len(routes["linkerd"]["rows"]) == 3
    assert any("budget" in x for x in routes["envoy"]["left_out"])
    assert any("GET method" in x for x in routes["grpc"]["left_out"])
    assert any("order" in x for x in routes["linkerd"]["left_out"])
    # A mirror: Envoy is told it, gRPC and Linkerd are not, and the page says so.
    routes = json.loads(await get("catalog.shop.svc.cluster.local:80"))["routes"]
    assert any(n.startswith("mirror search.shop") for n in routes["envoy"]["rows"][0]["notes"])
    assert routes["envoy"]["left_out"] == []
    assert any("RequestMirror" in x for x in routes["grpc"]["left_out"])
    assert any("RequestMirror" in x for x in routes["linkerd"]["left_out"])
    page = await get("catalog.shop.svc.cluster.local:80", "html")
    assert 'id="routes"' in page and "not told to a client kind" in page
