"""The model Linkerd policy client: it asks what a linkerd2-proxy asks (Watch by the
original destination, WatchPort for each inbound port) and makes the checks the proxy
makes of an answer: every field it needs is present, every Metadata has a kind."""

from __future__ import annotations

import ipaddress

import grpc
from google.protobuf.message import Message

from linkerd_api.proto import inbound_pb2 as ib
from linkerd_api.proto import net_pb2 as net
from linkerd_api.proto import outbound_pb2 as ob
from testkit.linkerd import ServerStream

OUTBOUND = "/io.linkerd.proxy.outbound.OutboundPolicies"
INBOUND = "/io.linkerd.proxy.inbound.InboundServerPolicies"
CLIENT = '{"ns":"emojivoto","pod":"web-5d8f7b9c6-4xk2p"}'


def addr(ip: str, port: int) -> net.TcpAddress:
    return net.TcpAddress(ip=net.IPAddress(ipv4=int(ipaddress.IPv4Address(ip))), port=port)


class PolicyStream(ServerStream):
    """One Watch or WatchPort stream."""


def watch(channel: grpc.aio.Channel, spec: ob.TrafficSpec) -> PolicyStream:
    return PolicyStream(channel, f"{OUTBOUND}/Watch", spec.SerializeToString(),
                        ob.OutboundPolicy)


def watch_addr(channel: grpc.aio.Channel, ip: str, port: int,
               workload: str = CLIENT) -> PolicyStream:
    return watch(channel, ob.TrafficSpec(source_workload=workload, addr=addr(ip, port)))


def watch_port(channel: grpc.aio.Channel, workload: str, port: int) -> PolicyStream:
    return PolicyStream(channel, f"{INBOUND}/WatchPort",
                        ib.PortSpec(workload=workload, port=port).SerializeToString(),
                        ib.Server)


def metadata_kinds_all_set(message: Message) -> list[str]:
    """Paths of every Metadata in `message` whose kind is unset (the proxy refuses those)."""
    missing: list[str] = []

    def walk(m: Message, path: str) -> None:
        if m.DESCRIPTOR.full_name == "io.linkerd.proxy.meta.Metadata" \
                and m.WhichOneof("kind") is None:
            missing.append(path)
        for field, value in m.ListFields():
            if field.message_type is None or field.message_type.GetOptions().map_entry:
                continue
            if field.is_repeated:
                for i, item in enumerate(value):
                    walk(item, f"{path}.{field.name}[{i}]")
            else:
                walk(value, f"{path}.{field.name}")

    walk(message, "")
    return missing


def backends_of(policy: ob.OutboundPolicy) -> list[ob.Backend]:
    """Every Backend the policy names, wherever it is."""
    out: list[ob.Backend] = []

    def walk(m: Message) -> None:
        if m.DESCRIPTOR.full_name == "io.linkerd.proxy.outbound.Backend":
            out.append(m)  # type: ignore[arg-type]
            return
        for field, value in m.ListFields():
            if field.message_type is None or field.message_type.GetOptions().map_entry:
                continue
            for item in (value if field.is_repeated else [value]):
                walk(item)

    walk(policy)
    return out
