"""An OutboundPolicy as rows of the shared route-table text (bridge.routes.text): for
`meshbridge policy` and the debug pages."""

from __future__ import annotations

from typing import Any

from bridge.routes.text import RouteRow, weighted
from linkerd_api.proto import http_types_pb2 as http_types
from linkerd_api.proto import outbound_pb2 as ob


def _ms(d: Any) -> str:
    ms = d.seconds * 1000 + d.nanos // 1_000_000
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _backend_name(b: ob.Backend) -> str:
    kind = b.WhichOneof("kind")
    if kind == "balancer":
        return str(b.balancer.discovery.dst.path)
    if kind == "forward":
        return "forward"
    md = b.metadata
    return md.default or f"{md.resource.namespace}/{md.resource.name}:{md.resource.port}"


def _route_backend(rb: Any) -> str:
    name = _backend_name(rb.backend)
    for f in rb.filters:
        if f.WhichOneof("kind") == "failure_injector":
            code = getattr(f.failure_injector, "status", 0) or f.failure_injector.code
            return f"respond {code} ({f.failure_injector.message})"
    return name


def _distribution(d: Any) -> str:
    kind = d.WhichOneof("kind")
    if kind == "first_available":
        return ", ".join(_route_backend(b) for b in d.first_available.backends)
    if kind == "random_available":
        return weighted((_route_backend(b.backend), b.weight)
                        for b in d.random_available.backends)
    return "nothing"


def _http_match(m: Any) -> str:
    parts = []
    which = m.path.WhichOneof("kind")
    if which:
        parts.append(f"{'path' if which == 'exact' else which} {getattr(m.path, which)}")
    if m.HasField("method"):
        kind = m.method.WhichOneof("type")
        parts.append("method " + (m.method.unregistered if kind == "unregistered" else
                                  http_types.HttpMethod.Registered.Name(m.method.registered)))
    for h in m.headers:
        value = h.exact.decode(errors="replace") if h.WhichOneof("value") == "exact" else None
        parts.append(f"header {h.name.lower()}" + (f"={value}" if value is not None
                                                     else f"~{h.regex}"))
    for q in m.query_params:
        parts.append(f"query {q.name}" + (f"={q.exact}" if q.WhichOneof("value") == "exact"
                                          else f"~{q.regex}"))
    return " ".join(parts)


def _grpc_match(m: Any) -> str:
    rpc = m.rpc
    if rpc.service and rpc.method:
        parts = [f"path /{rpc.service}/{rpc.method}"]
    elif rpc.service:
        parts = [f"prefix /{rpc.service}/"]
    elif rpc.method:
        parts = [f"method {rpc.method}"]
    else:
        parts = ["prefix /"]
    parts += [f"header {h.name.lower()}=" + h.exact.decode(errors="replace")
              if h.WhichOneof("value") == "exact" else f"header {h.name.lower()}~{h.regex}"
              for h in m.headers]
    return " ".join(parts)


def _notes(rule: Any, grpc: bool) -> tuple[str, ...]:
    notes = []
    t = rule.timeouts
    for name in ("request", "response", "idle"):
        if t.HasField(name):
            notes.append(f"{name} timeout {_ms(getattr(t, name))}")
    if rule.HasField("retry"):
        r = rule.retry
        if grpc:
            c = r.conditions
            on = ",".join(n for n, v in (("cancelled", c.cancelled),
                                          ("deadline-exceeded", c.deadine_exceeded),
                                          ("internal", c.internal),
                                          ("resource-exhausted", c.resource_exhausted),
                                          ("unavailable", c.unavailable)) if v)
        else:
            on = ",".join(f"{s.start}-{s.end}" if s.start != s.end else str(s.start)
                          for s in r.conditions.status_ranges)
        notes.append(f"retry {r.max_retries}x on {on or 'nothing'}")
    for f in rule.filters:
        kind = f.WhichOneof("kind")
        if kind in ("request_header_modifier", "response_header_modifier"):
            mod = getattr(f, kind)
            changes = ([f"{h.name}={h.value.decode(errors='replace')}"
                        for h in (*mod.set.headers, *mod.add.headers)]
                       + [f"-{n}" for n in mod.remove])
            notes.append(f"{kind.split('_')[0]} headers {' '.join(changes)}")
        elif kind == "redirect":
            notes.append("redirect")
    return tuple(notes)


def _route_rows(route: Any, grpc: bool) -> list[RouteRow]:
    md = route.metadata
    source = md.default or f"{md.resource.kind} {md.resource.namespace}/{md.resource.name}"
    rows: list[RouteRow] = []
    for index, rule in enumerate(route.rules):
        redirect = next((f.redirect for f in rule.filters if f.WhichOneof("kind") == "redirect"),
                        None)
        if redirect is not None:
            to = f"redirect {redirect.status or 302} {redirect.host}" + (
                redirect.path.full or redirect.path.prefix)
        else:
            to = _distribution(rule.backends)
        matches = [(_grpc_match(m) if grpc else _http_match(m)) for m in rule.matches] or [""]
        where = source if md.default else f"{source} rule {index}"
        rows.extend(RouteRow(m, to, _notes(rule, grpc), where) for m in matches)
    return rows


def policy_rows(policy: ob.OutboundPolicy) -> tuple[str, list[RouteRow]]:
    """What the policy's HTTP (or gRPC) routes say, and under which protocol."""
    p = policy.protocol
    kind = p.WhichOneof("kind")
    if kind == "grpc":
        return "grpc", [row for r in p.grpc.routes for row in _route_rows(r, True)]
    if kind == "detect":
        return "detect (http1, http2)", [row for r in p.detect.http1.routes
                                         for row in _route_rows(r, False)]
    if kind in ("http1", "http2"):
        return kind, [row for r in getattr(p, kind).routes for row in _route_rows(r, False)]
    return kind or "none", []
