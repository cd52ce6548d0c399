"""Field paths: every field a proxy acts on, found by walking protobuf descriptors.

An answer is flattened into `path -> value` pairs, one per set leaf field, so that a
field added to the protocol is compared without anyone listing it. A path is dotted
segments; a segment may carry a key in brackets:

    add[10.0.0.1:8080].metric_labels.pod          a Linkerd endpoint's field
    set.metric_labels.namespace                   the WeightedAddrSet's
    profile.routes[0].timeout.seconds             a repeated field's element, by index
    policy.protocol.detect.http1.routes[0]...     --routes: a Linkerd OutboundPolicy's
    rds.routes[0].route.weighted_clusters...      --routes: the target's virtual host
    endpoint[10.0.0.1:8080].locality.zone         an xDS LbEndpoint (and its locality)
    endpoint[...].metadata.filter_metadata."io.linkerd.destination".identity
    messages.redundant                            a stream's redundant messages

Map keys are segments of their own; a key that is not a plain word (dots, brackets,
quotes, spaces, empty) is written as a JSON string. Unset fields are not listed (proto3:
a default value is unset); a set message with nothing set in it is `{}`.

Patterns (`--fields`) use the same grammar; `*`, `?` and `[...]` inside a segment name
are shell wildcards, a segment without a key matches any key, and a pattern matches
every path it is a prefix of (`add.metric_labels` ignores every endpoint label).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.route.v3 import route_components_pb2
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from linkerd_api.proto import destination_pb2, outbound_pb2

Flat: TypeAlias = dict[str, str]
UNSET: Final = "(unset)"
EMPTY_MESSAGE: Final = "{}"

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_:/@+-]+")
_SEGMENT = re.compile(r'((?:"(?:[^"\\]|\\.)*"|[^."\[\]]+))(\[[^\]]*\])?')
_JSONISH = frozenset({"google.protobuf.Struct", "google.protobuf.Value",
                      "google.protobuf.ListValue"})


def key_segment(key: str) -> str:
    return key if _PLAIN_KEY.fullmatch(key) else json.dumps(key)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _scalar(fd: FieldDescriptor, value: Any) -> str:
    if fd.type == FieldDescriptor.TYPE_ENUM:
        assert fd.enum_type is not None
        ev = fd.enum_type.values_by_number.get(value)
        return ev.name if ev is not None else str(value)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return bytes(value).hex()
    if fd.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return f"{value:.7g}"
    return str(value)


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def flatten(msg: Any, prefix: str = "", *, skip: Iterable[str] = (),
            rename: Mapping[str, str] | None = None, out: Flat | None = None) -> Flat:
    """Every set leaf of `msg` as `path -> value`, paths under `prefix`; top-level
    fields in `skip` are left out (they are the key), `rename` renames top-level ones."""
    out = {} if out is None else out
    skipped = frozenset(skip)
    for fd, value in msg.ListFields():
        if fd.name in skipped:
            continue
        path = _join(prefix, (rename or {}).get(fd.name, fd.name))
        if _is_map(fd):
            vfd = fd.message_type.fields_by_name["value"]
            for k in sorted(value):
                sub = _join(path, key_segment(str(k)))
                if vfd.message_type is not None:
                    _message(value[k], sub, out)
                else:
                    out[sub] = _scalar(vfd, value[k])
        elif fd.is_repeated:
            for i, item in enumerate(value):
                if fd.message_type is not None:
                    _message(item, f"{path}[{i}]", out)
                else:
                    out[f"{path}[{i}]"] = _scalar(fd, item)
        elif fd.message_type is not None:
            _message(value, path, out)
        else:
            out[path] = _scalar(fd, value)
    return out


def _struct(msg: Any, path: str, out: Flat) -> None:
    """A Struct's values as paths of their own: nested Structs walked, strings as they
    are, anything else (numbers, lists, null) as JSON."""
    if not msg.fields:
        out[path] = EMPTY_MESSAGE
    for k in sorted(msg.fields):
        value, sub = msg.fields[k], _join(path, key_segment(k))
        kind = value.WhichOneof("kind")
        if kind == "struct_value":
            _struct(value.struct_value, sub, out)
        elif kind == "string_value":
            out[sub] = value.string_value
        else:
            out[sub] = json.dumps(json_format.MessageToDict(value), sort_keys=True)


def _message(msg: Any, path: str, out: Flat) -> None:
    name = msg.DESCRIPTOR.full_name
    if name == "google.protobuf.Struct":
        _struct(msg, path, out)
        return
    if name in _JSONISH:
        out[path] = json.dumps(json_format.MessageToDict(msg), sort_keys=True)
        return
    before = len(out)
    flatten(msg, path, out=out)
    if len(out) == before:
        out[path] = EMPTY_MESSAGE  # present, with nothing set: e.g. ProtocolHint.h2


# ---------------------------------------------------------------------- paths


@dataclass(frozen=True, slots=True)
class Segment:
    name: str
    key: str | None = None  # what was in brackets; None: none given


def parse(path: str) -> tuple[Segment, ...]:
    """Segments of a path or pattern; ValueError if it is not one."""
    out: list[Segment] = []
    pos = 0
    while True:
        m = _SEGMENT.match(path, pos)
        if m is None:
            raise ValueError(f"bad field path {path!r} at {pos}")
        name = m.group(1)
        if name.startswith('"'):
            name = json.loads(name)
        key = m.group(2)[1:-1] if m.group(2) else None
        out.append(Segment(name, key))
        pos = m.end()
        if pos == len(path):
            return tuple(out)
        if path[pos] != ".":
            raise ValueError(f"bad field path {path!r} at {pos}")
        pos += 1


def _seg_matches(pattern: Segment, seg: Segment) -> bool:
    if not fnmatch.fnmatchcase(seg.name, pattern.name):
        return False
    return pattern.key is None or (seg.key is not None
                                   and fnmatch.fnmatchcase(seg.key, pattern.key))


class FieldFilter:
    """The field paths to leave out of the comparison."""

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self.patterns = tuple(dict.fromkeys(patterns))
        self._parsed = [parse(p) for p in self.patterns]

    def ignores(self, path: str) -> bool:
        if not self._parsed:
            return False
        segs = parse(path)
        return any(len(p) <= len(segs) and all(map(_seg_matches, p, segs))
                   for p in self._parsed)

    def with_patterns(self, more: Iterable[str]) -> FieldFilter:
        return FieldFilter((*self.patterns, *more))


NOTHING: Final = FieldFilter()  # ignore no field


# ---------------------------------------------------------------------- the schema

# A schema node: a message descriptor, a synthetic group, a map (any key, then the
# value's node), ANYTHING (a Struct: any path below) or LEAF.
LEAF: Final = "leaf"
ANYTHING: Final = "anything"


@dataclass(frozen=True, slots=True)
class MapNode:
    value: Any  # a node
    placeholder: str = "<key>"


@dataclass(frozen=True, slots=True)
class Group:
    children: Mapping[str, Any]  # name -> node


def _field_node(fd: FieldDescriptor) -> Any:
    if _is_map(fd):
        assert fd.message_type is not None
        vfd = fd.message_type.fields_by_name["value"]
        return MapNode(_field_node(vfd) if vfd.message_type is not None else LEAF)
    if fd.message_type is None:
        return LEAF
    if fd.message_type.full_name in _JSONISH:
        return ANYTHING if fd.message_type.full_name == "google.protobuf.Struct" else LEAF
    return fd.message_type


def message_group(desc: Any, *, skip: Iterable[str] = (),
                  rename: Mapping[str, str] | None = None) -> Group:
    skipped = frozenset(skip)
    return Group({(rename or {}).get(fd.name, fd.name): _field_node(fd)
                  for fd in desc.fields if fd.name not in skipped})


def children(node: Any) -> Mapping[str, Any] | None:
    """A node's named children; None for a map or ANYTHING (any name goes)."""
    if isinstance(node, Group):
        return node.children
    if isinstance(node, Descriptor):
        return message_group(node).children
    if node == LEAF:
        return {}
    return None


def known(schema: Group, pattern: str) -> bool:
    """Whether a pattern names at least one field the schema has."""
    try:
        segs = parse(pattern)
    except ValueError:
        return False
    nodes: list[Any] = [schema]
    for seg in segs:
        nxt: list[Any] = []
        for node in nodes:
            if node == ANYTHING:
                nxt.append(ANYTHING)
            elif isinstance(node, MapNode):
                nxt.append(node.value)
            else:
                nxt.extend(child for name, child in (children(node) or {}).items()
                           if fnmatch.fnmatchcase(name, seg.name))
        if not nxt:
            return False
        nodes = nxt
    return True


def listing(schema: Group, depth: int = 4) -> list[str]:
    """The known field paths, to `depth` segments (deeper: `path.*`)."""
    out: list[str] = []

    def walk(node: Any, path: str, level: int, seen: tuple[str, ...]) -> None:
        if node == LEAF:
            out.append(path)
            return
        if node == ANYTHING:
            out.append(f"{path}.*")
            return
        if isinstance(node, MapNode):
            walk(node.value, _join(path, node.placeholder), level + 1, seen)
            return
        name = node.full_name if isinstance(node, Descriptor) else ""
        if level >= depth or (name and name in seen):
            out.append(f"{path}.*")
            return
        kids = children(node) or {}
        if not kids:
            out.append(path)
        for child_name, child in kids.items():
            walk(child, _join(path, child_name), level + 1, (*seen, name))

    for section, node in schema.children.items():
        walk(node, section, 1, ())
    return out


# Endpoint and set sections per API, named as differences name them.
LINKERD_ENDPOINT = "add"
XDS_ENDPOINT = "endpoint"
PROFILE_STATUS = "status"  # profile.status: a GetProfile that ended with a status
# policy.status / rds.status: no routes to compare, and why (a status, no answer, ...).
ROUTES_STATUS = "status"
VHOST_SKIP: Final = ("name", "domains")  # the compared virtual host's own names
MESSAGE_COUNTERS: Final = ("redundant", "profile_redundant")


def xds_locality_rename() -> dict[str, str]:
    """LocalityLbEndpoints fields as they are spliced into each of its endpoints: a
    name that LbEndpoint also has gets `locality_` in front."""
    lb = {fd.name for fd in endpoint_components_pb2.LbEndpoint.DESCRIPTOR.fields}
    return {fd.name: f"locality_{fd.name}"
            for fd in endpoint_components_pb2.LocalityLbEndpoints.DESCRIPTOR.fields
            if fd.name in lb}


XDS_LOCALITY_SKIP: Final = ("lb_endpoints", "load_balancer_endpoints")
XDS_CLA_SKIP: Final = ("cluster_name", "endpoints")


def linkerd_schema() -> Group:
    profile = message_group(destination_pb2.DestinationProfile.DESCRIPTOR)
    policy = message_group(outbound_pb2.OutboundPolicy.DESCRIPTOR)
    return Group({
        LINKERD_ENDPOINT: message_group(destination_pb2.WeightedAddr.DESCRIPTOR,
                                        skip=("addr",)),
        "set": message_group(destination_pb2.WeightedAddrSet.DESCRIPTOR, skip=("addrs",)),
        "profile": Group({**profile.children, PROFILE_STATUS: LEAF}),
        "policy": Group({**policy.children, ROUTES_STATUS: LEAF}),
        "messages": Group({name: LEAF for name in MESSAGE_COUNTERS}),
    })


def xds_schema() -> Group:
    lb = message_group(endpoint_components_pb2.LbEndpoint.DESCRIPTOR)
    loc = message_group(endpoint_components_pb2.LocalityLbEndpoints.DESCRIPTOR,
                        skip=XDS_LOCALITY_SKIP, rename=xds_locality_rename())
    vhost = message_group(route_components_pb2.VirtualHost.DESCRIPTOR, skip=VHOST_SKIP)
    return Group({
        XDS_ENDPOINT: Group({**lb.children, **loc.children}),
        "cla": message_group(endpoint_pb2.ClusterLoadAssignment.DESCRIPTOR, skip=XDS_CLA_SKIP),
        "rds": Group({**vhost.children, ROUTES_STATUS: LEAF}),
        "messages": Group({"redundant": LEAF}),
    })


def schema_for(api: str) -> Group:
    return linkerd_schema() if api == "linkerd" else xds_schema()


def unknown_patterns(api: str, patterns: Iterable[str]) -> Iterator[str]:
    schema = schema_for(api)
    return (p for p in patterns if not known(schema, p))
