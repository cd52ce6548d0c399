"""The shared parts of decoding Kubernetes objects: the metadata every kind has, the
error that names what is wrong, and the checked readers of a raw object's fields.

Every kind's decoder (`bridge.objects`, `bridge.policy_objects`) is built from these,
so each reports a bad field the same way: `ObjectError(kind, "ns/name", "path ...")`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Labels = Mapping[str, str]


class ObjectError(ValueError):
    """An object we cannot use; the message names the field that is wrong."""

    def __init__(self, kind: str, name: str, reason: str) -> None:
        super().__init__(f"{kind} {name}: {reason}")
        self.kind = kind
        self.name = name
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Meta:
    name: str
    namespace: str
    resource_version: str = ""
    labels: Labels = field(default_factory=dict)
    annotations: Labels = field(default_factory=dict)
    owners: tuple[OwnerRef, ...] = ()
    deleting: bool = False


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str


def as_map(raw: Any, kind: str, name: str, path: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ObjectError(kind, name, f"{path} must be a mapping, got {type(raw).__name__}")
    return raw


def as_list(raw: Any, kind: str, name: str, path: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ObjectError(kind, name, f"{path} must be a list, got {type(raw).__name__}")
    return raw


def as_str(raw: Any, kind: str, name: str, path: str, default: str = "") -> str:
    if raw is None:
        return default
    if not isinstance(raw, str):
        raise ObjectError(kind, name, f"{path} must be a string, got {raw!r}")
    return raw


def as_bool(raw: Any, kind: str, name: str, path: str, default: bool) -> bool:
    if raw is None:
        return default
    if not isinstance(raw, bool):
        raise ObjectError(kind, name, f"{path} must be true or false, got {raw!r}")
    return raw


def as_port(raw: Any, kind: str, name: str, path: str, allow_zero: bool = False) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ObjectError(kind, name, f"{path} must be a port number, got {raw!r}")
    low = 0 if allow_zero else 1
    if not low <= raw <= 65535:
        raise ObjectError(kind, name, f"{path} {raw} is out of range")
    return raw


def as_str_map(raw: Any, kind: str, name: str, path: str) -> dict[str, str]:
    m = as_map(raw, kind, name, path)
    out: dict[str, str] = {}
    for k, v in m.items():
        if not isinstance(k, str) or not isinstance(v, str | int | float | bool):
            raise ObjectError(kind, name, f"{path}.{k} must be a string")
        out[k] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
    return out


def as_ip(raw: Any, kind: str, name: str, path: str) -> str:
    text = as_str(raw, kind, name, path)
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ObjectError(kind, name, f"{path} {text!r} is not an IP address") from None


def decode_meta(raw: Mapping[str, Any], kind: str, namespaced: bool) -> Meta:
    md = raw.get("metadata")
    if not isinstance(md, Mapping):
        raise ObjectError(kind, "<unnamed>", "metadata is missing")
    name = md.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError(kind, "<unnamed>", "metadata.name is missing")
    ns = as_str(md.get("namespace"), kind, name, "metadata.namespace")
    if namespaced and not ns:
        ns = "default"
    full = f"{ns}/{name}" if ns else name
    owners = []
    for i, o in enumerate(as_list(md.get("ownerReferences"), kind, full, "ownerReferences")):
        o = as_map(o, kind, full, f"ownerReferences[{i}]")
        owners.append(OwnerRef(as_str(o.get("kind"), kind, full, "ownerReferences.kind"),
                               as_str(o.get("name"), kind, full, "ownerReferences.name")))
    rv = md.get("resourceVersion")
    return Meta(
        name=name,
        namespace=ns if namespaced else "",
        resource_version=str(rv) if rv is not None else "",
        labels=as_str_map(md.get("labels"), kind, full, "metadata.labels"),
        annotations=as_str_map(md.get("annotations"), kind, full, "metadata.annotations"),
        owners=tuple(owners),
        deleting=md.get("deletionTimestamp") is not None,
    )


def display_name(raw: Any) -> str:
    """`kind ns/name` of a raw object, as well as can be told, for log lines."""
    if not isinstance(raw, Mapping):
        return f"<{type(raw).__name__}>"
    md = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(md, Mapping)
    name, ns = md.get("name", "<unnamed>"), md.get("namespace")
    return f"{raw.get('kind', '<no kind>')} {ns + '/' if isinstance(ns, str) else ''}{name}"


