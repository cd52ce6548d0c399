"""The annotations meshbridge reads, at admission: port lists that the serving code
could not parse.

    config.linkerd.io/opaque-ports        on Pods: numbers, ranges and container port
                                          names; on Services: numbers, ranges and
                                          Service port names
    config.linkerd.io/skip-inbound-ports  on Pods: numbers and ranges only

Served, a Pod whose list does not parse has its endpoints skipped (bridge.enrich), and
a Service's bad entry is dropped with a log line (linkerd_api.profiles): neither is
what the person who wrote it meant. A port name that matches no port is not an error
(Linkerd skips it: the port may come later). The zone weights meshbridge applies come
from a flag (`--ext-endpoint-zone-weights`), not from an annotation: nothing to check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from admission.problems import Problem
from bridge.enrich import OPAQUE_PORTS_ANNOTATION, SKIP_INBOUND_ANNOTATION
from bridge.port_sets import PortSpecError, parse_port_set


def _annotations(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = raw.get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _check(raw: Mapping[str, Any], key: str,
           resolve: Callable[[str], int | None] | None) -> list[Problem]:
    value = _annotations(raw).get(key)
    if value is None:
        return []
    path = f"metadata.annotations[{key}]"
    if not isinstance(value, str):
        return [Problem(path, "must be a string", "annotation")]
    try:
        # Item by item, as the Service's list is read; any name "resolves" here, so
        # that only malformed numbers and ranges (or names where none are allowed) fail.
        for item in value.split(","):
            parse_port_set(item, resolve)
    except PortSpecError as e:
        return [Problem(path, f"{value!r}: {e}", "annotation")]
    return []


def _any_name(_name: str) -> int | None:
    return None


def validate_pod(raw: Mapping[str, Any]) -> list[Problem]:
    return (_check(raw, OPAQUE_PORTS_ANNOTATION, _any_name)
            + _check(raw, SKIP_INBOUND_ANNOTATION, None))


def validate_service(raw: Mapping[str, Any]) -> list[Problem]:
    return _check(raw, OPAQUE_PORTS_ANNOTATION, _any_name)
