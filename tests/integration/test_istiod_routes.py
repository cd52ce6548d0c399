"""Routes, differentially: istiod (pilot-discovery, with the Gateway API's CRDs) and
meshbridge read the same GAMMA HTTPRoute from one real kube-apiserver, and the routes
an Envoy sidecar is sent for the Service port are compared field by field
(Routes §1-3, xDS §4.6).

What is compared, route by route in order: the match (path specifier and value,
headers, query parameters), the action (weighted clusters as (host, port, weight),
or the redirect's host, path and code, or a direct response's status), the route
timeout, request header changes. Pinned differences, not compared, each with its
reason:

* retry_policy: istiod adds its mesh-wide default retry (2 attempts on connection
  failures and some statuses) to every route without a `retry` stanza; meshbridge
  adds none, as Linkerd's proxy retries nothing unless a route says so.
* max_grpc_timeout, name, decorator, metadata, typed_per_filter_config: istiod's own
  telemetry and naming.
* the RouteConfiguration's name and virtual hosts: istiod names it after the port
  ("80") and puts every Service with that port in it; meshbridge sends one per
  Service port, named by its authority, with one virtual host. The routes of the
  Service's virtual host are what is compared.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client, config

from bridge.sources.kube import KubeSource
from testkit import kubeapi
from testkit.istiod import Istiod, IstiodError
from testkit.kubeapi import KubeAPIServer
from testkit.serving import loopback_app
from tests.integration.shadow_support import ShadowRun, fields_of
from xds_api import resource_types as rt
from xds_api.client import DeltaAdsClient

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture
WAIT = 60.0
GROUP, VERSION, PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"


@pytest.fixture(scope="module")
def istiod(kube_apiserver: KubeAPIServer) -> Iterator[Istiod]:
    try:
        with Istiod(kube_apiserver, gateway_api=True) as running:
            yield running
    except IstiodError as e:
        pytest.fail(f"istiod is part of the suite: {e}")


def route(ns: str) -> dict[str, Any]:
    def rule(match: dict[str, Any], *backends: tuple[str, int], **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"matches": [match], **extra}
        if backends:
            out["backendRefs"] = [{"name": n, "port": 80, "weight": w} for n, w in backends]
        return out

    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HTTPRoute",
            "metadata": {"name": "web-routes", "namespace": ns},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web",
                                     "port": 80}],
                     "rules": [
                         rule({"path": {"type": "PathPrefix", "value": "/"}},
                              ("web", 90), ("web-canary", 10)),
                         rule({"path": {"type": "PathPrefix", "value": "/api"},
                               "headers": [{"name": "x-user", "value": "a"}]},
                              ("web-canary", 1), timeouts={"request": "2s"}),
                         rule({"path": {"type": "Exact", "value": "/healthz"}}, ("web", 1),
                              filters=[{"type": "RequestHeaderModifier",
                                        "requestHeaderModifier": {
                                            "set": [{"name": "x-added", "value": "1"}],
                                            "remove": ["x-drop"]}}]),
                         rule({"path": {"type": "PathPrefix", "value": "/old"}},
                              filters=[{"type": "RequestRedirect", "requestRedirect": {
                                  "hostname": "new.example", "statusCode": 301}}]),
                     ]}}


def host_port(cluster: str) -> tuple[str, int]:
    """istiod's `outbound|80||web.ns.svc.cluster.local` and meshbridge's
    `web.ns.svc.cluster.local:80`, as one (host, port)."""
    if cluster.startswith("outbound|"):
        _, port, _, host = cluster.split("|")
        return host, int(port)
    host, _, port = cluster.rpartition(":")
    return host, int(port)


def _string(m: Any) -> tuple[str, str]:
    which = m.WhichOneof("match_pattern")
    return which, (m.safe_regex.regex if which == "safe_regex" else getattr(m, which))


def normalize(r: Any) -> dict[str, Any]:
    m = r.match
    which = m.WhichOneof("path_specifier")
    out: dict[str, Any] = {
        "path": (which, m.safe_regex.regex if which == "safe_regex" else getattr(m, which)),
        "headers": sorted((h.name, *_string(h.string_match)) for h in m.headers),
        "query": sorted((q.name, *_string(q.string_match)) for q in m.query_parameters),
        "request_headers_to_add": sorted(
            (h.header.key, h.header.value, h.append_action) for h in r.request_headers_to_add),
        "request_headers_to_remove": sorted(r.request_headers_to_remove),
    }
    action = r.WhichOneof("action")
    out["action"] = action
    if action == "route":
        ra = r.route
        if ra.WhichOneof("cluster_specifier") == "weighted_clusters":
            out["backends"] = [(*host_port(c.name), c.weight.value)
                               for c in ra.weighted_clusters.clusters]
        else:
            out["backends"] = [(*host_port(ra.cluster), 1)]
        out["timeout_ms"] = ra.timeout.ToMilliseconds()
    elif action == "redirect":
        rd = r.redirect
        out["redirect"] = (rd.host_redirect, rd.path_redirect or rd.prefix_rewrite,
                           rd.response_code)
    elif action == "direct_response":
        out["status"] = r.direct_response.status
    return out


async def routes_of(xds: DeltaAdsClient, name: str, host: str, ready: Any) -> list[Any]:
    """The routes of `host`'s virtual host in RouteConfiguration `name` (meshbridge's
    one virtual host is `*`: the configuration is the Service port's own), once
    `ready` holds for them (a control plane may answer before it has read the route)."""
    deadline = time.monotonic() + WAIT
    while True:
        config_msg = xds.held.get(rt.ROUTE, {}).get(name)
        if config_msg is not None:
            for vh in config_msg.virtual_hosts:
                mine = list(vh.domains) == ["*"] and len(config_msg.virtual_hosts) == 1
                if (mine or any(d == host or d.startswith(host + ":") for d in vh.domains)) \
                        and ready(list(vh.routes)):
                    return list(vh.routes)
        await xds.read(max(0.1, deadline - time.monotonic()))


async def test_istiod_and_meshbridge_send_an_envoy_the_same_routes(
        istiod: Istiod, kube_apiserver: KubeAPIServer) -> None:
    api = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    core = client.CoreV1Api(api)
    ns = f"ir-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns}})
    for name in ("web", "web-canary"):
        core.create_namespaced_service(ns, {"metadata": {"name": name}, "spec": {
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                                 route(ns))
    host = f"web.{ns}.svc.cluster.local"
    app = loopback_app(KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path),
                                  route_status=False))
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ours_ch, \
                grpc.aio.insecure_channel(f"127.0.0.1:{istiod.grpc_port}") as theirs_ch, \
                DeltaAdsClient(ours_ch, "envoy", {"NAMESPACE": ns}) as ours, \
                DeltaAdsClient(theirs_ch,
                               f"sidecar~10.30.9.9~client.{ns}~{ns}.svc.cluster.local",
                               {"NAMESPACE": ns}) as theirs:
            await ours.subscribe(rt.ROUTE, [f"{host}:80"])
            await theirs.subscribe(rt.ROUTE, ["80"])

            def four(routes: list[Any]) -> bool:
                return len(routes) == 4

            ours_routes = await routes_of(ours, f"{host}:80", host, four)
            try:
                theirs_routes = await routes_of(theirs, "80", host, four)
            except TimeoutError:
                pytest.fail(f"istiod sent no routes for {host}\n{istiod.log_tail(40)}")
        assert [normalize(r) for r in ours_routes] == [normalize(r) for r in theirs_routes]
        # What the comparison covered, so that agreeing on nothing proves nothing: the
        # exact path first, then the longer prefix with its header, then the redirect,
        # the demo's 90/10 canary last.
        ours_seen = [normalize(r) for r in ours_routes]
        assert [r["action"] for r in ours_seen] == ["route", "route", "redirect", "route"]
        assert ours_seen[1]["timeout_ms"] == 2000
        assert ours_seen[3]["backends"] == [
            (host, 80, 90), (f"web-canary.{ns}.svc.cluster.local", 80, 10)]
    finally:
        await app.stop(0.2)
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(ns)
        api.close()


# What an istiod sidecar answer carries that meshbridge's does not, each for a reason:
# naming and telemetry (route names, decorators, metadata, the attempt-count header,
# max_grpc_timeout), istiod's mesh-wide default retry (above), a 500 for a missing
# cluster on every route (meshbridge sets it where a backend cannot be served: with
# every cluster there, Envoy never reads it), and a redirect that keeps the path
# carrying an empty `path_redirect` (meshbridge leaves the field out), and istiod's
# redundant messages: a full push (each Service or route the test creates can start
# one, debounced) resends the unchanged route configuration, so how many istiod sends
# depends on its debounce timing, not on the route; once counted, the difference
# would last for the stream's life. docs/shadow.md gives the same list.
ISTIOD_ROUTE_FIELDS = ",".join((
    "rds.include_request_attempt_count", "rds.routes.name", "rds.routes.decorator",
    "rds.routes.metadata", "rds.routes.route.max_grpc_timeout",
    "rds.routes.route.retry_policy", "rds.routes.route.cluster_not_found_response_code",
    "rds.routes.redirect.path_redirect", "messages.redundant"))


async def test_shadow_compares_routes_with_istiod_and_finds_a_planted_difference(
        istiod: Istiod, kube_apiserver: KubeAPIServer, tmp_path: Path) -> None:
    """`meshbridge shadow --api xds --routes` with istiod as theirs: the route's virtual
    host is equal field by field but for the fields above; an annotation only
    meshbridge reads (timeout.linkerd.io/request wins over `timeouts`, Routes §3.3)
    plants a difference in exactly the routes' timeouts."""
    api = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    core = client.CoreV1Api(api)
    objs = client.CustomObjectsApi(api)
    ns = f"sr-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns}})
    for name in ("web", "web-canary"):
        core.create_namespaced_service(ns, {"metadata": {"name": name}, "spec": {
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    objs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, route(ns))
    target = f"web.{ns}.svc.cluster.local:80"
    targets = tmp_path / "targets"
    targets.write_text(f"{target}\n")
    app = loopback_app(KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path),
                                  route_status=False))
    await app.start()
    try:
        run = ShadowRun("--api", "xds", "--ours", f"127.0.0.1:{app.grpc_port}",
                        "--theirs", f"127.0.0.1:{istiod.grpc_port}", "--targets", str(targets),
                        "--routes", "--theirs-eds-name", "outbound|{port}||{host}",
                        "--theirs-rds-name", "{port}", "--fields", ISTIOD_ROUTE_FIELDS,
                        "--node-id", f"sidecar~10.30.9.9~shadow.{ns}~{ns}.svc.cluster.local")

        def four_routes_equal() -> bool:
            event = run.latest().get(target, {})
            return event.get("status") == "equal" and any(
                e["event"] == "target" for e in run.lines())
        await run.until(four_routes_equal, f"{target}'s routes equal", WAIT)

        objs.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "web-routes", {
            "metadata": {"annotations": {"timeout.linkerd.io/request": "5s"}}})
        differs = await run.until(
            lambda: [e for e in run.events(target) if e["status"] == "differs"],
            "the planted timeout", WAIT)
        # Envoy's order: the exact path, the longer prefix (2 s), the redirect, then /.
        assert fields_of(differs[-1]["differences"]) == {
            "rds.routes[0].route.timeout": ("(unset)", "{}"),
            "rds.routes[0].route.timeout.seconds": ("5", "(unset)"),
            "rds.routes[1].route.timeout.seconds": ("5", "2"),
            "rds.routes[3].route.timeout": ("(unset)", "{}"),
            "rds.routes[3].route.timeout.seconds": ("5", "(unset)")}
        rc, summary = await run.finish()
        assert rc == 1 and summary["ignored"] == ISTIOD_ROUTE_FIELDS.split(",")
    finally:
        await app.stop(0.2)
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(ns)
        api.close()
