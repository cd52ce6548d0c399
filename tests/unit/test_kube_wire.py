"""The Kubernetes API's wire formats as the kube source reads them (bridge/sources/
kube_wire.py), on bytes built here with the same schema. Nothing running; the real
API server's bytes are read in tests/integration/test_kube_sync.py."""

from __future__ import annotations

import json
import random
import struct
from typing import Any

import pytest

from bridge.objects import ObjectError, Pod, Service, decode_object
from bridge.sources import kube_kinds, kube_wire
from bridge.sources.kube import newest_update_time
from bridge.sources.kube_proto import MESSAGES


def body(kind: str, message: object) -> bytes:
    """An object as the API server sends it: the magic, then an Unknown holding it."""
    unknown = MESSAGES["Unknown"](raw=message.SerializeToString())  # type: ignore[attr-defined]
    unknown.typeMeta.apiVersion, unknown.typeMeta.kind = "v1", kind
    return kube_wire.MAGIC + bytes(unknown.SerializeToString())


def pod(name: str, ip: str) -> object:
    entry = MESSAGES["StringEntry"]
    p = MESSAGES["Pod"]()
    p.metadata.name, p.metadata.namespace, p.metadata.resourceVersion = name, "app", "7"
    p.metadata.labels.extend(entry(key=k, value=v).SerializeToString()
                             for k, v in (("app", "web"), ("linkerd.io/control-plane-ns",
                                                             "linkerd")))
    p.metadata.annotations.extend(entry(key=k, value=v).SerializeToString()
                                  for k, v in (("config.linkerd.io/opaque-ports", "9090"),
                                               ("linkerd.io/inject", "enabled")))
    managed = p.metadata.managedFields.add(operation="Update")
    managed.time.seconds = 1_700_000_000
    container = MESSAGES["Container"](name="linkerd-proxy")
    for k, v in (("LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "[::]:4143"),
                 ("LINKERD2_PROXY_LOG", "warn"), ("_pod_name", "")):
        container.env.add(name=k, value=v)
    container.ports.add(name="admin", containerPort=4191)
    container.livenessProbe.handler.httpGet.path = "/live"
    container.livenessProbe.handler.httpGet.port.intVal = 4191
    p.spec.containers.append(container.SerializeToString())
    p.spec.nodeName, p.status.phase = "n1", "Running"
    p.status.podIPs.add(ip=ip)
    return p


def frame(etype: str, kind: str, message: object) -> bytes:
    event = MESSAGES["WatchEvent"](type=etype)
    event.object.raw = body(kind, message)
    encoded = bytes(event.SerializeToString())
    return struct.pack(">I", len(encoded)) + encoded


def chunked(data: bytes, rng: random.Random) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 300)
        out.append(data[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", range(5))
def test_watch_frames_are_found_however_the_stream_is_cut(seed: int) -> None:
    frames = [frame("ADDED", "Pod", pod(f"web-{i}", f"10.0.0.{i + 1}")) for i in range(20)]
    end = MESSAGES["Pod"]()
    end.metadata.resourceVersion = "99"
    end.metadata.annotations.append(MESSAGES["StringEntry"](
        key="k8s.io/initial-events-end", value="true").SerializeToString())
    data = b"".join([*frames, frame("BOOKMARK", "Pod", end)])
    events = list(kube_wire.watch_events("Pod", chunked(data, random.Random(seed)),
                                         "application/vnd.kubernetes.protobuf;stream=watch"))
    assert [e for e, _ in events] == ["ADDED"] * 20 + ["BOOKMARK"]
    assert [raw["metadata"]["name"] for _, raw in events[:-1]] == [f"web-{i}"
                                                                   for i in range(20)]
    assert events[-1][1]["metadata"]["resourceVersion"] == "99"
    assert events[-1][1]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_a_protobuf_pod_decodes_to_what_its_json_decodes_to() -> None:
    (_, raw), = kube_wire.watch_events("Pod", [frame("ADDED", "Pod", pod("web-1", "10.0.0.1"))],
                                       kube_wire.PROTOBUF)
    from_json = pod_json("web-1", "10.0.0.1")
    assert decode_object(raw, kind="Pod") == decode_object(from_json, kind="Pod")
    assert newest_update_time(raw) == newest_update_time(from_json) == 1_700_000_000


def test_a_protobuf_service_decodes_with_its_selector_as_its_json_does() -> None:
    entry = MESSAGES["StringEntry"]
    svc = MESSAGES["Service"]()
    svc.metadata.name, svc.metadata.namespace, svc.metadata.resourceVersion = "web", "app", "3"
    svc.spec.selector.extend(entry(key=k, value=v).SerializeToString()
                             for k, v in (("app", "web"), ("tier", "front")))
    svc.spec.ports.add(name="http", port=80, protocol="TCP")
    svc.spec.clusterIP = "10.96.0.7"
    svc.spec.clusterIPs.append("10.96.0.7")
    (_, raw), = kube_wire.watch_events("Service", [frame("ADDED", "Service", svc)],
                                       kube_wire.PROTOBUF)
    spec: dict[str, Any] = {
        "selector": {"app": "web", "tier": "front"}, "clusterIP": "10.96.0.7",
        "clusterIPs": ["10.96.0.7"], "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    meta = {"name": "web", "namespace": "app", "resourceVersion": "3"}
    from_json = {"metadata": meta, "spec": spec}
    decoded = decode_object(raw, kind="Service")
    assert decoded == decode_object(from_json, kind="Service")
    assert isinstance(decoded, Service) and decoded.selector == {"app": "web", "tier": "front"}
    # No selector and an empty one read alike (protobuf has no empty map).
    del svc.spec.selector[:]
    (_, raw), = kube_wire.watch_events("Service", [frame("ADDED", "Service", svc)],
                                       kube_wire.PROTOBUF)
    empties: tuple[dict[str, str] | None, ...] = ({}, None)
    for empty in empties:
        plain = {"metadata": meta, "spec": {**spec, "selector": empty}}
        assert decode_object(raw, kind="Service") == decode_object(plain, kind="Service")


def test_a_part_many_pods_share_is_read_and_decoded_once() -> None:
    frames = b"".join(frame("ADDED", "Pod", pod(f"web-{i}", f"10.0.0.{i + 1}"))
                      for i in range(3))
    raws = [raw for _, raw in kube_wire.watch_events("Pod", [frames], kube_wire.PROTOBUF)]
    pods = [decode_object(raw, kind="Pod") for raw in raws]
    assert all(isinstance(p, Pod) for p in pods)
    first, *rest = pods
    assert isinstance(first, Pod)
    for other in rest:
        assert isinstance(other, Pod)
        assert other.containers[0] is first.containers[0]
        assert other.meta.labels is first.meta.labels
        assert other.meta.annotations is first.meta.annotations
        assert other.meta.owners is first.meta.owners


def pod_json(name: str, ip: str) -> dict[str, Any]:
    """`pod(name, ip)` as the API's JSON has it."""
    return {"metadata": {
        "name": name, "namespace": "app", "resourceVersion": "7",
        "labels": {"app": "web", "linkerd.io/control-plane-ns": "linkerd"},
        "annotations": {"config.linkerd.io/opaque-ports": "9090", "linkerd.io/inject": "enabled"},
        "managedFields": [{"operation": "Update", "time": "2023-11-14T22:13:20Z"}]},
        "spec": {"nodeName": "n1", "containers": [{"name": "linkerd-proxy", "env": [
            {"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "[::]:4143"},
            {"name": "LINKERD2_PROXY_LOG", "value": "warn"},
            {"name": "_pod_name", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "ports": [{"name": "admin", "containerPort": 4191}],
            "livenessProbe": {"httpGet": {"path": "/live", "port": 4191}}}]},
        "status": {"phase": "Running", "podIPs": [{"ip": ip}]}}


def one_pod(message: object) -> dict[str, Any]:
    (_, raw), = kube_wire.watch_events("Pod", [frame("ADDED", "Pod", message)],
                                       kube_wire.PROTOBUF)
    return raw


def test_every_part_of_a_protobuf_pod_decodes_as_its_json_does() -> None:
    """Pods are decoded from their messages without a mapping in between: each part the
    decoder reads, set or not, comes out as it does from the JSON."""
    p = pod("web-2", "10.0.0.2")
    as_json = pod_json("web-2", "10.0.0.2")
    init = MESSAGES["Container"](name="linkerd-init")
    init.ports.add(name="x", containerPort=9, hostPort=19)
    init.readinessProbe.handler.httpGet.path = "/ready?full=1"
    init.readinessProbe.handler.httpGet.port.type = 1
    init.readinessProbe.handler.httpGet.port.strVal = "x"
    p.spec.initContainers.append(init.SerializeToString())  # type: ignore[attr-defined]
    p.spec.serviceAccountName, p.spec.hostNetwork = "web", True  # type: ignore[attr-defined]
    p.status.hostIP = "192.168.0.9"  # type: ignore[attr-defined]
    p.metadata.ownerReferences.append(MESSAGES["OwnerReference"](  # type: ignore[attr-defined]
        kind="ReplicaSet", name="web-5d9").SerializeToString())
    p.metadata.deletionTimestamp.seconds = 1_700_000_100  # type: ignore[attr-defined]
    as_json["spec"] |= {"serviceAccountName": "web", "hostNetwork": True, "initContainers": [
        {"name": "linkerd-init", "ports": [{"name": "x", "containerPort": 9, "hostPort": 19}],
         "readinessProbe": {"httpGet": {"path": "/ready?full=1", "port": "x"}}}]}
    as_json["status"]["hostIP"] = "192.168.0.9"
    as_json["metadata"] |= {"ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d9"}],
                            "deletionTimestamp": "2023-11-14T22:15:00Z"}
    decoded = decode_object(one_pod(p), kind="Pod")
    assert decoded == decode_object(as_json, kind="Pod")
    assert isinstance(decoded, Pod) and decoded.meta.deleting and decoded.host_network
    # Only podIP set (an older kubelet), no namespace: as in JSON.
    bare = pod("web-3", "10.0.0.3")
    del bare.status.podIPs[:]  # type: ignore[attr-defined]
    bare.status.podIP, bare.metadata.namespace = "10.0.0.3", ""  # type: ignore[attr-defined]
    bare_json = pod_json("web-3", "10.0.0.3")
    bare_json["status"] = {"phase": "Running", "podIP": "10.0.0.3"}
    del bare_json["metadata"]["namespace"]
    assert decode_object(one_pod(bare), kind="Pod") == decode_object(bare_json, kind="Pod")


@pytest.mark.parametrize("breaks", ["no IP", "bad IP", "no name"])
def test_a_protobuf_pod_that_cannot_be_used_fails_as_its_json_does(breaks: str) -> None:
    p, as_json = pod("web-4", "10.0.0.4"), pod_json("web-4", "10.0.0.4")
    if breaks == "no IP":
        del p.status.podIPs[:]  # type: ignore[attr-defined]
        as_json["status"]["podIPs"] = []
    elif breaks == "bad IP":
        p.status.podIPs[0].ip = "10.0.0.400"  # type: ignore[attr-defined]
        as_json["status"]["podIPs"] = [{"ip": "10.0.0.400"}]
    else:
        p.metadata.name = ""  # type: ignore[attr-defined]
        del as_json["metadata"]["name"]
    raw = one_pod(p)
    with pytest.raises(ObjectError) as from_json:
        decode_object(as_json, kind="Pod")
    with pytest.raises(ObjectError) as from_protobuf:
        decode_object(raw, kind="Pod")
    assert str(from_protobuf.value) == str(from_json.value)
    # What the source reads itself is there all the same (a DELETED event's tombstone).
    assert raw["metadata"]["namespace"] == "app" and raw["metadata"]["resourceVersion"] == "7"


def test_errors_say_why_in_either_encoding() -> None:
    status = MESSAGES["Status"](status="Failure", message="watch list is off", code=422)
    assert kube_wire.status_message(body("Status", status), kube_wire.PROTOBUF) == \
        "watch list is off"
    assert kube_wire.status_message(json.dumps({"message": "denied"}).encode(),
                                    "application/json") == "denied"
    assert kube_wire.status_message(b"<html>", "text/html") == ""
    (etype, raw), = kube_wire.watch_events(
        "Pod", [frame("ERROR", "Status", MESSAGES["Status"](code=410, message="too old"))],
        kube_wire.PROTOBUF)
    assert (etype, raw["code"], raw["message"]) == ("ERROR", 410, "too old")


def test_a_json_watch_is_one_event_per_line_however_cut() -> None:
    lines = [json.dumps({"type": "ADDED", "object": {"metadata": {"name": f"n{i}"}}})
             for i in range(10)]
    data = ("\n".join(lines) + "\n").encode()
    events = list(kube_wire.watch_events("Node", chunked(data, random.Random(1)),
                                         "application/json"))
    assert [raw["metadata"]["name"] for _, raw in events] == [f"n{i}" for i in range(10)]


def test_builtin_kinds_ask_for_protobuf_and_the_others_for_json() -> None:
    for kind in ("Pod", "Service", "EndpointSlice", "Endpoints", "Node", "ReplicaSet", "Job"):
        assert kube_wire.accept(kind).startswith(kube_wire.PROTOBUF)
    assert kube_wire.accept("Server") == kube_wire.JSON
    # The kinds asked for in protobuf are those kube_wire decodes from it.
    assert set(kube_wire.PROTO_KINDS) == kube_kinds.PROTOBUF_KINDS


def _messages_read(data: bytes) -> tuple[str, bytes]:
    """A frame read by the message classes alone (what `_envelope` stands in for)."""
    event = MESSAGES["WatchEvent"].FromString(data)
    unknown = MESSAGES["Unknown"].FromString(bytes(event.object.raw)[len(kube_wire.MAGIC):])
    return str(event.type), bytes(unknown.raw)


@pytest.mark.parametrize("etype", ["ADDED", "MODIFIED", "DELETED", "BOOKMARK"])
def test_the_quick_envelope_reading_finds_what_the_messages_find(etype: str) -> None:
    big = pod("web-1", "10.0.0.1")
    # A long label makes every length on the way a varint of more than one byte.
    big.metadata.labels.append(MESSAGES["StringEntry"](  # type: ignore[attr-defined]
        key="long", value="x" * 70_000).SerializeToString())
    for message in (pod("web-2", "10.0.0.2"), big):
        data = frame(etype, "Pod", message)[4:]
        found = kube_wire._envelope(data)
        assert found is not None
        assert (found[0], bytes(found[1])) == _messages_read(data)


def test_an_envelope_shaped_otherwise_is_left_to_the_messages() -> None:
    data = frame("ADDED", "Pod", pod("web-1", "10.0.0.1"))[4:]
    event = MESSAGES["WatchEvent"].FromString(data)
    no_magic = MESSAGES["WatchEvent"](type="ADDED")
    no_magic.object.raw = b"json" + bytes(event.object.raw)[4:]
    odd_type = MESSAGES["WatchEvent"](type="RENAMED")
    odd_type.object.raw = event.object.raw
    unknown = MESSAGES["Unknown"].FromString(bytes(event.object.raw)[4:])
    unknown.contentEncoding = "gzip"  # after the object: still found
    later = MESSAGES["WatchEvent"](type="ADDED")
    later.object.raw = kube_wire.MAGIC + unknown.SerializeToString()
    for odd in (no_magic, odd_type):
        assert kube_wire._envelope(bytes(odd.SerializeToString())) is None
    for cut in (data[:3], data[:40], data[:-1], b"", b"\x08\x01"):  # truncated; a varint field
        assert kube_wire._envelope(cut) is None
    found = kube_wire._envelope(bytes(later.SerializeToString()))
    assert found is not None and bytes(found[1]) == bytes(unknown.raw)
    # And a whole watch stream reads the same through either path.
    (etype, raw), = kube_wire.watch_events(
        "Pod", [frame("RENAMED", "Pod", pod("web-3", "10.0.0.3"))], kube_wire.PROTOBUF)
    assert (etype, raw["metadata"]["name"]) == ("RENAMED", "web-3")
