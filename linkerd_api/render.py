"""Destination messages for people (one line per endpoint) and for scripts (one JSON
object per message), shared by `meshbridge get` and `meshbridge profile`.

JSON is the proto3 JSON mapping with the proto field names, except that every
`TcpAddress.ip` is written as text (`"10.244.1.12"`, `"fd00::1"`) instead of
Linkerd's integer encoding, so the output can be read and grepped.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from linkerd_api.authority import parse_context_token
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.proto import http_types_pb2 as http
from linkerd_api.translate import address_text
from meshbridge.client_tls import add_tls_arguments, sync_channel

DEFAULT_SERVER = "127.0.0.1:8086"


# --------------------------------------------------------------------- JSON


def to_dict(message: Message) -> Any:
    return _texts(MessageToDict(message, preserving_proto_field_name=True))


def to_json(message: Message) -> str:
    return json.dumps(to_dict(message), sort_keys=True)


def _texts(value: Any) -> Any:
    if isinstance(value, list):
        return [_texts(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _texts(v) for k, v in value.items()}
    ip = value.get("ip")
    if isinstance(ip, dict) and ("ipv4" in ip or "ipv6" in ip) and len(ip) == 1:
        out["ip"] = _ip_text(ip)
    return out


def _ip_text(ip: dict[str, Any]) -> str:
    if "ipv4" in ip:
        return str(ipaddress.IPv4Address(int(ip["ipv4"])))
    v6 = ip["ipv6"]
    return str(ipaddress.IPv6Address((int(v6.get("first", 0)) << 64) | int(v6.get("last", 0))))


# --------------------------------------------------------------------- readable


def describe_update(update: dst.Update) -> str:
    which = update.WhichOneof("update")
    if which == "add":
        labels = " ".join(f"{k}={v}" for k, v in sorted(update.add.metric_labels.items()))
        n = len(update.add.addrs)
        head = f"add {n} endpoint{'s' if n != 1 else ''}" + (f"  {labels}" if labels else "")
        return "\n".join([head, *("  " + describe_addr(a) for a in update.add.addrs)])
    if which == "remove":
        n = len(update.remove.addrs)
        return "\n".join([f"remove {n} endpoint{'s' if n != 1 else ''}",
                          *("  " + address_text(a) for a in update.remove.addrs)])
    if which == "no_endpoints":
        return f"no_endpoints exists={str(update.no_endpoints.exists).lower()}"
    return "empty update"


def describe_addr(wa: dst.WeightedAddr) -> str:
    """One endpoint on one line: address, weight, identity, hint, zone, workload."""
    parts = [address_text(wa.addr), f"weight={wa.weight}"]
    tls = wa.tls_identity
    strategy = tls.WhichOneof("strategy") if wa.HasField("tls_identity") else None
    if strategy == "dns_like_identity":
        parts.append(f"identity={tls.dns_like_identity.name}")
    elif strategy == "uri_like_identity":
        parts.append(f"identity={tls.uri_like_identity.uri}")
    else:
        parts.append("identity=none")
    if tls.HasField("server_name") and tls.server_name.name != tls.dns_like_identity.name:
        parts.append(f"sni={tls.server_name.name}")
    if wa.HasField("protocol_hint"):
        proto = wa.protocol_hint.WhichOneof("protocol") or "none"
        hint = f"hint={proto}"
        if wa.protocol_hint.HasField("opaque_transport"):
            hint += f" transport={wa.protocol_hint.opaque_transport.inbound_port}"
        parts.append(hint)
    else:
        parts.append("hint=-")
    labels = dict(wa.metric_labels)
    zone = labels.pop("zone", "") or "-"
    locality = labels.pop("zone_locality", "")
    parts.append(f"zone={zone}" + (f"({locality})" if locality else ""))
    if wa.HasField("authority_override"):
        parts.append(f"authority={wa.authority_override.authority_override}")
    if wa.HasField("http2"):
        parts.append("http2-params")
    parts.extend(f"{k}={v}" for k, v in sorted(labels.items()))
    return "  ".join(parts)


def describe_profile(profile: dst.DestinationProfile) -> str:
    head = ["profile"]
    if profile.fully_qualified_name:
        head.append(f"fqn={profile.fully_qualified_name}")
    head.append(f"opaque={str(profile.opaque_protocol).lower()}")
    if profile.HasField("retry_budget"):
        rb = profile.retry_budget
        head.append(f"retry-budget={rb.retry_ratio:.3g}x,min {rb.min_retries_per_second}/s,"
                    f"ttl {format_duration(rb.ttl.seconds, rb.ttl.nanos)}")
    lines = ["  ".join(head)]
    for route in profile.routes:
        line = [f"  route {route.metrics_labels.get('route', '')!r}",
                describe_request_match(route.condition)]
        if route.HasField("timeout"):
            line.append(f"timeout={format_duration(route.timeout.seconds, route.timeout.nanos)}")
        if route.is_retryable:
            line.append("retryable")
        for rc in route.response_classes:
            kind = "failure" if rc.is_failure else "success"
            line.append(f"{kind}: {describe_response_match(rc.condition)}")
        lines.append("  ".join(line))
    lines.extend(f"  dst {d.authority}  weight={d.weight}" for d in profile.dst_overrides)
    if profile.HasField("endpoint"):
        lines.append("  endpoint " + describe_addr(profile.endpoint))
    for name, ref in (("parent", profile.parent_ref), ("profile", profile.profile_ref)):
        if ref.WhichOneof("kind") == "resource":
            r = ref.resource
            text = f"{r.kind or '-'} {r.namespace}/{r.name}" if r.name else f"none ({r.group})"
            if r.port:
                text += f":{r.port}"
            lines.append(f"  {name} {text}")
    return "\n".join(lines)


def describe_request_match(m: dst.RequestMatch) -> str:
    which = m.WhichOneof("match")
    if which in ("all", "any"):
        seq = getattr(m, which).matches
        inner = f" {'and' if which == 'all' else 'or'} ".join(
            describe_request_match(x) for x in seq)
        return f"({inner})" if len(seq) > 1 else inner or f"{which}()"
    if which == "not":
        return f"not {describe_request_match(getattr(m, 'not'))}"
    if which == "path":
        return f"path~{m.path.regex}"
    if which == "method":
        kind = m.method.WhichOneof("type")
        if kind == "registered":
            return f"method={http.HttpMethod.Registered.Name(m.method.registered)}"
        return f"method={m.method.unregistered}"
    return "?"


def describe_response_match(m: dst.ResponseMatch) -> str:
    which = m.WhichOneof("match")
    if which in ("all", "any"):
        seq = getattr(m, which).matches
        inner = f" {'and' if which == 'all' else 'or'} ".join(
            describe_response_match(x) for x in seq)
        return f"({inner})" if len(seq) > 1 else inner or f"{which}()"
    if which == "not":
        return f"not {describe_response_match(getattr(m, 'not'))}"
    if which == "status":
        lo, hi = m.status.min, m.status.max
        return f"status {lo}" if lo == hi else f"status {lo or '*'}-{hi or '*'}"
    return "?"


def format_duration(seconds: int, nanos: int) -> str:
    total_ms = seconds * 1000 + nanos / 1e6
    if total_ms < 1000:
        return f"{total_ms:g}ms"
    return f"{total_ms / 1000:g}s"


# --------------------------------------------------------------------- the clients


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("authority", help="e.g. web.emojivoto.svc.cluster.local:80")
    parser.add_argument("--token", default="",
                        help='context token, e.g. \'{"ns":"shop","nodeName":"node-a"}\'')
    parser.add_argument("--server", default=DEFAULT_SERVER,
                        help=f"destination API address (default {DEFAULT_SERVER})")
    parser.add_argument("--json", action="store_true", help="one JSON object per message")
    parser.add_argument("--count", type=int, default=0,
                        help="exit after this many messages (default: follow the stream)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop following after this many seconds")
    add_tls_arguments(parser)


def follow(args: argparse.Namespace, method: str, response: type[Message],
           describe: Callable[[Any], str],
           refuse_first: Callable[[Any], str | None] | None = None) -> int:
    """Print every message of one destination stream as it arrives.

    Exit status: 0 when the stream ends with OK, after --count messages or at
    --timeout; 1 when the server refuses the request or cannot be reached, or when
    `refuse_first` finds a reason to refuse the first message (it is then not printed).
    """
    if args.token and parse_context_token(args.token).form == "invalid":
        print("note: the server will not understand this --token; it is sent anyway",
              file=sys.stderr)
    request = dst.GetDestination(scheme="k8s", path=args.authority, context_token=args.token)
    with sync_channel(args) as channel:
        call = channel.unary_stream(
            f"/io.linkerd.proxy.destination.Destination/{method}",
            request_serializer=dst.GetDestination.SerializeToString,
            response_deserializer=response.FromString,
        )(request, timeout=args.timeout)
        received = 0
        try:
            for message in call:
                reason = refuse_first(message) if refuse_first and not received else None
                if reason:
                    call.cancel()
                    print(f"error: {reason}", file=sys.stderr)
                    return 1
                print(to_json(message) if args.json else describe(message), flush=True)
                received += 1
                if args.count and received >= args.count:
                    call.cancel()
                    return 0
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and args.timeout is not None:
                return 0
            print(f"error: {code.name}: {e.details()}", file=sys.stderr)
            return 1
    print("stream ended by the server (status OK)", file=sys.stderr)
    return 0
