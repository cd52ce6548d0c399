"""ServiceProfiles at admission: the checks Linkerd's sp-validator makes, then the
conversion meshbridge serves them with (`linkerd_api.profiles.service_profile`).

sp-validator decodes a profile strictly (a field it does not know is an error) and
then asks for: a name that is a DNS-1123 subdomain; at least one route; a name, a
condition and a parseable timeout on every route; a condition on every response
class; a match that sets at least one field, at any depth; HTTP statuses 100-599 with
max not below min; a retry budget with a non-negative ratio and a parseable TTL. The
conversion that serves the profile checks most of these again and the types of
every field it reads; a profile it cannot convert would be served as no profile at
all, so it is refused here too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from admission.problems import Problem, from_reason
from bridge.model import ServiceKey
from bridge.objects import ServiceProfile, decode_object
from linkerd_api.profiles import ProfileError, parse_go_duration, service_profile

# RFC 1123 subdomain, as Kubernetes names objects: at most 253 characters, dot-separated
# labels of lower-case letters, digits and '-', starting and ending alphanumeric.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# The fields each part of a profile may have (a strict decode refuses any other).
_REQUEST_MATCH = frozenset({"all", "any", "not", "method", "pathRegex"})
_RESPONSE_MATCH = frozenset({"all", "any", "not", "status"})
_FIELDS: dict[str, frozenset[str]] = {
    "spec": frozenset({"routes", "retryBudget", "dstOverrides", "opaquePorts"}),
    "route": frozenset({"name", "condition", "responseClasses", "isRetryable", "timeout"}),
    "responseClass": frozenset({"condition", "isFailure"}),
    "status": frozenset({"min", "max"}),
    "retryBudget": frozenset({"retryRatio", "minRetriesPerSecond", "ttl"}),
    "dstOverride": frozenset({"authority", "weight"}),
}


def validate_profile(raw: Mapping[str, Any]) -> list[Problem]:
    """Every problem sp-validator's rules and the serving conversion find, in the
    order a reader meets them."""
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name = meta.get("name", "")
    problems: list[Problem] = []
    if not isinstance(name, str) or len(name) > 253 or not _SUBDOMAIN.match(name):
        problems.append(Problem("metadata.name", f"{name!r} is not a DNS-1123 subdomain "
                                "(lower-case letters, digits, '-' and '.')", "name"))
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        return [*problems, Problem("spec", "must be a mapping", "invalid")]
    problems += _unknown_fields(spec)
    routes = spec.get("routes")
    if not routes:
        problems.append(Problem("spec.routes", "a ServiceProfile needs at least one route",
                                "no_routes"))
    elif isinstance(routes, list):
        for i, route in enumerate(routes):
            problems += _route_rules(route, f"spec.routes[{i}]")
    budget = spec.get("retryBudget")
    if isinstance(budget, Mapping) and not budget.get("ttl"):
        problems.append(Problem("spec.retryBudget.ttl", "a retry budget needs a TTL",
                                "retry_budget"))
    problems += _serving(raw)
    return problems


def _route_rules(route: Any, where: str) -> list[Problem]:
    if not isinstance(route, Mapping):
        return []  # the conversion says it
    out = []
    if not route.get("name"):
        out.append(Problem(f"{where}.name", "every route needs a name", "route_name"))
    timeout = route.get("timeout")
    if timeout not in (None, ""):
        try:
            parse_go_duration(str(timeout))
        except ProfileError as e:
            # Served, the bad timeout would be dropped and the route kept (a log line no
            # one reads); sp-validator refuses it, and so do we.
            out.append(Problem(f"{where}.timeout", str(e), "timeout"))
    return out


def _unknown_fields(spec: Mapping[str, Any]) -> list[Problem]:
    out: list[Problem] = []

    def check(value: Any, allowed: frozenset[str], where: str) -> bool:
        if not isinstance(value, Mapping):
            return False
        for key in value:
            if key not in allowed:
                out.append(Problem(f"{where}.{key}", "is not a ServiceProfile field",
                                   "unknown_field"))
        return True

    def match(value: Any, fields: frozenset[str], where: str) -> None:
        if not check(value, fields, where):
            return
        for key in ("all", "any"):
            for i, child in enumerate(_items(value.get(key))):
                match(child, fields, f"{where}.{key}[{i}]")
        if value.get("not") is not None:
            match(value["not"], fields, f"{where}.not")
        if fields is _RESPONSE_MATCH and value.get("status") is not None:
            check(value["status"], _FIELDS["status"], f"{where}.status")

    check(spec, _FIELDS["spec"], "spec")
    for i, route in enumerate(_items(spec.get("routes"))):
        where = f"spec.routes[{i}]"
        if not check(route, _FIELDS["route"], where):
            continue
        if route.get("condition") is not None:
            match(route["condition"], _REQUEST_MATCH, f"{where}.condition")
        for j, rc in enumerate(_items(route.get("responseClasses"))):
            if check(rc, _FIELDS["responseClass"], f"{where}.responseClasses[{j}]") \
                    and rc.get("condition") is not None:
                match(rc["condition"], _RESPONSE_MATCH,
                      f"{where}.responseClasses[{j}].condition")
    if spec.get("retryBudget") is not None:
        check(spec["retryBudget"], _FIELDS["retryBudget"], "spec.retryBudget")
    for i, override in enumerate(_items(spec.get("dstOverrides"))):
        check(override, _FIELDS["dstOverride"], f"spec.dstOverrides[{i}]")
    return out


def _items(value: Any) -> list[Any]:
    """A list field's items; a field that is not a list has none here (the
    conversion says what is wrong with it)."""
    return value if isinstance(value, list) else []


def _serving(raw: Mapping[str, Any]) -> list[Problem]:
    """What the code that serves the profile makes of it (as a profile of a port)."""
    try:
        obj = decode_object(raw, "ServiceProfile")
        assert isinstance(obj, ServiceProfile)
        service_profile(obj, fqn=obj.meta.name, opaque=False, port=80,
                        service=ServiceKey(obj.meta.namespace, obj.meta.name.split(".")[0]))
    except ProfileError as e:
        return [from_reason(str(e), "invalid")]
    except ValueError as e:  # bridge.objects.ObjectError
        return [from_reason(getattr(e, "reason", str(e)), "invalid")]
    return []
