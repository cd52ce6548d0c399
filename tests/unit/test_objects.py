"""Decoding Kubernetes objects: what we use is checked, every bad case named."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.objects import EndpointSlice, ObjectError, Pod, Service, decode_object
from testkit.builders import endpoint, endpoint_slice, pod, service


def broken(raw: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    target: Any = raw
    for step in path[:-1]:
        target = target[step]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


DELETE = object()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"kind": "Gadget", "metadata": {"name": "g"}}, "unsupported kind"),
        ({"metadata": {"name": "x"}}, "kind is missing"),
        ({"kind": "Service"}, "metadata is missing"),
        ({"kind": "Service", "metadata": {"namespace": "a"}}, "metadata.name is missing"),
        (broken(service("web"), ["spec", "ports", 0, "port"], "eighty"), "port number"),
        (broken(service("web"), ["spec", "ports", 0, "port"], 70000), "out of range"),
        (broken(service("web"), ["spec", "ports"], {"port": 80}), "must be a list"),
        (broken(endpoint_slice("s", "web", [endpoint("10.0.0.1", "p")]),
                ["endpoints", 0, "addresses", 0], "10.0.0.300"), "not an IP address"),
        (endpoint_slice("s", "web", [endpoint("fd00::1", "p")]), "is not IPv4"),
        (endpoint_slice("s", "web", [], family="FQDN"), "addressType 'FQDN'"),
        (broken(endpoint_slice("s", "web", []), ["metadata", "labels"], {}),
         "no kubernetes.io/service-name label"),
        (broken(endpoint_slice("s", "web", [endpoint("10.0.0.1", "p")]),
                ["endpoints", 0, "conditions", "ready"], "yes"), "true or false"),
        (broken(endpoint_slice("s", "web", [endpoint("10.0.0.1", "p")]),
                ["endpoints", 0, "addresses"], []), "has no addresses"),
        (broken(pod("p", "10.0.0.1"), ["status"], {"phase": "Pending"}), "has no IP"),
        (broken(pod("p", "10.0.0.1"), ["spec", "containers", 0, "ports", 0, "containerPort"],
                -1), "containerPort -1 is out of range"),
        ({"kind": "Server", "metadata": {"name": "s", "namespace": "a"},
          "spec": {"port": True}}, "spec.port"),
        (broken(service("web"), ["metadata", "labels"], {"a": ["b"]}), "must be a string"),
    ],
)
def test_bad_objects_are_rejected_with_the_field_named(raw: dict[str, Any], reason: str) -> None:
    with pytest.raises(ObjectError) as err:
        decode_object(raw)
    assert reason in str(err.value)


def test_ignored_kinds_decode_to_none() -> None:
    assert decode_object({"kind": "Deployment", "metadata": {"name": "d"}}) is None


def test_service_decodes_ports_and_cluster_ips() -> None:
    raw = service("web", ports=[{"name": "http", "port": 80, "targetPort": "http",
                                 "appProtocol": "kubernetes.io/h2c"}],
                  clusterIPs=["10.96.0.10", "fd00:96::a"], internalTrafficPolicy="Local")
    svc = decode_object(raw)
    assert isinstance(svc, Service)
    assert svc.cluster_ips == ("10.96.0.10", "fd00:96::a")
    assert svc.internal_traffic_local
    assert svc.port(80) is not None and svc.port(80).app_protocol == "kubernetes.io/h2c"  # type: ignore[union-attr]
    assert svc.port(81) is None


def test_slice_condition_defaults_follow_the_endpointslice_api() -> None:
    raw = endpoint_slice("s", "web", [endpoint("10.0.0.1", "p", ready=None)])
    sl = decode_object(raw)
    assert isinstance(sl, EndpointSlice)
    (ep,) = sl.endpoints
    assert (ep.ready, ep.serving, ep.terminating) == (True, True, False)


def test_slice_owned_by_a_service_needs_no_label() -> None:
    raw = endpoint_slice("s", "web", [])
    raw["metadata"]["labels"] = {}
    raw["metadata"]["ownerReferences"] = [{"kind": "Service", "name": "web"}]
    sl = decode_object(raw)
    assert isinstance(sl, EndpointSlice) and sl.service_name == "web"


def test_v1_endpoints_decode_as_a_family_less_slice_with_not_ready_addresses() -> None:
    raw = {
        "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "app"},
        "subsets": [{
            "addresses": [{"ip": "10.0.0.1", "targetRef": {"kind": "Pod", "name": "a"}}],
            "notReadyAddresses": [{"ip": "10.0.0.2"}],
            "ports": [{"name": "http", "port": 8080}],
        }],
    }
    sl = decode_object(raw)
    assert isinstance(sl, EndpointSlice)
    assert (sl.kind, sl.address_type, sl.service_name) == ("Endpoints", "", "web")
    assert [(e.addresses, e.ready) for e in sl.endpoints] == [
        (("10.0.0.1",), True), (("10.0.0.2",), False)]
    assert sl.endpoints[0].target is not None and sl.endpoints[0].target.namespace == "app"


def test_pod_ips_are_normalised() -> None:
    p = decode_object(pod("p", ["10.0.0.1", "FD00:0::1"]))
    assert isinstance(p, Pod)
    assert p.pod_ips == ("10.0.0.1", "fd00::1")
