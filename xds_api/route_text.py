"""A RouteConfiguration as rows of the shared route-table text (bridge.routes.text):
for `meshbridge xds --type rds` and the debug pages."""

from __future__ import annotations

from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2

from bridge.routes.objects import status_ranges
from bridge.routes.text import RouteRow, weighted


def _ms(d: Any) -> str:
    ms = d.seconds * 1000 + d.nanos // 1_000_000
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _string(m: Any) -> str:
    which = m.WhichOneof("match_pattern")
    if which == "exact":
        return f"={m.exact}"
    if which == "safe_regex":
        return f"~{m.safe_regex.regex}"
    return f" {which} {getattr(m, which, '')}"


def match_text(m: rc.RouteMatch) -> str:
    which = m.WhichOneof("path_specifier")
    parts = []
    if which == "path":
        parts.append(f"path {m.path}")
    elif which == "safe_regex":
        parts.append(f"regex {m.safe_regex.regex}")
    elif which in ("prefix", "path_separated_prefix"):
        parts.append(f"prefix {getattr(m, which) or '/'}")
    for h in m.headers:
        if h.name == ":method":
            parts.append(f"method {h.string_match.exact}")
        else:
            parts.append(f"header {h.name}{_string(h.string_match)}")
    parts.extend(f"query {q.name}{_string(q.string_match)}" for q in m.query_parameters)
    return " ".join(parts)


def route_row(r: rc.Route) -> RouteRow:
    notes: list[str] = []
    action = r.WhichOneof("action")
    if action == "redirect":
        rd = r.redirect
        where = "".join(x for x in (rd.scheme_redirect and rd.scheme_redirect + "://",
                                    rd.host_redirect, rd.port_redirect and f":{rd.port_redirect}",
                                    rd.path_redirect or rd.prefix_rewrite) if x)
        code = 301 if rd.response_code == rc.RedirectAction.MOVED_PERMANENTLY else 302
        to = f"redirect {code} {where}".rstrip()
    elif action == "direct_response":
        to = f"respond {r.direct_response.status}"
        if r.direct_response.body.inline_string:
            notes.append(r.direct_response.body.inline_string)
    else:
        ra = r.route
        if ra.WhichOneof("cluster_specifier") == "weighted_clusters":
            to = weighted((c.name, c.weight.value) for c in ra.weighted_clusters.clusters)
        else:
            to = ra.cluster
        if ra.HasField("timeout") and (ra.timeout.seconds or ra.timeout.nanos):
            notes.append(f"timeout {_ms(ra.timeout)}")
        if ra.HasField("max_stream_duration") and ra.max_stream_duration.HasField(
                "max_stream_duration"):
            notes.append(f"max stream {_ms(ra.max_stream_duration.max_stream_duration)}")
        if ra.HasField("idle_timeout"):
            notes.append(f"idle {_ms(ra.idle_timeout)}")
        if ra.HasField("retry_policy"):
            rp = ra.retry_policy
            codes = "".join(f" {a}" if a == b else f" {a}-{b}"
                            for a, b in status_ranges(rp.retriable_status_codes))
            notes.append(f"retry {rp.num_retries.value or 1}x on {rp.retry_on}{codes}")
        if ra.prefix_rewrite:
            notes.append(f"rewrite prefix {ra.prefix_rewrite}")
        if ra.HasField("regex_rewrite"):
            notes.append(f"rewrite path {ra.regex_rewrite.substitution}")
        if ra.host_rewrite_literal:
            notes.append(f"rewrite host {ra.host_rewrite_literal}")
        notes.extend(f"mirror {m.cluster}" for m in ra.request_mirror_policies)
        if ra.cluster_not_found_response_code == \
                rc.RouteAction.ClusterNotFoundResponseCode.INTERNAL_SERVER_ERROR:
            notes.append("missing cluster: 500")
    for which, add, remove in (("request", r.request_headers_to_add,
                                r.request_headers_to_remove),
                               ("response", r.response_headers_to_add,
                                r.response_headers_to_remove)):
        changes = [f"{h.header.key}={h.header.value}" for h in add] + [f"-{n}" for n in remove]
        if changes:
            notes.append(f"{which} headers {' '.join(changes)}")
    return RouteRow(match_text(r.match), to, tuple(notes), r.name)


def route_config_rows(config: route_pb2.RouteConfiguration) -> list[RouteRow]:
    return [route_row(r) for vh in config.virtual_hosts for r in vh.routes]
