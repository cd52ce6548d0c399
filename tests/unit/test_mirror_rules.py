"""Linkerd's service-mirror rules (bridge.multicluster.mirror_rules), table by table."""

from __future__ import annotations

import pytest

from bridge.model import ServiceKey
from bridge.multicluster.mirror_rules import (
    FederatedMember,
    LinkRules,
    Selector,
    SelectorError,
    differs,
    federated_service,
    is_headless,
    mirror_service,
)
from bridge.objects import Meta, Service, ServicePort


def remote(name: str = "foo", labels: dict[str, str] | None = None,
           annotations: dict[str, str] | None = None, headless: bool = False,
           ports: tuple[ServicePort, ...] = (ServicePort("http", 80, 8080),)) -> Service:
    return Service(Meta(name, "ns", resource_version="42", labels=labels or {},
                        annotations=annotations or {}),
                   ports=ports, cluster_ips=() if headless else ("10.96.0.9",),
                   selector={"app": name})


EAST = LinkRules("east", "east.example", excluded_labels=("team", "internal.io/*"),
                 excluded_annotations=("secret-note", "config.linkerd.io/*"))


def test_a_remote_discovery_mirror_is_what_linkerds_rules_make() -> None:
    svc = remote(labels={"app": "foo", "mirror.linkerd.io/exported": "remote-discovery",
                         "team": "a", "internal.io/x": "1", "tier": "web"},
                 annotations={"service.kubernetes.io/topology-mode": "Auto",
                              "secret-note": "x", "config.linkerd.io/opaque-ports": "3306",
                              "config.linkerd.io/other": "y", "kept": "z"},
                 ports=(ServicePort("http", 80, 8080, "TCP", "http"),
                        ServicePort("grpc", 9090, "grpc-port", "TCP")))
    body = mirror_service(svc, EAST)
    assert body["metadata"]["name"] == "foo-east" and body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["labels"] == {
        "app": "foo", "tier": "web", "mirror.linkerd.io/mirrored-service": "true",
        "mirror.linkerd.io/cluster-name": "east",
        "multicluster.linkerd.io/remote-discovery": "east",
        "multicluster.linkerd.io/remote-service": "foo"}
    assert body["metadata"]["annotations"] == {
        "config.linkerd.io/opaque-ports": "3306", "kept": "z",
        "mirror.linkerd.io/remote-svc-fq-name": "foo.ns.svc.east.example",
        "mirror.linkerd.io/remote-resource-version": "42"}
    # Ports without appProtocol (or nodePort), no selector, no type: a ClusterIP Service.
    assert body["spec"] == {"ports": [
        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
        {"name": "grpc", "protocol": "TCP", "port": 9090, "targetPort": "grpc-port"}]}


def test_a_federated_service_takes_the_oldest_links_metadata_and_lists_every_member() -> None:
    north = LinkRules("north", rank=1)
    east = LinkRules("east", rank=2)
    key = ServiceKey("ns", "foo")
    members = [FederatedMember(east, remote(labels={"from": "east"})),
               FederatedMember(north, remote(labels={"from": "north"},
                                             ports=(ServicePort("web", 8080, 80),)))]
    body = federated_service(key, members)
    assert body is not None
    assert body["metadata"]["name"] == "foo-federated"
    assert body["metadata"]["labels"] == {"from": "north",
                                          "mirror.linkerd.io/mirrored-service": "true"}
    assert body["metadata"]["annotations"] == {
        "multicluster.linkerd.io/remote-discovery": "foo@north,foo@east"}
    assert body["spec"]["ports"] == [{"name": "web", "protocol": "TCP", "port": 8080,
                                      "targetPort": 80}]
    # The local member is always the oldest; no cluster-name label on either.
    local = FederatedMember(LinkRules("", rank=0), remote(labels={"from": "local"}))
    body = federated_service(key, [*members, local])
    assert body is not None
    assert body["metadata"]["labels"]["from"] == "local"
    assert body["metadata"]["annotations"]["multicluster.linkerd.io/local-discovery"] == "foo"
    assert federated_service(key, []) is None


def test_headless_services_are_told_apart() -> None:
    assert is_headless(remote(headless=True)) and not is_headless(remote())


@pytest.mark.parametrize(("text", "labels", "matches"), [
    ("mirror.linkerd.io/exported=remote-discovery",
     {"mirror.linkerd.io/exported": "remote-discovery"}, True),
    ("mirror.linkerd.io/exported=remote-discovery", {"mirror.linkerd.io/exported": "true"},
     False),
    ("a=1,b=2", {"a": "1", "b": "2", "c": "3"}, True),
    ("a=1,b=2", {"a": "1"}, False),
    ("", {"anything": "x"}, False),  # empty matches nothing (Linkerd #11309)
])
def test_selectors(text: str, labels: dict[str, str], matches: bool) -> None:
    assert Selector.parse(text).matches(labels) is matches


def test_a_selector_that_is_not_key_value_is_refused() -> None:
    with pytest.raises(SelectorError, match="'oops' is not key=value"):
        Selector.parse("a=1,oops")


def test_a_mirror_is_rewritten_only_when_what_the_rules_set_differs() -> None:
    body = mirror_service(remote(), EAST)
    md = body["metadata"]
    same = Service(Meta("foo-east", "ns", "7", md["labels"], md["annotations"]),
                   ports=(ServicePort("http", 80, 8080, "TCP"),), cluster_ips=("10.96.1.1",))
    assert not differs(body, same)
    moved = Service(same.meta, ports=(ServicePort("http", 81, 8080, "TCP"),))
    assert differs(body, moved)
    relabelled = Service(Meta("foo-east", "ns", "7", {**md["labels"], "x": "1"},
                              md["annotations"]), ports=same.ports)
    assert differs(body, relabelled)
