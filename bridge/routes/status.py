"""What a route's `status.parents` says for meshbridge: per Service parentRef, whether
the route is Accepted there and whether its backends resolved (Routes §6). Pure: the
route, the cluster's Services and the route tables in, plain JSON-shaped values out,
for the kube source to write beside what other controllers write."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge.model import ServiceKey
from bridge.objects import Service
from bridge.routes.objects import Effect, ParentRef, Route, parent_selects
from bridge.routes.resolve import PortRoutes, ref_of

CONTROLLER_NAME = "meshbridge.io/route-controller"


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class ParentStatus:
    parent: ParentRef
    conditions: tuple[Condition, ...]


def route_status(route: Route, services: Callable[[ServiceKey], Service | None],
                 ports: Callable[[ServiceKey, int], PortRoutes | None]) -> list[ParentStatus]:
    """One entry per Service parentRef of `route` (other parents are not ours)."""
    out = []
    ref = ref_of(route)
    for parent in route.parents:
        if parent.kind != "Service" or parent.group not in ("", "core"):
            continue
        key = ServiceKey(parent.namespace, parent.name)
        svc = services(key)
        if svc is None or svc.type == "ExternalName":
            why = "no such Service" if svc is None else "an ExternalName Service"
            out.append(ParentStatus(parent, (
                Condition("Accepted", False, "NoMatchingParent", f"the parent is {why}"),
                Condition("ResolvedRefs", True, "ResolvedRefs"))))
            continue
        selected = [sp.port for sp in svc.ports
                    if parent_selects(parent, key.namespace, key.name, sp.port, sp.name)]
        if not selected:
            out.append(ParentStatus(parent, (
                Condition("Accepted", False, "NoMatchingParent",
                          "the Service has no port the parentRef names"),
                Condition("ResolvedRefs", True, "ResolvedRefs"))))
            continue
        conflicts: list[str] = []
        backend: list[tuple[str, str]] = []
        partial: list[str] = []
        profiles: list[str] = []
        for port in selected:
            found = ports(key, port)
            if found is None:
                continue
            overriding = found.overriding_profile(route.meta.namespace)
            if overriding is not None and overriding.profile is not None:
                profiles.append(f"{overriding.profile.label} routes port {port}")
            conflicts += [f"a {winner.name} route is attached to port {port}"
                          for _, r, winner in found.conflicted if r == ref]
            for table in found.tables():
                for item in table.problems:
                    if item.route != ref:
                        continue
                    problem = item.problem
                    if problem.effect is Effect.BACKEND_FAILS:
                        backend.append((problem.reason, f"{problem.path}: {problem.rule}"))
                    else:
                        partial.append(f"{problem.path}: {problem.rule}")
        if conflicts:
            accepted = Condition("Accepted", False, "Conflicted", "; ".join(sorted(set(conflicts))))
        elif profiles:
            # Routes §7.1: accepted (Linkerd accepts it too), but the clients a routing
            # ServiceProfile is given to are routed by that profile instead.
            accepted = Condition("Accepted", True, "Accepted", "; ".join(sorted(set(
                profiles))) + ": the clients given that profile are routed by it, not by "
                "this route")
        else:
            accepted = Condition("Accepted", True, "Accepted")
        if backend:
            reason = backend[0][0]
            resolved = Condition("ResolvedRefs", False, reason,
                                 "; ".join(sorted({m for _, m in backend})))
        else:
            resolved = Condition("ResolvedRefs", True, "ResolvedRefs")
        conditions = [accepted, resolved]
        if partial:
            conditions.append(Condition("PartiallyInvalid", True, "UnsupportedValue",
                                        "; ".join(sorted(set(partial)))))
        out.append(ParentStatus(parent, tuple(conditions)))
    return out


def parent_ref_json(p: ParentRef) -> dict[str, Any]:
    out: dict[str, Any] = {"group": "" if p.group == "core" else p.group, "kind": p.kind,
                           "name": p.name, "namespace": p.namespace}
    if p.port is not None:
        out["port"] = p.port
    if p.section:
        out["sectionName"] = p.section
    return out


def status_json(statuses: list[ParentStatus], generation: int,
                now: str) -> list[dict[str, Any]]:
    """meshbridge's `status.parents` entries, as the API takes them."""
    return [{"parentRef": parent_ref_json(s.parent), "controllerName": CONTROLLER_NAME,
             "conditions": [{"type": c.type, "status": "True" if c.status else "False",
                             "reason": c.reason, "message": c.message[:32768],
                             "observedGeneration": generation,
                             "lastTransitionTime": now} for c in s.conditions]}
            for s in statuses]


def same_status(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Equal but for the transition times (a rewrite that changes only those is noise)."""
    def strip(entries: list[dict[str, Any]]) -> list[Any]:
        return [(e.get("parentRef"), [{k: v for k, v in c.items()
                                       if k != "lastTransitionTime"}
                                      for c in e.get("conditions", [])]) for e in entries]
    return strip(a) == strip(b)
