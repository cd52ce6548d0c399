"""The workload a proxy names in its policy requests (§12.1)."""

from __future__ import annotations

import json
from dataclasses import dataclass


class BadWorkload(ValueError):
    """Not a workload string; the proxy is told INVALID_ARGUMENT."""


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str
    kind: str = "pod"  # or "external_workload"


def parse_workload(text: str) -> Workload:
    """JSON `{"ns": .., "pod": ..}` (or `"external_workload"`), or the older `ns:pod`."""
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except ValueError:
            raise BadWorkload(f"Invalid workload: {text[:200]}") from None
        if isinstance(raw, dict) and isinstance(raw.get("ns"), str):
            for kind in ("pod", "external_workload"):
                if isinstance(raw.get(kind), str):
                    return Workload(raw["ns"], raw[kind], kind)
        raise BadWorkload(f"Invalid workload: {text[:200]}")
    ns, sep, pod = text.partition(":")
    if not sep or not ns or not pod:
        raise BadWorkload(f"Invalid workload: {text[:200]}")
    return Workload(ns, pod)
