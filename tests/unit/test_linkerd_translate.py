"""From View versions to `Update` bytes: address encoding, WeightedAddr content, the
Linkerd readiness projection, both semantics, and encode-once (Linkerd §1.3, §2.5, §3)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.cluster import Cluster
from bridge.model import FilterKey, MeshConfig, ServiceKey, ViewKey
from bridge.views import View, ViewChange, ViewRegistry
from linkerd_api.endpoint_streams import Semantics, UpdateEncoder
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.proto import net_pb2 as net
from linkerd_api.translate import Translator, address_text, http2_params, tcp_address
from testkit.builders import delete, endpoint, endpoint_slice, load, node, pod, service

KEY = ViewKey(ServiceKey("app", "web"), 80)


# ------------------------------------------------------------------ addresses


def test_ipv4_is_a_big_endian_fixed32() -> None:
    addr = tcp_address("172.17.0.12", 8080)
    assert addr.ip.ipv4 == 0xAC11000C == 2886795276
    # fixed32 on the wire: tag 1, wire type 5, then four little-endian bytes.
    assert addr.ip.SerializeToString() == b"\x0d" + (0xAC11000C).to_bytes(4, "little")


def test_ipv6_is_two_big_endian_halves() -> None:
    addr = tcp_address("2001:db8::68", 443)
    assert addr.ip.ipv6.first == 0x20010DB800000000
    assert addr.ip.ipv6.last == 0x68
    assert address_text(addr) == "[2001:db8::68]:443"


def test_an_ipv4_mapped_ipv6_address_stays_ipv6() -> None:
    assert tcp_address("::ffff:1.2.3.4", 80).ip.WhichOneof("ip") == "ipv6"


def test_address_text_round_trips() -> None:
    for ip in ("10.244.1.10", "fd00:10:244::1:30"):
        text = address_text(tcp_address(ip, 8080))
        assert text in (f"{ip}:8080", f"[{ip}]:8080")
    assert address_text(net.TcpAddress(port=1)) == "<no ip>:1"


# ------------------------------------------------------------------ a small cluster


class Recorder:
    """A View subscriber that keeps what the encoder says for each version."""

    def __init__(self, encoder: UpdateEncoder) -> None:
        self.encoder = encoder
        self.messages: list[bytes] = []

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.messages.extend(m for _, m in self.encoder.diff(view, change))

    def updates(self) -> list[dst.Update]:
        out = [dst.Update.FromString(m) for m in self.messages]
        self.messages.clear()
        return out


def make(semantics: Semantics = "proto", config: MeshConfig | None = None,
         ) -> tuple[Cluster, ViewRegistry, UpdateEncoder]:
    config = config or MeshConfig()
    cluster = Cluster()
    registry = ViewRegistry(cluster, config)
    return cluster, registry, UpdateEncoder(Translator(config), semantics)


def web(*eps: dict[str, Any], name: str = "web-1") -> dict[str, Any]:
    return endpoint_slice(name, "web", list(eps))


def subscribe(registry: ViewRegistry, encoder: UpdateEncoder, key: ViewKey = KEY,
              ) -> tuple[View, Recorder, list[dst.Update]]:
    rec = Recorder(encoder)
    view = registry.subscribe(key, rec, "linkerd")
    first = [dst.Update.FromString(m) for _, m in encoder.snapshot(view)]
    return view, rec, first


def addrs(update: dst.Update) -> list[str]:
    which = update.WhichOneof("update")
    if which == "add":
        return sorted(address_text(a.addr) for a in update.add.addrs)
    if which == "remove":
        return sorted(address_text(a) for a in update.remove.addrs)
    return [f"no_endpoints(exists={update.no_endpoints.exists})"]


def shape(updates: list[dst.Update]) -> list[tuple[str | None, list[str]]]:
    return [(u.WhichOneof("update"), addrs(u)) for u in updates]


def draining(ip: str, pod_name: str, **extra: Any) -> dict[str, Any]:
    """An endpoint that is terminating but still serving: ready=false."""
    return endpoint(ip, pod_name, ready=None,
                    conditions={"ready": False, "serving": True, "terminating": True}, **extra)


def two_pods(cluster: Cluster) -> None:
    load(cluster, service("web"), pod("web-a", "10.0.0.1"), pod("web-b", "10.0.0.2"),
         web(endpoint("10.0.0.1", "web-a"), endpoint("10.0.0.2", "web-b")))


# ------------------------------------------------------------------ projection


@pytest.mark.parametrize("semantics", ["proto", "linkerd-2.20"])
def test_the_first_message_is_one_add_of_every_ready_endpoint(semantics: Semantics) -> None:
    cluster, registry, encoder = make(semantics)
    load(cluster, service("web"), pod("web-a", "10.0.0.1"), pod("web-b", "10.0.0.2"),
         pod("web-c", "10.0.0.3"),
         web(endpoint("10.0.0.1", "web-a"), endpoint("10.0.0.2", "web-b"),
             endpoint("10.0.0.3", "web-c", ready=False)))
    _, _, first = subscribe(registry, encoder)
    assert shape(first) == [("add", ["10.0.0.1:8080", "10.0.0.2:8080"])]
    assert dict(first[0].add.metric_labels) == {"service": "web", "namespace": "app"}


def test_an_endpoint_that_stops_being_ready_but_still_serves_is_removed() -> None:
    cluster, registry, encoder = make()
    two_pods(cluster)
    view, rec, _ = subscribe(registry, encoder)
    # Terminating but serving: the View keeps it (for xDS DRAINING); Linkerd drops it.
    load(cluster, web(endpoint("10.0.0.1", "web-a"), draining("10.0.0.2", "web-b")))
    assert len(view.snapshot) == 2
    assert shape(rec.updates()) == [("remove", ["10.0.0.2:8080"])]


def test_a_draining_endpoint_that_changes_again_sends_nothing() -> None:
    cluster, registry, encoder = make()
    two_pods(cluster)
    view, rec, _ = subscribe(registry, encoder)
    load(cluster, web(endpoint("10.0.0.1", "web-a"), draining("10.0.0.2", "web-b")))
    assert len(rec.updates()) == 1
    version = view.version
    load(cluster, web(endpoint("10.0.0.1", "web-a"), draining("10.0.0.2", "web-b",
                                                               zone="zone-b")))
    assert view.version == version + 1  # the View changed; Linkerd's projection did not
    assert rec.updates() == []


def test_a_change_sends_add_before_remove() -> None:
    cluster, registry, encoder = make()
    two_pods(cluster)
    _, rec, _ = subscribe(registry, encoder)
    load(cluster, pod("web-c", "10.0.0.3"),
         web(endpoint("10.0.0.1", "web-a"), endpoint("10.0.0.3", "web-c")))
    assert shape(rec.updates()) == [("add", ["10.0.0.3:8080"]), ("remove", ["10.0.0.2:8080"])]


def test_a_pod_whose_address_changes_is_removed_at_its_old_address() -> None:
    cluster, registry, encoder = make()
    two_pods(cluster)
    _, rec, _ = subscribe(registry, encoder)
    load(cluster, pod("web-b", "10.0.0.9", rv="2"),
         web(endpoint("10.0.0.1", "web-a"), endpoint("10.0.0.9", "web-b")))
    assert shape(rec.updates()) == [("add", ["10.0.0.9:8080"]), ("remove", ["10.0.0.2:8080"])]


def test_an_address_still_held_by_another_endpoint_is_not_removed() -> None:
    cluster, registry, encoder = make()
    # Two pods swap addresses in one change: both are re-added, neither removed.
    two_pods(cluster)
    _, rec, _ = subscribe(registry, encoder)
    load(cluster, pod("web-a", "10.0.0.2", rv="2"), pod("web-b", "10.0.0.1", rv="2"),
         web(endpoint("10.0.0.2", "web-a"), endpoint("10.0.0.1", "web-b")))
    assert shape(rec.updates()) == [("add", ["10.0.0.1:8080", "10.0.0.2:8080"])]


def test_a_not_ready_endpoint_appearing_sends_nothing() -> None:
    cluster, registry, encoder = make()
    two_pods(cluster)
    view, rec, _ = subscribe(registry, encoder)
    version = view.version
    load(cluster, pod("web-c", "10.0.0.3"),
         web(endpoint("10.0.0.1", "web-a"), endpoint("10.0.0.2", "web-b"),
             draining("10.0.0.3", "web-c")))
    assert view.version == version + 1
    assert rec.updates() == []


# ------------------------------------------------------------------ semantics


def test_proto_semantics_say_no_endpoints_when_the_set_becomes_empty() -> None:
    cluster, registry, encoder = make("proto")
    two_pods(cluster)
    _, rec, _ = subscribe(registry, encoder)
    load(cluster, web())
    assert shape(rec.updates()) == [("remove", ["10.0.0.1:8080", "10.0.0.2:8080"]),
                                    ("no_endpoints", ["no_endpoints(exists=True)"])]


def test_linkerd_2_20_semantics_only_remove_when_the_set_becomes_empty() -> None:
    cluster, registry, encoder = make("linkerd-2.20")
    two_pods(cluster)
    _, rec, _ = subscribe(registry, encoder)
    load(cluster, web())
    assert shape(rec.updates()) == [("remove", ["10.0.0.1:8080", "10.0.0.2:8080"])]


@pytest.mark.parametrize(("semantics", "first"), [
    ("proto", [("no_endpoints", ["no_endpoints(exists=True)"])]),
    ("linkerd-2.20", []),
])
def test_an_existing_service_without_ready_endpoints(semantics: Semantics, first: Any) -> None:
    cluster, registry, encoder = make(semantics)
    load(cluster, service("web"), pod("web-a", "10.0.0.1"),
         web(endpoint("10.0.0.1", "web-a", ready=False)))
    _, _, got = subscribe(registry, encoder)
    assert shape(got) == first


@pytest.mark.parametrize(("semantics", "first", "appear", "gone"), [
    ("proto", [("no_endpoints", ["no_endpoints(exists=False)"])],
     [("add", ["10.0.0.1:8080", "10.0.0.2:8080"])],
     [("remove", ["10.0.0.1:8080", "10.0.0.2:8080"]),
      ("no_endpoints", ["no_endpoints(exists=False)"])]),
    ("linkerd-2.20", [], [("add", ["10.0.0.1:8080", "10.0.0.2:8080"])],
     [("remove", ["10.0.0.1:8080", "10.0.0.2:8080"])]),
])
def test_a_service_appearing_and_disappearing(semantics: Semantics, first: Any, appear: Any,
                                              gone: Any) -> None:
    cluster, registry, encoder = make(semantics)
    _, rec, got = subscribe(registry, encoder)
    assert shape(got) == first
    two_pods(cluster)
    assert shape(rec.updates()) == appear
    delete(cluster, service("web"))
    assert shape(rec.updates()) == gone


def test_proto_semantics_tell_when_a_missing_service_appears_empty() -> None:
    cluster, registry, encoder = make("proto")
    _, rec, _ = subscribe(registry, encoder)
    load(cluster, service("web"))
    assert shape(rec.updates()) == [("no_endpoints", ["no_endpoints(exists=True)"])]
    delete(cluster, service("web"))
    assert shape(rec.updates()) == [("no_endpoints", ["no_endpoints(exists=False)"])]


# ------------------------------------------------------------------ encode once


def test_every_subscriber_of_a_view_gets_the_same_bytes_encoded_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, registry, encoder = make()
    two_pods(cluster)
    recs = [subscribe(registry, encoder)[1] for _ in range(50)]
    calls = {"add": 0, "remove": 0}
    for name in calls:
        real = getattr(encoder.translator, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> bytes:
            calls[_name] += 1
            result: bytes = _real(*args)
            return result

        monkeypatch.setattr(encoder.translator, name, counted)
    load(cluster, pod("web-c", "10.0.0.3"),
         web(endpoint("10.0.0.1", "web-a"), endpoint("10.0.0.3", "web-c")))
    assert calls == {"add": 1, "remove": 1}
    first = recs[0].messages
    assert all(r.messages[i] is first[i] for r in recs for i in range(2))


def test_subscribers_with_different_nodes_get_their_own_zone_locality() -> None:
    cluster, registry, encoder = make()
    load(cluster, node("node-a", "zone-a"), node("node-b", "zone-b"))
    two_pods(cluster)
    for node_name, locality in (("node-a", "local"), ("node-b", "remote"), ("", "unknown")):
        key = ViewKey(KEY.service, 80, FilterKey(node_name=node_name))
        _, _, first = subscribe(registry, encoder, key)
        labels = {a.metric_labels["zone_locality"] for a in first[0].add.addrs}
        assert labels == {locality}, node_name


# ------------------------------------------------------------------ WeightedAddr


def first_addr(cluster: Cluster, registry: ViewRegistry, encoder: UpdateEncoder,
               key: ViewKey = KEY) -> dst.WeightedAddr:
    _, _, first = subscribe(registry, encoder, key)
    assert len(first) == 1 and len(first[0].add.addrs) == 1, first
    addr: dst.WeightedAddr = first[0].add.addrs[0]
    return addr


def test_a_meshed_pod_carries_identity_hint_transport_and_http2_params() -> None:
    cluster, registry, encoder = make()
    load(cluster, service("web"), pod("web-a", "10.0.0.1", sa="web-sa", rv="7",
                                      labels={"pod-template-hash": "abc"},
                                      owner=("ReplicaSet", "web-abc")),
         web(endpoint("10.0.0.1", "web-a")))
    wa = first_addr(cluster, registry, encoder)
    ident = "web-sa.app.serviceaccount.identity.linkerd.cluster.local"
    assert wa.tls_identity.dns_like_identity.name == ident
    assert wa.tls_identity.server_name.name == ident
    assert wa.protocol_hint.WhichOneof("protocol") == "h2"
    assert wa.protocol_hint.opaque_transport.inbound_port == 4143
    assert wa.http2.keep_alive.interval.seconds == 10
    assert wa.http2.keep_alive.timeout.seconds == 3
    assert wa.http2.keep_alive.while_idle is True
    assert wa.weight == 10000
    assert dict(wa.metric_labels) == {
        "pod": "web-a", "replicaset": "web-abc", "serviceaccount": "web-sa",
        "control_plane_ns": "linkerd", "pod_template_hash": "abc", "zone": "zone-a",
        "zone_locality": "unknown"}


def test_an_opaque_port_is_hinted_opaque_with_transport() -> None:
    cluster, registry, encoder = make()
    load(cluster, service("web"),
         pod("web-a", "10.0.0.1", annotations={"config.linkerd.io/opaque-ports": "8080"}),
         web(endpoint("10.0.0.1", "web-a")))
    hint = first_addr(cluster, registry, encoder).protocol_hint
    assert hint.WhichOneof("protocol") == "opaque"
    assert hint.opaque_transport.inbound_port == 4143


def test_a_meshed_pod_in_transparent_mode_without_h2_upgrade_has_an_empty_hint() -> None:
    cluster, registry, encoder = make(config=MeshConfig(force_opaque_transport=False,
                                                        enable_h2_upgrade=False))
    load(cluster, service("web"), pod("web-a", "10.0.0.1"), web(endpoint("10.0.0.1", "web-a")))
    wa = first_addr(cluster, registry, encoder)
    # Present though empty: a meshed pod port always has a hint (Linkerd §3.3).
    assert wa.HasField("protocol_hint")
    assert wa.protocol_hint.WhichOneof("protocol") is None
    assert not wa.protocol_hint.HasField("opaque_transport")


@pytest.mark.parametrize("case", ["unmeshed", "skipped"])
def test_unmeshed_and_skipped_ports_get_no_identity_hint_or_http2(case: str) -> None:
    cluster, registry, encoder = make()
    p = pod("web-a", "10.0.0.1", meshed=case != "unmeshed",
            annotations={"config.linkerd.io/skip-inbound-ports": "8080"}
            if case == "skipped" else None)
    load(cluster, service("web"), p, web(endpoint("10.0.0.1", "web-a")))
    wa = first_addr(cluster, registry, encoder)
    for field in ("tls_identity", "protocol_hint", "http2"):
        assert not wa.HasField(field), field
    assert wa.metric_labels["pod"] == "web-a" and wa.weight == 10000


def test_a_gateway_address_has_identity_without_sni_an_h2_hint_and_an_authority() -> None:
    cluster, registry, encoder = make()
    mirrored = endpoint_slice("web-remote", "web", [endpoint("192.0.2.1", None, zone=None)],
                              annotations={
                                  "mirror.linkerd.io/remote-gateway-identity": "gw.identity",
                                  "mirror.linkerd.io/remote-svc-fq-name":
                                      "web.app.svc.east.example"})
    mirrored["metadata"]["labels"]["mirror.linkerd.io/cluster-name"] = "east"
    load(cluster, service("web"), mirrored)
    _, _, first = subscribe(registry, encoder)
    wa = first[0].add.addrs[0]
    assert wa.tls_identity.dns_like_identity.name == "gw.identity"
    assert not wa.tls_identity.HasField("server_name")
    assert wa.protocol_hint.WhichOneof("protocol") == "h2"
    assert not wa.protocol_hint.HasField("opaque_transport")
    assert wa.authority_override.authority_override == "web.app.svc.east.example:80"
    assert wa.HasField("http2")
    assert dict(wa.metric_labels) == {"zone_locality": "unknown"}
    assert dict(first[0].add.metric_labels) == {
        "service": "web", "namespace": "app", "target_cluster": "east",
        "target_service": "web", "target_service_namespace": "app"}


def test_a_gateway_address_without_h2_upgrade_has_no_hint() -> None:
    cluster, registry, encoder = make(config=MeshConfig(enable_h2_upgrade=False))
    load(cluster, service("web"), endpoint_slice(
        "web-remote", "web", [endpoint("192.0.2.1", None, zone=None)],
        annotations={"mirror.linkerd.io/remote-gateway-identity": "gw.identity"}))
    assert not first_addr(cluster, registry, encoder).HasField("protocol_hint")


def test_no_http2_params_configured_means_none_sent() -> None:
    cluster, registry, encoder = make(config=MeshConfig(meshed_http2_params=None))
    load(cluster, service("web"), pod("web-a", "10.0.0.1"), web(endpoint("10.0.0.1", "web-a")))
    assert not first_addr(cluster, registry, encoder).HasField("http2")


@pytest.mark.parametrize(("params", "expected"), [
    # Go encoding/json shape, as Linkerd's flag takes it...
    ({"keep_alive": {"interval": {"seconds": 10, "nanos": 500000000}}},
     ("keep_alive", "interval", 10, 500000000)),
    # ...and proto-JSON, for those who write that.
    ({"keep_alive": {"timeout": "3s"}}, ("keep_alive", "timeout", 3, 0)),
    ({"flow_control": {"initial_stream_window_size": 65535}},
     ("flow_control", "initial_stream_window_size", 65535, None)),
])
def test_http2_params_are_read_in_both_json_shapes(params: Any, expected: Any) -> None:
    msg = http2_params(MeshConfig(meshed_http2_params=params))
    assert msg is not None
    group, field, a, b = expected
    value = getattr(getattr(msg, group), field)
    if b is None:
        assert value == a
    else:
        assert (value.seconds, value.nanos) == (a, b)


def test_bad_http2_params_name_the_field() -> None:
    with pytest.raises(ValueError, match="keep_alive"):
        http2_params(MeshConfig(meshed_http2_params={"keep_alive": {"intervall": 1}}))
