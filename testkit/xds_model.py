"""A cluster, its Views and an xDS cache in memory, and clients that drive the stream
state machines with real DiscoveryRequests. Shared by the tests/unit/test_xds_* files
(this module holds no tests itself)."""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from bridge.cluster import Cluster
from bridge.model import MeshConfig
from bridge.views import ViewRegistry
from testkit.builders import delete, endpoint, endpoint_slice, load, pod, service
from xds_api import resource_types as rt
from xds_api.cache import ResourceCache
from xds_api.caches.endpoints import DEFAULT_LEDS_THRESHOLD
from xds_api.metrics import XdsMetrics
from xds_api.resources import LINKERD_ENCODER, MetadataEncoder
from xds_api.stream import DeltaStream, SotwStream

CDS, EDS, LDS, RDS, LEDS = rt.CLUSTER, rt.ENDPOINT, rt.LISTENER, rt.ROUTE, rt.LB_ENDPOINT
DOMAIN = "cluster.local"
MESSAGES: dict[str, Any] = {
    CDS: cluster_pb2.Cluster, EDS: endpoint_pb2.ClusterLoadAssignment,
    LDS: listener_pb2.Listener, RDS: route_pb2.RouteConfiguration,
    LEDS: endpoint_components_pb2.LbEndpoint,
}


def name(svc: str, port: int = 80, ns: str = "app") -> str:
    return f"{svc}.{ns}.svc.{DOMAIN}:{port}"


def unpack(any_msg: any_pb2.Any) -> Any:
    msg = MESSAGES[any_msg.type_url]()
    assert any_msg.Unpack(msg)
    return msg


def resource_name(msg: Any) -> str:
    return str(msg.cluster_name if isinstance(msg, endpoint_pb2.ClusterLoadAssignment)
               else msg.name)


def ips(cla: endpoint_pb2.ClusterLoadAssignment) -> list[str]:
    return [lb.endpoint.address.socket_address.address
            for loc in cla.endpoints for lb in loc.lb_endpoints]


class World:
    """One cluster with services `web` (port 80) and `api` (port 80, grpc) in `app`."""

    def __init__(self, draining: bool = False, with_services: bool = True,
                 metadata: MetadataEncoder = LINKERD_ENCODER,
                 leds_threshold: int = DEFAULT_LEDS_THRESHOLD) -> None:
        self.cluster = Cluster()
        self.views = ViewRegistry(self.cluster, MeshConfig())
        self.metrics = XdsMetrics()
        self.cache = ResourceCache(self.cluster, self.views, DOMAIN, draining=draining,
                                   metrics=self.metrics, metadata=metadata,
                                   leds_threshold=leds_threshold)
        if with_services:
            self.add_service("web", ["10.0.0.1", "10.0.0.2"])
            self.add_service("api", ["10.0.1.1"], app_protocol="grpc")

    def add_service(self, svc: str, addresses: list[str], app_protocol: str = "",
                    ns: str = "app") -> None:
        port: dict[str, Any] = {"name": "http", "port": 80, "targetPort": 8080}
        if app_protocol:
            port["appProtocol"] = app_protocol
        load(self.cluster, service(svc, ns=ns, ports=[port]))
        self.set_endpoints(svc, addresses, ns=ns)

    def set_endpoints(self, svc: str, addresses: list[str], ns: str = "app",
                      zones: list[str] | None = None,
                      labels: dict[str, str] | None = None) -> None:
        pods = [pod(f"{svc}-{i}", ip, ns=ns, labels=labels) for i, ip in enumerate(addresses)]
        eps = [endpoint(ip, f"{svc}-{i}", ns=ns, zone=zones[i] if zones else "zone-a")
               for i, ip in enumerate(addresses)]
        load(self.cluster, *pods, endpoint_slice(f"{svc}-slice", svc, eps, ns=ns))

    def set_port_protocol(self, svc: str, app_protocol: str, ns: str = "app") -> None:
        load(self.cluster, service(svc, ns=ns, ports=[
            {"name": "http", "port": 80, "targetPort": 8080, "appProtocol": app_protocol}]))

    def delete_service(self, svc: str, ns: str = "app") -> None:
        delete(self.cluster, service(svc, ns=ns))

    def sotw(self, ads: bool = True, max_names: int = 10_000) -> SotwClient:
        return SotwClient(SotwStream(self.cache, ads=ads, max_names=max_names))

    def delta(self, ads: bool = True, node: dict[str, str] | None = None) -> DeltaClient:
        return DeltaClient(DeltaStream(self.cache, ads=ads), node)

    def count(self, metric: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(metric, labels)
        return value or 0.0


class SotwClient:
    def __init__(self, stream: SotwStream) -> None:
        self.stream = stream
        self.last: dict[str, discovery_pb2.DiscoveryResponse] = {}
        self.node_sent = False
        self.node_id = "test-node"

    def request(self, type_url: str, names: list[str] | None = None, *,
                nonce: str | None = None, version: str | None = None,
                error: str | None = None) -> None:
        """Send a request; by default it carries the last nonce and version of its type."""
        last = self.last.get(type_url)
        req = discovery_pb2.DiscoveryRequest(
            type_url=type_url, resource_names=names or [],
            response_nonce=nonce if nonce is not None else (last.nonce if last else ""),
            version_info=version if version is not None else (last.version_info if last
                                                               else ""))
        if not self.node_sent:
            req.node.id = self.node_id
            self.node_sent = True
        if error is not None:
            req.error_detail.code = 3
            req.error_detail.message = error
        self.stream.handle(req)

    def responses(self) -> list[discovery_pb2.DiscoveryResponse]:
        out = [discovery_pb2.DiscoveryResponse.FromString(b)
               for b in self.stream.take_responses()]
        for r in out:
            self.last[r.type_url] = r
        return out

    def one(self, type_url: str) -> discovery_pb2.DiscoveryResponse:
        got = self.responses()
        assert [r.type_url for r in got] == [type_url], [r.type_url for r in got]
        return got[0]

    def names(self, type_url: str) -> list[str]:
        return [resource_name(unpack(a)) for a in self.one(type_url).resources]

    def ack(self, type_url: str, names: list[str] | None = None) -> None:
        self.request(type_url, names)


class DeltaClient:
    def __init__(self, stream: DeltaStream, node: dict[str, str] | None = None) -> None:
        self.stream = stream
        self.node = node  # node metadata, sent on the first request
        self.last: dict[str, discovery_pb2.DeltaDiscoveryResponse] = {}
        self.held: dict[str, dict[str, str]] = {}

    def request(self, type_url: str, subscribe: list[str] | None = None,
                unsubscribe: list[str] | None = None, *, nonce: str | None = None,
                initial: dict[str, str] | None = None, error: str | None = None) -> None:
        last = self.last.get(type_url)
        req = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url, resource_names_subscribe=subscribe or [],
            resource_names_unsubscribe=unsubscribe or [],
            response_nonce=nonce if nonce is not None else (last.nonce if last else ""),
            initial_resource_versions=initial or {})
        if self.node is not None:
            req.node.id = "test-node"
            req.node.metadata.update(self.node)
            self.node = None
        if error is not None:
            req.error_detail.code = 3
            req.error_detail.message = error
        self.stream.handle(req)

    def responses(self) -> list[discovery_pb2.DeltaDiscoveryResponse]:
        out = [discovery_pb2.DeltaDiscoveryResponse.FromString(b)
               for b in self.stream.take_responses()]
        for r in out:
            self.last[r.type_url] = r
            held = self.held.setdefault(r.type_url, {})
            for res in r.resources:
                held[res.name] = res.version
            for gone in r.removed_resources:
                held.pop(gone, None)
        return out

    def one(self, type_url: str) -> discovery_pb2.DeltaDiscoveryResponse:
        got = self.responses()
        assert [r.type_url for r in got] == [type_url], [r.type_url for r in got]
        return got[0]

    def ack(self, type_url: str) -> None:
        self.request(type_url)


def delta_names(resp: discovery_pb2.DeltaDiscoveryResponse) -> list[str]:
    return [r.name for r in resp.resources]
