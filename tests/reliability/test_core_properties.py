"""Property-based tests for the core's parsers and decoders: random input never breaks
them, and well-formed input always round-trips."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.authority import AuthorityError, format_authority, parse_authority, view_authority
from bridge.cluster import Cluster, Event, EventType
from bridge.model import MeshConfig, ServiceKey, ViewKey
from bridge.objects import ObjectError, decode_object
from bridge.port_sets import PortSpecError, parse_port_set
from bridge.views import ViewRegistry

LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
DOMAIN = st.sampled_from(["cluster.local", "example.org", "c.d.e"])


@given(LABEL, LABEL, st.integers(1, 65535), DOMAIN)
def test_every_canonical_authority_parses_and_round_trips(
    svc: str, ns: str, port: int, domain: str
) -> None:
    authority = format_authority(ServiceKey(ns, svc), port, domain)
    assert authority == f"{svc}.{ns}.svc.{domain}:{port}"  # the grammar, spelled out
    key = parse_authority(authority, domain)
    assert key.service == ServiceKey(ns, svc) and key.port == port
    assert view_authority(key, domain) == authority


@given(st.text(max_size=300), DOMAIN)
def test_arbitrary_authorities_parse_or_fail_with_a_reason(text: str, domain: str) -> None:
    try:
        key = parse_authority(text, domain)
    except AuthorityError as e:
        assert str(e)
    else:
        assert 1 <= key.port <= 65535
        assert key.service.name and key.service.namespace


@given(st.text(alphabet="0123456789,- abc", max_size=40))
def test_port_sets_parse_into_valid_ports_or_fail_cleanly(text: str) -> None:
    try:
        ports = parse_port_set(text)
    except PortSpecError:
        return
    assert all(1 <= p <= 65535 for p in ports)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=5),
    max_leaves=25,
)
KINDS = st.sampled_from(["Service", "EndpointSlice", "Endpoints", "Pod", "Node", "ReplicaSet",
                         "Server", "ServiceProfile", "Namespace", "Gadget"])


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    """Objects shaped like Kubernetes manifests, with random (often wrong) contents."""
    raw: dict[str, Any] = {"kind": draw(KINDS),
                           "metadata": draw(st.one_of(JSONISH, st.fixed_dictionaries(
                               {"name": LABEL, "namespace": LABEL},
                               optional={"labels": JSONISH, "annotations": JSONISH})))}
    for key in ("spec", "status", "endpoints", "ports", "addressType", "subsets"):
        if draw(st.booleans()):
            raw[key] = draw(JSONISH)
    return raw


@settings(max_examples=400)
@given(manifests())
def test_decoding_never_raises_anything_but_an_object_error(raw: dict[str, Any]) -> None:
    try:
        decode_object(raw)
    except ObjectError as e:
        assert e.kind and e.name


@settings(max_examples=150)
@given(st.lists(manifests(), max_size=12))
def test_whatever_decodes_can_be_applied_and_served(raws: list[dict[str, Any]]) -> None:
    cluster = Cluster()
    registry = ViewRegistry(cluster, MeshConfig())
    objs = []
    for raw in raws:
        try:
            obj = decode_object(raw)
        except ObjectError:
            continue
        if obj is not None:
            objs.append(obj)
    cluster.apply(Event(EventType.ADDED, o) for o in objs)
    for key, svc in list(cluster.services.items()):
        for sp in svc.ports:
            _, merged = registry.merge_endpoints(key, sp.port)
            registry.filter_endpoints(ViewKey(key, sp.port), merged)
    cluster.apply(Event(EventType.DELETED, o) for o in objs)
    assert not cluster.services and not cluster.slices and not cluster.pods
