"""What the Kubernetes API sends, turned into the mappings `bridge.objects` decodes.

Two encodings: JSON (every kind, CRDs included) and the API's protobuf (its built-in
kinds: `bridge/sources/kube_proto.py`), asked for with `Accept` and told apart by the
response's `Content-Type`. In both, a list is one body and a watch is a stream of
events, newline-delimited JSON or length-prefixed protobuf frames. A protobuf message
becomes a mapping shaped like the object's JSON holding only the fields the decoders
read, so that one decoder serves every source and both encodings (and, of a Pod,
only what the decoder keeps: `bridge/pod_fields.py`). The API's protobuf
carries every scalar of a non-pointer field, empty or not, where its JSON omits empty
ones; only the pointer fields (a condition, a zone, a policy) have presence.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge import pod_fields
from bridge.decoding import Meta, ObjectError, OwnerRef, Predecoded, SharedRaw, shared, shared_map
from bridge.objects import Container, Pod, decode_containers, make_pod
from bridge.sources.kube_kinds import JSON as JSON
from bridge.sources.kube_kinds import PROTOBUF as PROTOBUF
from bridge.sources.kube_kinds import accept as accept
from bridge.sources.kube_proto import MESSAGES

MAGIC = b"k8s\x00"  # every protobuf body starts with it, then an Unknown
_FRAME = struct.Struct(">I")


class WireError(ValueError):
    """A body or frame that is not what its content type says."""


Raw = dict[str, Any]


class _Shared:
    """Parts by their encoding, for parts that many objects carry byte-identical (a
    workload's containers, labels and injector annotations): each distinct encoding is
    read once and what it reads to handed out again (a `SharedRaw`, which the decoders
    decode once, or a decoded value). Bounded: past the limit it starts again."""

    LIMIT = 20_000

    def __init__(self, read: Callable[[Any], Any]) -> None:
        self._read = read
        self._seen: dict[Any, Any] = {}

    def __call__(self, encoded: Any) -> Any:
        value = self._seen.get(encoded)
        if value is None:
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            value = self._seen[encoded] = self._read(encoded)
        return value


def _entries(encoded: tuple[bytes, ...]) -> Raw:
    entry = MESSAGES["StringEntry"].FromString
    return {e.key: e.value for e in map(entry, encoded)}


def _pod_annotations(encoded: tuple[bytes, ...]) -> Raw:
    return {k: v for k, v in _entries(encoded).items() if pod_fields.keeps_annotation(k)}


_labels = _Shared(lambda encoded: SharedRaw(_entries(encoded)))
_annotations = _Shared(lambda encoded: SharedRaw(_entries(encoded)))
# A Pod's, decoded straight to the shared maps its Meta holds (`_pod`).
_pod_labels = _Shared(lambda encoded: shared_map(_entries(encoded)))
_pod_annotation_maps = _Shared(lambda encoded: shared_map(_pod_annotations(encoded)))


def _source_meta(m: Any) -> Raw:
    """What the kube source itself reads of any object's metadata."""
    out: Raw = {"name": m.name, "namespace": m.namespace,
                "resourceVersion": m.resourceVersion}
    # Of the field managers, only the newest Update's time is read (the informer lag:
    # kube.newest_update_time), in seconds since the epoch (JSON: RFC 3339 text).
    newest = max((f.time.seconds for f in m.managedFields
                  if f.operation == "Update" and f.HasField("time")), default=None)
    if newest is not None:
        out["managedFields"] = [{"operation": "Update", "time": newest}]
    return out


def _meta(m: Any) -> Raw:
    out = _source_meta(m)
    if m.labels:
        out["labels"] = _labels(tuple(m.labels))
    if m.annotations:
        out["annotations"] = _annotations(tuple(m.annotations))
    if m.ownerReferences:
        owner = MESSAGES["OwnerReference"].FromString
        out["ownerReferences"] = [{"kind": o.kind, "name": o.name}
                                  for o in map(owner, m.ownerReferences)]
    if m.HasField("deletionTimestamp"):
        out["deletionTimestamp"] = m.deletionTimestamp.seconds
    return out


def _int_or_string(v: Any) -> int | str:
    return str(v.strVal) if v.type == 1 else int(v.intVal)


def _probe(p: Any) -> Raw | None:
    if not p.handler.HasField("httpGet"):
        return None
    get = p.handler.httpGet
    return {"httpGet": {"path": get.path, "port": _int_or_string(get.port)}}


def _container(c: Any) -> Raw:
    out: Raw = {"name": c.name}
    if c.ports:
        out["ports"] = [{"name": p.name, "containerPort": p.containerPort,
                         "hostPort": p.hostPort} for p in c.ports]
    if c.env and c.name == pod_fields.PROXY_CONTAINER:  # the decoder keeps no other's
        # The API writes every string field in protobuf, empty or not; its JSON leaves
        # an empty `value` out (one set from `valueFrom` is empty here).
        out["env"] = [{"name": e.name, "value": e.value} for e in c.env
                      if e.value and e.name in pod_fields.PROXY_ENV]
    for name in ("livenessProbe", "readinessProbe", "startupProbe"):
        if c.HasField(name) and (probe := _probe(getattr(c, name))) is not None:
            out[name] = probe
    return out


# A container is most of a pod's reading (the proxy's forty-odd variables, ports,
# probes); the second replica of a workload on reads none.
_containers = _Shared(lambda encoded: SharedRaw(_container(MESSAGES["Container"].FromString(
    encoded))))


def _decode_owners(encoded: tuple[bytes, ...]) -> tuple[OwnerRef, ...]:
    owner = MESSAGES["OwnerReference"].FromString
    return shared(tuple(shared(OwnerRef(o.kind, o.name)) for o in map(owner, encoded)))


_owners = _Shared(_decode_owners)
# A pod's containers, decoded, by their encodings: a workload's replicas read none.
_container_sets: dict[tuple[bytes, ...], tuple[Container, ...]] = {}


def _pod_containers(encoded: tuple[bytes, ...], n: str, path: str) -> tuple[Container, ...]:
    found = _container_sets.get(encoded)
    if found is None:
        found = decode_containers([_containers(c) for c in encoded], n, path)
        if len(_container_sets) >= _Shared.LIMIT:
            _container_sets.clear()
        _container_sets[encoded] = found
    return found


def _pod(p: Any) -> Raw:
    """A Pod, decoded here from its message, without the mapping in between: a big
    cluster's start-up is mostly its pods (bridge.objects.make_pod holds the rules)."""
    out = Predecoded(metadata=_source_meta(p.metadata))
    out.decoded, out.error = None, None
    try:
        out.decoded = _pod_object(p)
    except ObjectError as e:
        out.error = e
    except (TypeError, ValueError, AttributeError) as e:  # as decode_object would say
        out.error = ObjectError("Pod", f"{p.metadata.namespace}/{p.metadata.name}",
                                f"malformed: {e}")
    return out


def _pod_object(p: Any) -> Pod:
    m, spec, status = p.metadata, p.spec, p.status
    if not m.name:
        raise ObjectError("Pod", "<unnamed>", "metadata.name is missing")
    n = f"{m.namespace or 'default'}/{m.name}"
    meta = Meta(m.name, sys.intern(m.namespace or "default"), m.resourceVersion,
                _pod_labels(tuple(m.labels)), _pod_annotation_maps(tuple(m.annotations)),
                _owners(tuple(m.ownerReferences)), m.HasField("deletionTimestamp"))
    return make_pod(
        meta, service_account=spec.serviceAccountName, node_name=spec.nodeName,
        host_network=spec.hostNetwork,
        containers=_pod_containers(tuple(spec.containers), n, "spec.containers"),
        init_containers=_pod_containers(tuple(spec.initContainers), n, "spec.initContainers"),
        phase=status.phase,
        pod_ips=[x.ip for x in status.podIPs], pod_ip=status.podIP, host_ip=status.hostIP)


def _service(s: Any) -> Raw:
    spec = s.spec
    ports = []
    for p in spec.ports:
        port: Raw = {"name": p.name, "port": p.port, "protocol": p.protocol or "TCP",
                     "appProtocol": p.appProtocol}
        if p.HasField("targetPort"):
            port["targetPort"] = _int_or_string(p.targetPort)
        ports.append(port)
    out: Raw = {"type": spec.type or "ClusterIP", "ports": ports,
                "clusterIPs": list(spec.clusterIPs), "externalName": spec.externalName}
    if spec.clusterIP:
        out["clusterIP"] = spec.clusterIP
    if spec.HasField("internalTrafficPolicy"):
        out["internalTrafficPolicy"] = spec.internalTrafficPolicy
    if spec.selector:  # protobuf has no empty map: absent and {} read alike (no selector)
        out["selector"] = _entries(tuple(spec.selector))
    return {"metadata": _meta(s.metadata), "spec": out}


def _ref(r: Any) -> Raw:
    return {"kind": r.kind, "namespace": r.namespace, "name": r.name}


def _slice_endpoint(e: Any) -> Raw:
    out: Raw = {"addresses": list(e.addresses), "hostname": e.hostname,
                "nodeName": e.nodeName}
    if e.HasField("conditions"):
        c = e.conditions
        out["conditions"] = {name: getattr(c, name) for name in
                             ("ready", "serving", "terminating") if c.HasField(name)}
    if e.HasField("zone"):
        out["zone"] = e.zone
    if e.HasField("hints"):
        out["hints"] = {"forZones": [{"name": z.name} for z in e.hints.forZones]}
    if e.HasField("targetRef"):
        out["targetRef"] = _ref(e.targetRef)
    return out


def _slice(s: Any) -> Raw:
    out: Raw = {"metadata": _meta(s.metadata), "addressType": s.addressType,
                "endpoints": [_slice_endpoint(e) for e in s.endpoints]}
    # No ports and an empty list are one thing in protobuf (the API's clients see
    # neither as a list): the JSON of a slice without ports, `null`.
    if s.ports:
        out["ports"] = [{"name": p.name, "port": p.port, "appProtocol": p.appProtocol}
                        for p in s.ports]
    return out


def _address(a: Any) -> Raw:
    out: Raw = {"ip": a.ip, "hostname": a.hostname, "nodeName": a.nodeName}
    if a.HasField("targetRef"):
        out["targetRef"] = _ref(a.targetRef)
    return out


def _endpoints(e: Any) -> Raw:
    return {"metadata": _meta(e.metadata), "subsets": [
        {"addresses": [_address(a) for a in s.addresses],
         "notReadyAddresses": [_address(a) for a in s.notReadyAddresses],
         "ports": [{"name": p.name, "port": p.port, "appProtocol": p.appProtocol}
                   for p in s.ports]}
        for s in e.subsets]}


def _metadata_only(o: Any) -> Raw:
    return {"metadata": _meta(o.metadata)}


@dataclass(frozen=True, slots=True)
class ProtoKind:
    item: Any  # message class of one object
    items: Any  # message class of its list
    to_raw: Callable[[Any], Raw]


# The kinds the API serves in protobuf and the kube source watches.
PROTO_KINDS: dict[str, ProtoKind] = {
    "Pod": ProtoKind(MESSAGES["Pod"], MESSAGES["PodList"], _pod),
    "Service": ProtoKind(MESSAGES["Service"], MESSAGES["ServiceList"], _service),
    "EndpointSlice": ProtoKind(MESSAGES["EndpointSlice"], MESSAGES["EndpointSliceList"],
                               _slice),
    "Endpoints": ProtoKind(MESSAGES["Endpoints"], MESSAGES["EndpointsList"], _endpoints),
    **{k: ProtoKind(MESSAGES["MetadataOnly"], MESSAGES["MetadataOnlyList"], _metadata_only)
       for k in ("Node", "ReplicaSet", "Job")},
}


def is_protobuf(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip() == PROTOBUF


def _unwrap(body: bytes) -> Any:
    if not body.startswith(MAGIC):
        raise WireError("a protobuf body without the k8s magic")
    return MESSAGES["Unknown"].FromString(body[len(MAGIC):])


def status_message(body: bytes, content_type: str | None) -> str:
    """The message of an error response's Status, in either encoding ("" if none)."""
    try:
        if is_protobuf(content_type):
            return str(MESSAGES["Status"].FromString(_unwrap(body).raw).message)
        data = json.loads(body)
    except (ValueError, WireError):  # protobuf's DecodeError is a ValueError too
        return ""
    return str(data.get("message", "")) if isinstance(data, dict) else ""


@dataclass(slots=True)
class Page:
    items: list[Raw]
    resource_version: str
    continue_token: str


def decode_list(kind: str, body: bytes, content_type: str | None) -> Page:
    """One list response (or page of one)."""
    if not is_protobuf(content_type):
        data = json.loads(body)
        if not isinstance(data, dict):
            raise WireError("the list is not an object")
        md = data.get("metadata") or {}
        return Page(list(data.get("items") or []), str(md.get("resourceVersion", "")),
                    str(md.get("continue") or ""))
    pk = PROTO_KINDS[kind]
    listed = pk.items.FromString(_unwrap(body).raw)
    return Page([pk.to_raw(item) for item in listed.items], listed.metadata.resourceVersion,
                getattr(listed.metadata, "continue"))


def json_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A JSON watch stream's events, one per line."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


def proto_frames(chunks: Iterable[bytes]) -> Iterator[bytes | memoryview]:
    """A protobuf watch stream's events: each frame is its length (4 bytes, big
    endian) and a WatchEvent. A frame is valid until the next is asked for."""
    buf = b""
    for chunk in chunks:
        buf = buf + chunk if buf else chunk
        view = memoryview(buf)
        start = 0
        while len(buf) - start >= 4:
            (n,) = _FRAME.unpack_from(buf, start)
            if len(buf) - start - 4 < n:
                break
            yield view[start + 4:start + 4 + n]
            start += 4 + n
        view.release()
        buf = buf[start:]


def watch_events(kind: str, chunks: Iterable[bytes],
                 content_type: str | None) -> Iterator[tuple[str, Raw]]:
    """(type, object) per event of a watch stream, the object as its JSON would be; an
    ERROR event's object is a Status ({"code": ..., "message": ...})."""
    if not is_protobuf(content_type):
        for line in json_lines(chunks):
            event = json.loads(line)
            yield str(event.get("type")), event.get("object") or {}
        return
    pk = PROTO_KINDS[kind]
    for frame in proto_frames(chunks):
        found = _envelope(frame)
        if found is not None:
            etype, raw = found
        else:  # a shape the quick reading does not know: the messages read it
            event = MESSAGES["WatchEvent"].FromString(frame)
            etype, raw = event.type, _unwrap(event.object.raw).raw
        if etype == "ERROR":
            status = MESSAGES["Status"].FromString(raw)
            yield "ERROR", {"code": status.code, "message": status.message,
                            "reason": status.reason}
        elif etype == "BOOKMARK":
            item = pk.item.FromString(raw)
            yield "BOOKMARK", {"metadata": _meta(item.metadata)}
        else:
            yield etype, pk.to_raw(pk.item.FromString(raw))


# A WatchEvent is {1: type, 2: {1: "k8s\0" + Unknown}}, and the Unknown's field 2 is
# the object's own encoding: every field on the way is length-delimited (wire type
# 2). Found by hand, the object is a slice of the frame: parsed as messages, each
# envelope was parsed and its bytes copied out once more (three parses and two
# copies of every object; at 10,000 pods about half of the Pod watcher's decoding).
_EVENT_TYPES = {t.encode(): t for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")}


def _envelope(frame: bytes | memoryview) -> tuple[str, memoryview] | None:
    """(type, the object's encoding) of a watch frame, or None if it is not shaped
    as the API writes it (then the messages read it, and say what is wrong)."""
    view = memoryview(frame)
    try:
        if view[0] != 0x0A:  # 1: type
            return None
        size, pos = _varint(view, 1)
        etype = _EVENT_TYPES.get(bytes(view[pos:pos + size]))
        pos += size
        if etype is None or view[pos] != 0x12:  # 2: object, a RawExtension
            return None
        size, pos = _varint(view, pos + 1)
        if pos + size != len(view) or view[pos] != 0x0A:  # its 1: raw
            return None
        size, pos = _varint(view, pos + 1)
        end = pos + size
        if end != len(view) or view[pos:pos + 4] != MAGIC:
            return None
        pos += 4
        while pos < end:  # the Unknown's fields: 2 is the object
            key = view[pos]
            if key & 7 != 2:
                return None
            size, pos = _varint(view, pos + 1)
            if key == 0x12:
                return (etype, view[pos:pos + size]) if pos + size <= end else None
            pos += size
    except (ValueError, IndexError):
        return None
    return None


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    byte = view[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = view[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
