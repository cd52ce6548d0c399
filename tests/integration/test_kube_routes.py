"""Routes on the kube source against a real kube-apiserver: a route edit written
through the API reaches all three client kinds (a Linkerd OutboundPolicies watch, an
Envoy's RDS, a proxyless gRPC client's RDS), and meshbridge writes the route's
`status.parents` beside another controller's entry, which it leaves alone
(Routes §1-3, §6)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from kubernetes import client

from bridge.routes.status import CONTROLLER_NAME
from bridge.sources.kube import KubeSource
from linkerd_api.proto import outbound_pb2 as ob
from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.linkerd import channel_to
from testkit.linkerd_policy import watch
from testkit.polling import HANG, eventually_sync
from testkit.serving import loopback_app
from tests.integration import test_kube_policy
from xds_api import resource_types as rt
from xds_api.client import DeltaAdsClient

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture
api = test_kube_policy.api  # an API client, with the policy and route CRDs installed
WAIT = HANG  # a write reaching the clients through a real API server: waited for, never timed
GROUP, VERSION, PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
LINKERD = "linkerd.io/policy-controller"


def canary(weight: int, backend: str = "web-canary") -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HTTPRoute",
            "metadata": {"name": "web-canary"},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web",
                                     "port": 80}],
                     "rules": [{"backendRefs": [
                         {"name": "web", "port": 80, "weight": 100 - weight},
                         {"name": backend, "port": 80, "weight": weight}]}]}}


def weights_of_policy(policy: Any) -> list[int]:
    rule = policy.protocol.detect.http1.routes[0].rules[0]
    return [b.weight for b in rule.backends.random_available.backends]


def weights_of_rds(config_msg: Any) -> list[int]:
    action = config_msg.virtual_hosts[0].routes[0].route
    return [c.weight.value for c in action.weighted_clusters.clusters]


async def test_a_route_edit_through_the_api_reaches_every_client_kind_and_status_is_written(
    api: client.ApiClient, kube_apiserver: KubeAPIServer
) -> None:
    core = client.CoreV1Api(api)
    objs = client.CustomObjectsApi(api)
    ns = f"r-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns}})
    for name in ("web", "web-canary"):
        core.create_namespaced_service(ns, {"metadata": {"name": name}, "spec": {
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    objs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, canary(10))
    # Another controller's entry, which meshbridge must leave as it is.
    linkerd_entry = {"parentRef": {"group": "", "kind": "Service", "name": "web",
                                   "port": 80},
                     "controllerName": LINKERD,
                     "conditions": [{"type": "Accepted", "status": "True",
                                     "reason": "Accepted", "message": "",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    objs.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "web-canary",
                                               {"status": {"parents": [linkerd_entry]}})
    authority = f"web.{ns}.svc.cluster.local:80"

    source = KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path))
    app = loopback_app(source)
    await app.start()
    try:
        async with channel_to(app) as ch, \
                DeltaAdsClient(ch, "envoy-client", {"NAMESPACE": ns}) as envoy, \
                DeltaAdsClient(ch, "grpc-client", {"NAMESPACE": ns,
                                              "meshbridge.io/client": "grpc"}) as grpc_client:
            policy_stream = watch(ch, ob.TrafficSpec(source_workload=f"{ns}:client",
                                                     authority=authority))
            await envoy.subscribe(rt.ROUTE, [authority])
            await grpc_client.subscribe(rt.ROUTE, [authority])
            assert weights_of_policy(await policy_stream.next(WAIT)) == [90, 10]
            await envoy.read(WAIT)
            await grpc_client.read(WAIT)
            for xds in (envoy, grpc_client):
                assert weights_of_rds(xds.held[rt.ROUTE][authority]) == [90, 10]

            def route_status() -> list[dict[str, Any]]:
                obj = objs.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                        "web-canary")
                return list((obj.get("status") or {}).get("parents") or [])

            def ours() -> dict[str, Any] | None:
                mine = [p for p in route_status() if p["controllerName"] == CONTROLLER_NAME]
                return mine[0] if mine else None

            await asyncio.to_thread(eventually_sync, lambda: ours() is not None, WAIT,
                                    "meshbridge's status entry")
            entry = ours()
            assert entry is not None
            conditions = {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}
            assert conditions == {"Accepted": ("True", "Accepted"),
                                  "ResolvedRefs": ("True", "ResolvedRefs")}
            assert linkerd_entry in route_status()  # the other controller's, untouched

            # The edit: 70/30, to a backend that does not exist.
            current = objs.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                        "web-canary")
            edited = canary(30, backend="gone")
            edited["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            started = time.monotonic()
            objs.replace_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "web-canary",
                                                  edited)
            deadline = started + WAIT
            while weights_of_policy(await policy_stream.next(deadline - time.monotonic())) \
                    != [70, 30]:
                pass
            for xds in (envoy, grpc_client):
                while weights_of_rds(xds.held[rt.ROUTE][authority]) != [70, 30]:
                    await xds.read(deadline - time.monotonic())
            policy_stream.cancel()

            def not_found() -> bool:
                entry = ours()
                return entry is not None and any(
                    c["type"] == "ResolvedRefs" and c["status"] == "False"
                    and c["reason"] == "BackendNotFound" for c in entry["conditions"])
            await asyncio.to_thread(eventually_sync, not_found, WAIT,
                                    "ResolvedRefs False, BackendNotFound")
            assert linkerd_entry in route_status()
            writer = source.status_writer
            assert writer is not None and writer.failures == 0
    finally:
        await app.stop(0.2)
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(ns)
