"""The Linkerd destination API bindings: wire compatibility (their freshness against
the .proto files: tests/integration/test_generated_protos.py).

The tables below restate upstream's field tables (Linkerd §1.2-1.6)
(linkerd2-proxy-api v0.20.0). They are checked against the descriptors compiled from
linkerd_api/proto/*.proto, so any drift in a name, number, type, label or oneof fails.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from linkerd_api.proto import (
    destination_pb2,
    destination_pb2_grpc,
    http_types_pb2,
    meta_pb2,
    net_pb2,
)

DST = "io.linkerd.proxy.destination"
NET = "io.linkerd.proxy.net"
HTTP = "io.linkerd.proxy.http_types"
META = "io.linkerd.proxy.meta"
DURATION = "google.protobuf.Duration"
MAP_SS = "map<string,string>"


# ---------------------------------------------------------------------------
# Descriptor tables (Linkerd §1.2-1.6)
# ---------------------------------------------------------------------------

# Per message: (field name, number, type, oneof name or None). Type is a scalar name,
# "msg:<full name>", "enum:<full name>", MAP_SS; a leading "repeated " marks repeated.
FieldRow = tuple[str, int, str, str | None]

MESSAGES: dict[str, list[FieldRow]] = {
    f"{DST}.GetDestination": [
        ("scheme", 1, "string", None),
        ("path", 2, "string", None),
        ("context_token", 3, "string", None),
    ],
    f"{DST}.Update": [
        ("add", 1, f"msg:{DST}.WeightedAddrSet", "update"),
        ("remove", 2, f"msg:{DST}.AddrSet", "update"),
        ("no_endpoints", 3, f"msg:{DST}.NoEndpoints", "update"),
    ],
    f"{DST}.AddrSet": [
        ("addrs", 1, f"repeated msg:{NET}.TcpAddress", None),
    ],
    f"{DST}.WeightedAddrSet": [
        ("addrs", 1, f"repeated msg:{DST}.WeightedAddr", None),
        ("metric_labels", 2, MAP_SS, None),
    ],
    f"{DST}.WeightedAddr": [
        ("addr", 1, f"msg:{NET}.TcpAddress", None),
        ("weight", 3, "uint32", None),
        ("metric_labels", 4, MAP_SS, None),
        ("tls_identity", 5, f"msg:{DST}.TlsIdentity", None),
        ("protocol_hint", 6, f"msg:{DST}.ProtocolHint", None),
        ("authority_override", 7, f"msg:{DST}.AuthorityOverride", None),
        ("http2", 8, f"msg:{DST}.Http2ClientParams", None),
        ("resource_ref", 9, f"msg:{META}.Metadata", None),
    ],
    f"{DST}.TlsIdentity": [
        ("dns_like_identity", 1, f"msg:{DST}.TlsIdentity.DnsLikeIdentity", "strategy"),
        ("uri_like_identity", 3, f"msg:{DST}.TlsIdentity.UriLikeIdentity", "strategy"),
        ("server_name", 4, f"msg:{DST}.TlsIdentity.DnsLikeIdentity", None),
    ],
    f"{DST}.TlsIdentity.DnsLikeIdentity": [("name", 1, "string", None)],
    f"{DST}.TlsIdentity.UriLikeIdentity": [("uri", 1, "string", None)],
    f"{DST}.AuthorityOverride": [("authority_override", 1, "string", None)],
    f"{DST}.NoEndpoints": [("exists", 1, "bool", None)],
    f"{DST}.ProtocolHint": [
        ("h2", 1, f"msg:{DST}.ProtocolHint.H2", "protocol"),
        ("opaque", 3, f"msg:{DST}.ProtocolHint.Opaque", "protocol"),
        ("opaque_transport", 2, f"msg:{DST}.ProtocolHint.OpaqueTransport", None),
    ],
    f"{DST}.ProtocolHint.H2": [],
    f"{DST}.ProtocolHint.Opaque": [],
    f"{DST}.ProtocolHint.OpaqueTransport": [("inbound_port", 1, "uint32", None)],
    f"{DST}.Http2ClientParams": [
        ("flow_control", 1, f"msg:{DST}.Http2ClientParams.FlowControl", None),
        ("keep_alive", 2, f"msg:{DST}.Http2ClientParams.KeepAlive", None),
        ("internals", 3, f"msg:{DST}.Http2ClientParams.Internals", None),
    ],
    f"{DST}.Http2ClientParams.FlowControl": [
        ("initial_connection_window_size", 1, "uint32", None),
        ("initial_stream_window_size", 2, "uint32", None),
        ("adaptive_flow_control", 3, "bool", None),
    ],
    f"{DST}.Http2ClientParams.KeepAlive": [
        ("interval", 1, f"msg:{DURATION}", None),
        ("timeout", 2, f"msg:{DURATION}", None),
        ("while_idle", 3, "bool", None),
    ],
    f"{DST}.Http2ClientParams.Internals": [
        ("max_concurrent_reset_streams", 1, "uint32", None),
        ("max_frame_size", 2, "uint32", None),
        ("max_send_buf_size", 3, "uint32", None),
    ],
    f"{DST}.DestinationProfile": [
        ("routes", 1, f"repeated msg:{DST}.Route", None),
        ("retry_budget", 2, f"msg:{DST}.RetryBudget", None),
        ("dst_overrides", 3, f"repeated msg:{DST}.WeightedDst", None),
        ("opaque_protocol", 4, "bool", None),
        ("fully_qualified_name", 5, "string", None),
        ("endpoint", 6, f"msg:{DST}.WeightedAddr", None),
        ("parent_ref", 7, f"msg:{META}.Metadata", None),
        ("profile_ref", 8, f"msg:{META}.Metadata", None),
    ],
    f"{DST}.Route": [
        ("condition", 1, f"msg:{DST}.RequestMatch", None),
        ("response_classes", 2, f"repeated msg:{DST}.ResponseClass", None),
        ("metrics_labels", 3, MAP_SS, None),
        ("is_retryable", 4, "bool", None),
        ("timeout", 5, f"msg:{DURATION}", None),
    ],
    f"{DST}.RetryBudget": [
        ("retry_ratio", 1, "float", None),
        ("min_retries_per_second", 2, "uint32", None),
        ("ttl", 3, f"msg:{DURATION}", None),
    ],
    f"{DST}.ResponseClass": [
        ("condition", 1, f"msg:{DST}.ResponseMatch", None),
        ("is_failure", 2, "bool", None),
    ],
    f"{DST}.RequestMatch": [
        ("all", 1, f"msg:{DST}.RequestMatch.Seq", "match"),
        ("any", 2, f"msg:{DST}.RequestMatch.Seq", "match"),
        ("not", 3, f"msg:{DST}.RequestMatch", "match"),
        ("path", 4, f"msg:{DST}.PathMatch", "match"),
        ("method", 5, f"msg:{HTTP}.HttpMethod", "match"),
    ],
    f"{DST}.RequestMatch.Seq": [("matches", 1, f"repeated msg:{DST}.RequestMatch", None)],
    f"{DST}.PathMatch": [("regex", 1, "string", None)],
    f"{DST}.ResponseMatch": [
        ("all", 1, f"msg:{DST}.ResponseMatch.Seq", "match"),
        ("any", 2, f"msg:{DST}.ResponseMatch.Seq", "match"),
        ("not", 3, f"msg:{DST}.ResponseMatch", "match"),
        ("status", 4, f"msg:{DST}.HttpStatusRange", "match"),
    ],
    f"{DST}.ResponseMatch.Seq": [("matches", 1, f"repeated msg:{DST}.ResponseMatch", None)],
    f"{DST}.HttpStatusRange": [("min", 1, "uint32", None), ("max", 2, "uint32", None)],
    f"{DST}.WeightedDst": [
        ("authority", 1, "string", None),
        ("weight", 2, "uint32", None),
        ("backend_ref", 3, f"msg:{META}.Metadata", None),
    ],
    # net.proto
    f"{NET}.IPAddress": [
        ("ipv4", 1, "fixed32", "ip"),
        ("ipv6", 2, f"msg:{NET}.IPv6", "ip"),
    ],
    f"{NET}.IPNetwork": [
        ("ip", 1, f"msg:{NET}.IPAddress", None),
        ("prefix_len", 2, "uint32", None),
    ],
    f"{NET}.IPv6": [("first", 1, "fixed64", None), ("last", 2, "fixed64", None)],
    f"{NET}.TcpAddress": [
        ("ip", 1, f"msg:{NET}.IPAddress", None),
        ("port", 2, "uint32", None),
    ],
    # http_types.proto
    f"{HTTP}.HttpMethod": [
        ("registered", 1, f"enum:{HTTP}.HttpMethod.Registered", "type"),
        ("unregistered", 2, "string", "type"),
    ],
    f"{HTTP}.Scheme": [
        ("registered", 1, f"enum:{HTTP}.Scheme.Registered", "type"),
        ("unregistered", 2, "string", "type"),
    ],
    f"{HTTP}.Headers": [("headers", 1, f"repeated msg:{HTTP}.Headers.Header", None)],
    f"{HTTP}.Headers.Header": [("name", 1, "string", None), ("value", 2, "bytes", None)],
    # meta.proto
    f"{META}.Metadata": [
        ("default", 1, "string", "kind"),
        ("resource", 2, f"msg:{META}.Resource", "kind"),
    ],
    f"{META}.Resource": [
        ("group", 1, "string", None),
        ("kind", 2, "string", None),
        ("name", 3, "string", None),
        ("namespace", 4, "string", None),
        ("section", 5, "string", None),
        ("port", 6, "uint32", None),
    ],
}

ENUMS: dict[str, list[tuple[str, int]]] = {
    f"{HTTP}.HttpMethod.Registered": [
        ("GET", 0),
        ("POST", 1),
        ("PUT", 2),
        ("DELETE", 3),
        ("PATCH", 4),
        ("OPTIONS", 5),
        ("CONNECT", 6),
        ("HEAD", 7),
        ("TRACE", 8),
    ],
    f"{HTTP}.Scheme.Registered": [("HTTP", 0), ("HTTPS", 1)],
}

FILES: dict[str, tuple[Any, str, list[str]]] = {
    "destination.proto": (
        destination_pb2,
        DST,
        ["google/protobuf/duration.proto", "http_types.proto", "meta.proto", "net.proto"],
    ),
    "net.proto": (net_pb2, NET, []),
    "http_types.proto": (http_types_pb2, HTTP, []),
    "meta.proto": (meta_pb2, META, []),
}

_SCALARS: dict[int, str] = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_FIXED32: "fixed32",
    FieldDescriptor.TYPE_FIXED64: "fixed64",
}


def _describe(field: FieldDescriptor) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        mt = field.message_type
        assert mt is not None
        if mt.GetOptions().map_entry:
            key, value = mt.fields_by_name["key"], mt.fields_by_name["value"]
            return f"map<{_SCALARS[key.type]},{_SCALARS[value.type]}>"
        kind = f"msg:{mt.full_name}"
    elif field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        kind = f"enum:{field.enum_type.full_name}"
    else:
        kind = _SCALARS.get(field.type, f"<type {field.type}>")
    return f"repeated {kind}" if field.is_repeated else kind


def _all_messages(descs: Any) -> list[Descriptor]:
    out: list[Descriptor] = []
    for d in descs:
        if not d.GetOptions().map_entry:
            out.append(d)
            out += _all_messages(d.nested_types)
    return out


def _package_of(full_name: str) -> str:
    for pkg in (DST, NET, HTTP, META):
        if full_name.startswith(pkg + "."):
            return pkg
    raise AssertionError(full_name)


@pytest.mark.parametrize("full_name", sorted(MESSAGES))
def test_message_fields_match_spec(full_name: str) -> None:
    desc = _find_message(full_name)
    expected = {row[0]: row for row in MESSAGES[full_name]}
    assert sorted(f.name for f in desc.fields) == sorted(expected)
    for field in desc.fields:
        name, number, kind, oneof = expected[field.name]
        assert field.number == number, f"{full_name}.{name} number"
        assert _describe(field) == kind, f"{full_name}.{name} type"
        actual_oneof = field.containing_oneof.name if field.containing_oneof else None
        assert actual_oneof == oneof, f"{full_name}.{name} oneof"
    # proto3 `optional` would add synthetic oneofs; the spec has only real ones.
    assert sorted(o.name for o in desc.oneofs) == sorted(
        {row[3] for row in MESSAGES[full_name] if row[3] is not None}
    )


def _find_message(full_name: str) -> Descriptor:
    module = {pkg: mod for mod, pkg, _ in FILES.values()}[_package_of(full_name)]
    for d in _all_messages(module.DESCRIPTOR.message_types_by_name.values()):
        if d.full_name == full_name:
            return d
    raise AssertionError(f"message {full_name} not defined")


@pytest.mark.parametrize("file_name", sorted(FILES))
def test_files_define_exactly_the_spec_messages(file_name: str) -> None:
    module, package, deps = FILES[file_name]
    fd = module.DESCRIPTOR
    assert fd.name == file_name
    assert fd.package == package
    fdp = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(fdp)
    assert fdp.syntax == "proto3"
    assert [d.name for d in fd.dependencies] == deps
    defined = {d.full_name for d in _all_messages(fd.message_types_by_name.values())}
    assert defined == {m for m in MESSAGES if _package_of(m) == package}


@pytest.mark.parametrize("full_name", sorted(ENUMS))
def test_enum_values_match_spec(full_name: str) -> None:
    message_name, enum_name = full_name.rsplit(".", 1)
    enum = _find_message(message_name).enum_types_by_name[enum_name]
    assert [(v.name, v.number) for v in enum.values] == ENUMS[full_name]


def _reserved(message: str) -> tuple[list[tuple[int, int]], list[str]]:
    fdp = descriptor_pb2.FileDescriptorProto()
    destination_pb2.DESCRIPTOR.CopyToProto(fdp)
    (proto,) = [m for m in fdp.message_type if m.name == message]
    return [(r.start, r.end) for r in proto.reserved_range], list(proto.reserved_name)


def test_reserved_entries_match_spec() -> None:
    # `reserved 2; reserved "k8s_pod_identity";` (ranges are end-exclusive).
    assert _reserved("TlsIdentity") == ([(2, 3)], ["k8s_pod_identity"])
    # WeightedAddr skips field 2 but does not reserve it.
    assert _reserved("WeightedAddr") == ([], [])


# ---------------------------------------------------------------------------
# Service
# ---------------------------------------------------------------------------


def test_service_and_method_paths() -> None:
    service = destination_pb2.DESCRIPTOR.services_by_name["Destination"]
    assert service.full_name == "io.linkerd.proxy.destination.Destination"
    paths = {m.name: f"/{service.full_name}/{m.name}" for m in service.methods}
    assert paths == {
        "Get": "/io.linkerd.proxy.destination.Destination/Get",
        "GetProfile": "/io.linkerd.proxy.destination.Destination/GetProfile",
    }
    get, profile = service.methods_by_name["Get"], service.methods_by_name["GetProfile"]
    assert get.input_type.full_name == f"{DST}.GetDestination"
    assert get.output_type.full_name == f"{DST}.Update"
    assert profile.input_type.full_name == f"{DST}.GetDestination"
    assert profile.output_type.full_name == f"{DST}.DestinationProfile"
    for m in (get, profile):
        assert m.server_streaming and not m.client_streaming


class _RecordingChannel:
    """Stands in for grpc.Channel; records which multicallables the stub creates."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def _record(self, kind: str) -> Callable[..., object]:
        def make(method: str, *args: object, **kwargs: object) -> object:
            self.calls.append((kind, method))
            return object()

        return make

    def __getattr__(self, kind: str) -> Callable[..., object]:
        return self._record(kind)


def test_grpc_stub_uses_spec_paths() -> None:
    channel = _RecordingChannel()
    destination_pb2_grpc.DestinationStub(channel)
    assert sorted(channel.calls) == [
        ("unary_stream", "/io.linkerd.proxy.destination.Destination/Get"),
        ("unary_stream", "/io.linkerd.proxy.destination.Destination/GetProfile"),
    ]


# ---------------------------------------------------------------------------
# Wire encoding
# ---------------------------------------------------------------------------


def test_update_add_ipv4_wire_roundtrip() -> None:
    ip = ipaddress.IPv4Address("172.17.0.12")
    update = destination_pb2.Update(
        add=destination_pb2.WeightedAddrSet(
            addrs=[
                destination_pb2.WeightedAddr(
                    addr=net_pb2.TcpAddress(ip=net_pb2.IPAddress(ipv4=int(ip)), port=8080),
                    weight=10000,
                )
            ]
        )
    )
    wire = update.SerializeToString()
    # Hand-encoded: Update.add(1) > WeightedAddrSet.addrs(1) > WeightedAddr{addr(1), weight(3)}
    # > TcpAddress{ip(1), port(2)} > IPAddress.ipv4(1, fixed32, little-endian on the wire).
    ip_addr = bytes([0x0D]) + (0xAC11000C).to_bytes(4, "little")
    tcp = b"\x0a\x05" + ip_addr + b"\x10\x90\x3f"  # port 8080 as varint
    waddr = b"\x0a\x0a" + tcp + b"\x18\x90\x4e"  # weight 10000 as varint
    wset = b"\x0a\x0f" + waddr
    assert wire == b"\x0a\x11" + wset

    decoded = destination_pb2.Update.FromString(wire)
    assert decoded.WhichOneof("update") == "add"
    (addr,) = decoded.add.addrs
    assert addr.addr.ip.WhichOneof("ip") == "ipv4"
    assert addr.addr.ip.ipv4 == 0xAC11000C == 2886795276
    assert ipaddress.IPv4Address(addr.addr.ip.ipv4) == ip
    assert addr.addr.port == 8080
    assert addr.weight == 10000


def test_ipv6_first_last_split_roundtrip() -> None:
    ip = ipaddress.IPv6Address("2001:db8::68")
    packed = ip.packed
    first = int.from_bytes(packed[:8], "big")
    last = int.from_bytes(packed[8:], "big")
    assert (first, last) == (0x20010DB800000000, 0x0000000000000068)

    msg = net_pb2.IPAddress(ipv6=net_pb2.IPv6(first=first, last=last))
    wire = msg.SerializeToString()
    inner = b"\x09" + first.to_bytes(8, "little") + b"\x11" + last.to_bytes(8, "little")
    assert wire == b"\x12" + bytes([len(inner)]) + inner

    decoded = net_pb2.IPAddress.FromString(wire)
    assert decoded.WhichOneof("ip") == "ipv6"
    rebuilt = decoded.ipv6.first.to_bytes(8, "big") + decoded.ipv6.last.to_bytes(8, "big")
    assert ipaddress.IPv6Address(rebuilt) == ip


def test_protocol_hint_opaque_transport_is_outside_the_oneof() -> None:
    hint = destination_pb2.ProtocolHint(
        opaque=destination_pb2.ProtocolHint.Opaque(),
        opaque_transport=destination_pb2.ProtocolHint.OpaqueTransport(inbound_port=4143),
    )
    decoded = destination_pb2.ProtocolHint.FromString(hint.SerializeToString())
    assert decoded.WhichOneof("protocol") == "opaque"
    assert decoded.opaque_transport.inbound_port == 4143
