"""The shared parts of decoding Kubernetes objects: the metadata every kind has, the
error that names what is wrong, and the checked readers of a raw object's fields.

Every kind's decoder (`bridge.objects`, `bridge.policy_objects`) is built from these,
so each reports a bad field the same way: `ObjectError(kind, "ns/name", "path ...")`.
Equal values many objects carry (a workload's labels, owners, containers) are kept
once (`shared`), and a part a source hands out for many objects (`SharedRaw`) is
decoded once.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

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
    if type(raw) is dict:  # nearly always: not the (slow) Mapping check
        return raw
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
        if type(k) is str and type(v) is str:
            out[k] = v
            continue
        if not isinstance(k, str) or not isinstance(v, str | int | float | bool):
            raise ObjectError(kind, name, f"{path}.{k} must be a string")
        out[k] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
    return out


def as_ip(raw: Any, kind: str, name: str, path: str) -> str:
    text = as_str(raw, kind, name, path)
    # An IPv4 address already in canonical form, the common case (every pod and
    # endpoint address passes here at start): try/except, not contextlib.suppress,
    # whose context manager object cost more than the check.
    try:
        if socket.inet_ntop(socket.AF_INET, socket.inet_pton(socket.AF_INET, text)) == text:
            return text
    except OSError:
        pass
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ObjectError(kind, name, f"{path} {text!r} is not an IP address") from None


def decode_meta(raw: Mapping[str, Any], kind: str, namespaced: bool,
                annotation: Callable[[str], bool] | None = None) -> Meta:
    """The metadata; of the annotations only those `annotation` accepts, if given."""
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
        owners.append(shared(OwnerRef(
            as_str(o.get("kind"), kind, full, "ownerReferences.kind"),
            as_str(o.get("name"), kind, full, "ownerReferences.name"))))
    rv = md.get("resourceVersion")
    return Meta(
        name=name,
        namespace=sys.intern(ns) if namespaced else "",
        resource_version=str(rv) if rv is not None else "",
        labels=as_labels(md.get("labels"), kind, full, "metadata.labels"),
        annotations=as_labels(md.get("annotations"), kind, full, "metadata.annotations",
                              annotation),
        owners=shared(tuple(owners)),
        deleting=md.get("deletionTimestamp") is not None,
    )


def as_labels(raw: Any, kind: str, name: str, path: str,
              keep: Callable[[str], bool] | None = None) -> dict[str, str]:
    """Labels or annotations (those `keep` accepts, if given), shared."""
    if type(raw) is SharedRaw and (known := getattr(raw, "decoded", None)) is not None:
        return cast(dict[str, str], known)
    m = as_str_map(raw, kind, name, path)
    if keep is not None:
        m = {k: v for k, v in m.items() if keep(k)}
    out = shared_map(m)
    if type(raw) is SharedRaw:
        raw.decoded = out
    return out


_T = TypeVar("_T")


class Interner:
    """A bounded table of equal immutable values, each kept once: `share(value)` gives
    the equal value shared before, else keeps and gives `value`. Past `limit` entries
    it starts again (what was shared stays shared)."""

    __slots__ = ("_known", "_limit")

    def __init__(self, limit: int) -> None:
        self._known: dict[Any, Any] = {}
        self._limit = limit

    def share(self, value: _T, key: Any = None) -> _T:
        """The value equal to `value` (or kept under `key`) shared before, else `value`."""
        k = value if key is None else key
        found = self._known.get(k)
        if found is not None:
            return cast(_T, found)
        if len(self._known) >= self._limit:
            self._known.clear()
        self._known[k] = value
        return value

    def lookup(self, key: Any) -> Any:
        """What is kept under `key`, if anything."""
        return self._known.get(key)


# Values shared between objects: the pods of one workload have equal labels, owners
# and containers, and thousands of them are cached at once, so each equal value is
# kept once (a 10,000-pod cache otherwise holds 10,000 copies of each). Safe because
# decoded values are never changed.
_DECODED = Interner(100_000)
shared = _DECODED.share
shared_lookup = _DECODED.lookup


def shared_map(m: dict[str, str]) -> dict[str, str]:
    if not m:
        return _EMPTY
    return shared(m, ("map", *m.items()))


_EMPTY: dict[str, str] = {}


class SharedRaw(dict[str, Any]):
    """A raw part its source hands out for many objects at once, unchanged (the kube
    source: a workload's containers, labels and annotations, encoded identically in
    each of its pods): it is decoded once and the value kept on it. A part is decoded
    the same way wherever it is found (a pod's annotations are read through the same
    filter wherever they are), so one value per part is right."""

    __slots__ = ("decoded",)
    decoded: Any


class Predecoded(dict[str, Any]):
    """An object its source decoded already, from an encoding read without building
    the object's mapping (the kube source's protobuf Pods): as a mapping it holds only
    the metadata the source itself reads (name, namespace, resourceVersion, the field
    managers' times), and `result()` is the decoded object, or raises the ObjectError
    its decoding raised, as decoding the mapping would have."""

    __slots__ = ("decoded", "error")
    decoded: Any
    error: ObjectError | None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.decoded


def display_name(raw: Any) -> str:
    """`kind ns/name` of a raw object, as well as can be told, for log lines."""
    if not isinstance(raw, Mapping):
        return f"<{type(raw).__name__}>"
    md = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(md, Mapping)
    name, ns = md.get("name", "<unnamed>"), md.get("namespace")
    return f"{raw.get('kind', '<no kind>')} {ns + '/' if isinstance(ns, str) else ''}{name}"


