"""GetProfile over real gRPC on loopback: service profiles (by name and cluster IP),
endpoint profiles (by pod IP, host port and StatefulSet pod name), updates when the
answer changes and only then, and bad input (Linkerd §2.6, §2.8, §2.9)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.translate import address_text
from testkit.linkerd import (
    Stream,
    channel_to,
    edit,
    metric,
    named,
    remove_objects,
    write_docs,
)
from testkit.polling import eventually

AppFactory = Any

WEB = "web.emojivoto.svc.cluster.local"
EMOJI = "emoji.emojivoto.svc.cluster.local"


def routes(profile: dst.DestinationProfile) -> list[str]:
    return [r.metrics_labels["route"] for r in profile.routes]


async def first_profile(app: Any, path: str, token: str = "") -> dst.DestinationProfile:
    async with channel_to(app) as ch:
        profile: dst.DestinationProfile = await Stream(ch, "GetProfile", path, token).next()
    return profile


# ------------------------------------------------------------------ service profiles


async def test_a_service_profile_by_name(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    p = await first_profile(app, f"{WEB}:80")
    assert p.fully_qualified_name == WEB and not p.opaque_protocol
    assert routes(p) == ["GET /api/list", "POST /api/vote"]
    assert [(d.authority, d.weight) for d in p.dst_overrides] == [
        (f"{WEB}:80", 9000), ("web-canary.emojivoto.svc.cluster.local:80", 1000)]
    assert (p.parent_ref.resource.kind, p.parent_ref.resource.port) == ("Service", 80)
    assert p.profile_ref.resource.namespace == "emojivoto"
    assert not p.HasField("endpoint")


async def test_the_clients_own_profile_wins_over_the_services(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    from_shop = await first_profile(app, f"{EMOJI}:8080", '{"ns":"shop"}')
    from_elsewhere = await first_profile(app, f"{EMOJI}:8080", '{"ns":"legacy"}')
    no_token = await first_profile(app, f"{EMOJI}:8080")
    assert from_shop.profile_ref.resource.namespace == "shop"
    assert (from_shop.retry_budget.min_retries_per_second,
            from_shop.retry_budget.ttl.seconds) == (5, 30)
    assert from_elsewhere.profile_ref.resource.namespace == "emojivoto"
    assert no_token.profile_ref.resource.namespace == "emojivoto"


async def test_a_service_without_a_profile_gets_the_default_one(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    p = await first_profile(app, "cache.shop.svc.cluster.local:6379")
    assert p.fully_qualified_name == "cache.shop.svc.cluster.local"
    assert p.opaque_protocol is True  # 6379 is a default opaque port
    assert not p.routes and p.retry_budget.min_retries_per_second == 10
    assert p.profile_ref.resource.group == "linkerd.io" and not p.profile_ref.resource.name


async def test_a_cluster_ip_names_its_service(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    p = await first_profile(app, "10.96.10.10:80")
    assert p.fully_qualified_name == WEB and routes(p) == ["GET /api/list", "POST /api/vote"]
    v6 = await first_profile(app, "[fd00:10:96::2011]:8080")
    assert v6.fully_qualified_name == "cart.shop.svc.cluster.local"


async def test_a_profile_is_resent_when_it_changes_and_only_then(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "GetProfile", "payments.shop.svc.cluster.local:8080")
        assert routes(await stream.next()) == []
        # Unrelated changes: another service's profile, endpoints of this one.
        edit(demo_dir, lambda d: _retitle(d, "emojivoto", "GET /api/list", "GET /api/all"))
        write_docs(demo_dir / "60-payments-slice.yaml", [{
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "payments-x", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "payments"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.244.1.90"]}]}])
        await eventually(lambda: ("EndpointSlice", "shop", "payments-x") in app.cluster.slices
                         and "GET /api/all" in str(app.cluster.profiles[("emojivoto", WEB)].spec),
                         why="timed out waiting for the unrelated changes to be applied")
        # Barrier: this profile's own change must be the next message.
        write_docs(demo_dir / "61-payments-profile.yaml", [{
            "apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
            "metadata": {"name": "payments.shop.svc.cluster.local", "namespace": "shop"},
            "spec": {"routes": [{"name": "pay", "condition": {"method": "POST"},
                                 "timeout": "2s"}]}}])
        p = await stream.next()
        assert routes(p) == ["pay"] and p.routes[0].timeout.seconds == 2
        # The opaque-ports annotation of the Service is followed too.
        edit(demo_dir, lambda d: _annotate(d, "payments", "config.linkerd.io/opaque-ports",
                                           "http"))
        assert (await stream.next()).opaque_protocol is True


def _retitle(doc: dict[str, Any], ns: str, old: str, new: str) -> dict[str, Any]:
    if doc.get("kind") == "ServiceProfile" and doc["metadata"]["namespace"] == ns:
        for r in doc["spec"].get("routes") or []:
            if r.get("name") == old:
                r["name"] = new
    return doc


def _annotate(doc: dict[str, Any], name: str, key: str, value: str) -> dict[str, Any]:
    if doc.get("kind") == "Service" and doc["metadata"]["name"] == name:
        doc["metadata"].setdefault("annotations", {})[key] = value
    return doc


async def test_a_profile_that_cannot_be_converted_is_not_sent(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "GetProfile", f"{WEB}:80")
        assert routes(await stream.next()) == ["GET /api/list", "POST /api/vote"]
        with structlog.testing.capture_logs() as logs:
            def break_status(doc: dict[str, Any]) -> dict[str, Any]:
                if doc.get("kind") == "ServiceProfile" and doc["metadata"]["name"] == WEB:
                    rc = doc["spec"]["routes"][0]["responseClasses"][0]
                    rc["condition"]["status"]["max"] = 999
                return doc
            edit(demo_dir, break_status)
            await eventually(lambda: any(e["event"] == "profile not sent: cannot be built"
                                         for e in logs),
                             why="timed out waiting for the broken profile to be seen")
            # Barrier: the next message is the one after the fix; nothing came between.
            edit(demo_dir, lambda d: _fix_status(_retitle(d, "emojivoto", "POST /api/vote",
                                                          "vote")))
            p = await stream.next()
        assert routes(p) == ["GET /api/list", "vote"]


def _fix_status(doc: dict[str, Any]) -> dict[str, Any]:
    if doc.get("kind") == "ServiceProfile" and doc["metadata"]["name"] == WEB:
        doc["spec"]["routes"][0]["responseClasses"][0]["condition"]["status"]["max"] = 599
    return doc


# ------------------------------------------------------------------ endpoint profiles


async def test_an_endpoint_profile_by_pod_ip(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    p = await first_profile(app, "10.244.2.10:8080")
    wa = p.endpoint
    assert address_text(wa.addr) == "10.244.2.10:8080"
    assert wa.metric_labels["namespace"] == "emojivoto"
    assert wa.metric_labels["pod"] == "web-5d8f7b9c6-9zqtm"
    assert "zone_locality" not in wa.metric_labels
    assert wa.tls_identity.dns_like_identity.name.startswith("web.emojivoto.")
    assert wa.protocol_hint.WhichOneof("protocol") == "h2"
    assert not p.fully_qualified_name and not p.routes and not p.opaque_protocol


async def test_an_endpoint_profile_by_statefulset_pod_name(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    p = await first_profile(app, "db-2.db.data.svc.cluster.local:5432")
    assert address_text(p.endpoint.addr) == "10.244.3.50:5432"
    assert p.endpoint.metric_labels["statefulset"] == "db"
    assert p.opaque_protocol is True


async def test_an_endpoint_profile_by_host_port(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    # node-local-agent publishes hostPort 4317 on node-a (host IP 10.0.0.11).
    p = await first_profile(app, "10.0.0.11:4317")
    assert p.endpoint.metric_labels["pod"] == "node-local-agent-4rkzd"
    assert p.endpoint.metric_labels["daemonset"] == "node-local-agent"


async def test_an_address_with_no_workload_gets_a_bare_endpoint(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    p = await first_profile(app, "192.0.2.44:3306")
    assert address_text(p.endpoint.addr) == "192.0.2.44:3306"
    assert not p.endpoint.metric_labels and not p.endpoint.HasField("tls_identity")
    assert p.opaque_protocol is True  # 3306 is a default opaque port


async def test_an_endpoint_profile_follows_its_pod(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "GetProfile", "10.244.1.60:8080")
        assert (await stream.next()).endpoint.metric_labels["pod"] == "billing-84c9d7f6b-j2wqm"
        removed = remove_objects(demo_dir, named("Pod", "legacy", "billing-84c9d7f6b-j2wqm"))
        assert not (await stream.next()).endpoint.metric_labels
        write_docs(demo_dir / "70-billing-pod.yaml", removed)
        assert (await stream.next()).endpoint.metric_labels["pod"] == "billing-84c9d7f6b-j2wqm"


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("path", "code", "details"), [
    ("web.emojivoto.svc.cluster.local:0", grpc.StatusCode.INVALID_ARGUMENT,
     'invalid authority: "web.emojivoto.svc.cluster.local:0": "invalid port 0"'),
    ("web.emojivoto:80", grpc.StatusCode.INVALID_ARGUMENT, 'invalid service "web.emojivoto"'),
    ("mail.legacy.svc.cluster.local:25", grpc.StatusCode.INVALID_ARGUMENT, "ExternalName"),
    ("db-9.db.data.svc.cluster.local:5432", grpc.StatusCode.NOT_FOUND,
     "no pod found in EndpointSlices of Service data/db for hostname db-9"),
    ("x" * 300, grpc.StatusCode.INVALID_ARGUMENT, "longer than"),
])
async def test_bad_profile_requests_are_refused_precisely(
        make_app: AppFactory, demo_dir: Path, path: str, code: grpc.StatusCode,
        details: str) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        with structlog.testing.capture_logs() as logs:
            got = await Stream(ch, "GetProfile", path).error()
    assert got[0] == code and details in got[1]
    refusals = [e for e in logs if e["event"] == "destination request refused"]
    assert len(refusals) == 1 and refusals[0]["method"] == "GetProfile"
    assert refusals[0]["peer"].startswith("ipv4:127.0.0.1:")


async def test_conflicting_cluster_ips_and_pod_ips_are_a_failed_precondition(
        make_app: AppFactory, demo_dir: Path) -> None:
    write_docs(demo_dir / "80-conflicts.yaml", [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "web-twin", "namespace": "emojivoto"},
         "spec": {"clusterIP": "10.96.10.10", "ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "web-twin-pod", "namespace": "emojivoto"},
         "spec": {"containers": [{"name": "app"}]},
         "status": {"phase": "Running", "podIP": "10.244.1.10"}},
    ])
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        svc = await Stream(ch, "GetProfile", "10.96.10.10:80").error()
        pod = await Stream(ch, "GetProfile", "10.244.1.10:8080").error()
    assert svc == (grpc.StatusCode.FAILED_PRECONDITION,
                   "found 2 services with conflicting cluster IP 10.96.10.10")
    assert pod == (grpc.StatusCode.FAILED_PRECONDITION,
                   "found 2 pods with a conflicting pod network IP 10.244.1.10")
    assert await metric(app, "meshbridge_destination_requests_refused_total",
                        {"method": "GetProfile", "code": "FAILED_PRECONDITION"}) == 2


async def test_a_port_the_service_does_not_declare_gets_its_profile_and_a_log_line(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        with structlog.testing.capture_logs() as logs:
            p = await Stream(ch, "GetProfile", f"{WEB}:9999").next()
    assert p.fully_qualified_name == WEB and p.parent_ref.resource.port == 9999
    assert len([e for e in logs if e["event"].startswith("port not declared")]) == 1
