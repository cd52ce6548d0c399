"""Debug pages on the admin port: views, streams, one target as each protocol says it.

    /                      a small HTML page linking the rest, views and streams at a glance
    /debug/views           every View: key, version, endpoint counts, subscribers by protocol
    /debug/streams         every client stream: protocol, peer, client, subscriptions,
                           last version sent, last ACK / NACK
    /debug/syncz           per client stream and type (xDS) or target (Linkerd): version
                           sent, version ACKed, SYNCED / STALE / NACKED (istiod's syncz;
                           `meshbridge status` prints it as a table)
    /debug/clusters        every linked cluster: where it is linked from, its domains,
                           its state (syncing, synced, stale, unreachable, ...) and why,
                           what is watched there and what its cache holds
    /debug/endpoints?authority=<svc>.<ns>.svc.<domain>:<port>[&node=<node>]
                           that target as the core View holds it and as each protocol
                           layer encodes it, side by side (HTML, one row per endpoint
                           address, differences highlighted; JSON with ?format=json or
                           Accept: application/json)

Protocol layers add a renderer (`Host.add_renderer`, meshbridge.host.Renderer): a
function from a View to `(endpoints, message)`, where `endpoints` maps "ip:port" to
the fields that protocol carries (for the comparison) and `message` is the encoded
message as proto-JSON.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bridge.authority import AuthorityError, format_authority, parse_authority, view_authority
from bridge.model import FilterKey, ViewKey
from meshbridge.admin import Request, Response
from meshbridge.stream_registry import StreamInfo, human_time

if TYPE_CHECKING:
    from bridge.views import View
    from meshbridge.app import App

_ENDPOINTS_PARAMS = {"authority", "node", "format", "namespace"}


def _json(status: int, body: Any) -> Response:
    return Response(status, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode(),
                    "application/json")


def _no_params(req: Request) -> Response | None:
    if req.query:
        return Response.text(400, f"unknown query parameter {sorted(req.query)[0]!r}")
    return None


def views_json(app: App) -> list[dict[str, Any]]:
    out = []
    for view in sorted(app.views.views(), key=lambda v: (str(v.key.service), v.key.port,
                                                          v.key.filter.node_name,
                                                          v.key.filter.hostname)):
        ready = sum(1 for r in view.snapshot.values() if r.endpoint.ready)
        out.append({
            "authority": view_authority(view.key, app.config.cluster_domain),
            "namespace": view.key.service.namespace,
            "service": view.key.service.name,
            "port": view.key.port,
            "filter": {"node": view.key.filter.node_name, "hostname": view.key.filter.hostname,
                       "filtering": view.key.filter.filtering},
            "version": view.version,
            "exists": view.exists,
            "endpoints": {"ready": ready, "draining": len(view.snapshot) - ready},
            "subscribers": view.subscriber_counts(),
        })
    return out


def install(app: App) -> None:
    access = app.options.debug_access

    def guarded(page: Callable[[Request], Awaitable[Response]]
                ) -> Callable[[Request], Awaitable[Response]]:
        # These pages reveal configuration: served under --debug-access only.
        async def serve(req: Request) -> Response:
            refused = access.refusal(req.peer)
            return Response.text(403, refused) if refused else await page(req)
        return serve

    async def index(req: Request) -> Response:
        return _index(app, req, await app.stream_infos())

    async def views(req: Request) -> Response:
        return _no_params(req) or _json(200, views_json(app))

    async def streams(req: Request) -> Response:
        return _no_params(req) or _json(200, [s.as_json() for s in await app.stream_infos()])

    async def endpoints(req: Request) -> Response:
        return _endpoints(app, req)

    async def syncz(req: Request) -> Response:
        return _no_params(req) or _json(200, [s.syncz() for s in await app.stream_infos()])

    async def clusters(req: Request) -> Response:
        return _no_params(req) or _json(200, app.clusters.describe())

    app.admin.route("/", guarded(index))
    app.admin.route("/debug/views", guarded(views))
    app.admin.route("/debug/streams", guarded(streams))
    app.admin.route("/debug/endpoints", guarded(endpoints))
    app.admin.route("/debug/syncz", guarded(syncz))
    app.admin.route("/debug/clusters", guarded(clusters))


def _endpoints(app: App, req: Request) -> Response:
    unknown = set(req.query) - _ENDPOINTS_PARAMS
    if unknown:
        return Response.text(400, f"unknown query parameter {sorted(unknown)[0]!r}")
    if req.query.get("format", ["html"])[-1] not in ("html", "json"):
        return Response.text(400, "format must be html or json")
    authority = req.query.get("authority", [""])[0]
    if not authority:
        return Response.text(400, "missing ?authority=<svc>.<ns>.svc.<domain>:<port>")
    try:
        key = parse_authority(authority, app.config.cluster_domain, default_port=None)
    except AuthorityError as e:
        return Response.text(400, f"bad authority {authority!r}: {e}")
    if key.service not in app.cluster.services:
        return Response.text(404, f"no service {key.service} in the cluster")
    node = req.query.get("node", [""])[0]
    key = ViewKey(key.service, key.port, FilterKey(node_name=node,
                                                   hostname=key.filter.hostname))
    # Read-only: the View clients share if the target is watched, else one made for
    # this page alone; each renderer encodes afresh and keeps nothing, so no client's
    # version, no metric and no subscriber count moves.
    try:
        view = app.views.peek(key)
    except LookupError as e:
        return Response.text(400, str(e))
    rendered = {name: render(view) for name, render in sorted(app.renderers.items())}
    addresses = {name: set(eps) for name, (eps, _) in rendered.items()}
    union = set().union(*addresses.values()) if addresses else set()
    differences = {
        addr: sorted(name for name, have in addresses.items() if addr in have)
        for addr in sorted(union)
        if any(addr not in have for have in addresses.values())
    }
    core = core_endpoints(view)
    # The View's publish time is monotonic; people read wall-clock time.
    published = human_time(time.time() - (time.monotonic() - view.published_at)) \
        if view.published_at else None
    client_ns = req.query.get("namespace", [key.service.namespace])[0]
    routes = {}
    for name, render_routes in sorted(app.route_renderers.items()):
        rows, left_out = render_routes(key.service, key.port, client_ns)
        routes[name] = {"rows": [{"match": r.match, "to": r.to, "notes": list(r.notes),
                                  "source": r.source} for r in rows],
                        "left_out": left_out}
    doc = {
        "authority": authority,
        "client_namespace": client_ns,
        "routes": routes,
        "version": view.version,
        "published": published,
        "view": {"endpoints": core},
        "protocols": {name: {"endpoints": eps, "message": msg}
                      for name, (eps, msg) in rendered.items()},
        "differences": differences,
        "agree": not differences,
    }
    if req.wants_json():
        return _json(200, doc)
    return Response(200, endpoints_page(doc).encode(), "text/html; charset=utf-8")


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def core_endpoints(view: View) -> dict[str, dict[str, Any]]:
    """What the core View holds, by "ip:port" (of two endpoints at one address, the
    ready one, as both protocols choose)."""
    out: dict[str, dict[str, Any]] = {}
    for _, r in sorted(view.snapshot.items(), key=lambda item: not item[1].endpoint.ready):
        ep = r.endpoint
        addr = _address(ep.ip, ep.port)
        if addr in out:
            continue
        state = "ready" if ep.ready else "draining" if ep.serving and ep.terminating \
            else "not ready"
        out[addr] = {"state": state, "zone": ep.zone or "", "node": ep.node_name,
                     "pod": ep.pod_name, "identity": ep.enrichment.identity,
                     "weight": r.weight, "zone_locality": r.zone_locality}
    return out


_LABELS = {"linkerd": "Linkerd Get stream", "xds": "xDS ClusterLoadAssignment"}
# Fields two columns both carry and must agree on where both set them.
_COMPARED = ("zone", "identity")


def _fields(fields: dict[str, Any], clash: set[str]) -> str:
    return "<br>".join(
        (f'<span class="clash">{html.escape(k)}</span>' if k in clash else html.escape(k))
        + f" <b>{html.escape(str(v))}</b>"
        for k, v in sorted(fields.items()) if v not in ("", None))


def endpoints_page(doc: dict[str, Any]) -> str:
    """/debug/endpoints as a person reads it: one row per endpoint address, one column
    per holder (the core View, then each protocol), what differs highlighted."""
    columns: list[tuple[str, str, dict[str, dict[str, Any]]]] = [
        ("view", "core View", doc["view"]["endpoints"])]
    columns += [(name, _LABELS.get(name, name), p["endpoints"])
                for name, p in sorted(doc["protocols"].items())]
    protocols = [eps for name, _, eps in columns if name != "view"]
    rows = []
    for addr in sorted(set().union(*(eps for _, _, eps in columns))):
        core = doc["view"]["endpoints"].get(addr)
        # Every protocol announces a ready endpoint and nothing the View lacks; where
        # protocols split over a draining one, that is a difference too.
        differs = addr in doc["differences"] or any(
            (core is not None and core["state"] == "ready" and addr not in eps)
            or (core is None and addr in eps) for eps in protocols)
        held = [eps[addr] for _, _, eps in columns if addr in eps]
        clash = {f for f in _COMPARED
                 if len({h[f] for h in held if h.get(f)}) > 1}
        cells = []
        for _, _, eps in columns:
            if addr not in eps:
                cells.append('<td class="absent">absent</td>' if differs else
                             '<td class="omitted">not announced</td>')
                continue
            cells.append(f'<td class="{"clash" if clash else "held"}">'
                         f'{_fields(eps[addr], clash)}</td>')
        cls = "differ" if differs or clash else "same"
        rows.append(f'<tr class="{cls}"><td>{html.escape(addr)}</td>{"".join(cells)}</tr>')
    heads = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in columns)
    verdict = ("every holder agrees" if not any('class="differ"' in r for r in rows)
               else "the holders differ (highlighted)")
    authority = html.escape(doc["authority"])
    rendered = human_time(time.time())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{authority} - meshbridge</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 10px;text-align:left;
vertical-align:top;border-bottom:1px solid #ddd}}table{{border-collapse:collapse}}
th{{border-bottom:1px solid #999}}tr.differ{{background:#fde2e2}}
td.absent{{color:#b00;font-weight:bold}}td.omitted{{color:#888}}.clash{{color:#b00}}
</style></head>
<body><h1>{authority}</h1>
<p>View version <b>{html.escape(str(doc["version"]))}</b>, published
<span id="published">{html.escape(doc["published"] or "never")}</span> &middot;
rendered <span id="rendered">{rendered}</span> &middot;
<b id="verdict">{verdict}</b> &middot;
<a href="?authority={authority}&amp;format=json">JSON</a> &middot; <a href="/">index</a></p>
<table id="endpoints"><tr><th>address</th>{heads}</tr>{"".join(rows)}</table>
{routes_section(doc)}
</body></html>
"""


def routes_section(doc: dict[str, Any]) -> str:
    """The port's routes as each client kind is told them, side by side, one row per
    position; a cell that differs from another kind's and what a kind is not told
    are highlighted."""
    routes = doc.get("routes") or {}
    if not routes:
        return ""
    names = sorted(routes)
    depth = max(len(routes[n]["rows"]) for n in names)

    def text(row: dict[str, Any]) -> str:
        notes = f" [{'; '.join(row['notes'])}]" if row["notes"] else ""
        return f"{row['match'] or '(any)'} -> {row['to']}{notes}"

    body = []
    for i in range(depth):
        cells = [routes[n]["rows"][i] if i < len(routes[n]["rows"]) else None for n in names]
        # Backends and matches are compared; notes differ by what each kind can say.
        seen = {(c["match"], c["to"]) for c in cells if c is not None}
        cls = "same" if len(seen) == 1 and None not in cells else "differ"
        tds = "".join('<td class="absent">none</td>' if c is None else
                      f"<td>{html.escape(text(c))}<br><small>{html.escape(c['source'])}"
                      "</small></td>" for c in cells)
        body.append(f'<tr class="{cls}"><td>{i + 1}</td>{tds}</tr>')
    left = "".join(
        f"<tr class=\"differ\"><td>{html.escape(_LABELS.get(n, n))}</td><td>"
        f"{html.escape(item)}</td></tr>" for n in names for item in routes[n]["left_out"])
    heads = "".join(f"<th>{html.escape(_ROUTE_LABELS.get(n, n))}</th>" for n in names)
    ns = html.escape(doc.get("client_namespace", ""))
    return (f'<h2>routes, for a client in namespace {ns}</h2>'
            f'<table id="routes"><tr><th>#</th>{heads}</tr>{"".join(body)}</table>'
            + (f'<h3>not told to a client kind</h3><table id="left-out">{left}</table>'
               if left else '<p id="left-out">every client kind is told every route</p>'))


_ROUTE_LABELS = {"linkerd": "Linkerd OutboundPolicies", "envoy": "Envoy RDS",
                 "grpc": "proxyless gRPC RDS"}


def _protocols(infos: list[StreamInfo]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in infos:
        counts[s.protocol] = counts.get(s.protocol, 0) + 1
    return counts


def _cell(value: object) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def port_rows(app: App) -> list[dict[str, Any]]:
    """Each service port: endpoints (ready/draining), its View version and its
    subscribers by protocol, counted over every View of the port (a node-aware client
    subscribes to a View of its own node, and used to be left out)."""
    subscribers: dict[tuple[Any, int], dict[str, int]] = {}
    versions: dict[tuple[Any, int], str] = {}
    for view in app.views.views():
        at = (view.key.service, view.key.port)
        into = subscribers.setdefault(at, {})
        for protocol, n in view.subscriber_counts().items():
            into[protocol] = into.get(protocol, 0) + n
        if not view.key.filter.node_name and not view.key.filter.hostname:
            versions[at] = str(view.version)
    rows = []
    types = {k: svc.type for k, svc in app.cluster.services.items()}
    for service, port, ready, total in app.service_port_summary():
        key = next(k for k in app.cluster.services if str(k) == service)
        rows.append({"service": service, "port": port, "type": types[key],
                     "authority": format_authority(key, port, app.config.cluster_domain),
                     "ready": ready, "draining": total - ready,
                     "version": versions.get((key, port), ""),
                     "subscribers": subscribers.get((key, port), {})})
    return rows


def _index(app: App, req: Request, infos: list[StreamInfo]) -> Response:
    if req.path != "/":
        return Response.text(404, "no such page")
    if req.query:
        return Response.text(400, f"unknown query parameter {sorted(req.query)[0]!r}")
    ports = port_rows(app)
    rows = []
    for r in ports:
        link = f"/debug/endpoints?authority={html.escape(r['authority'])}"
        rows.append(
            f"<tr>{_cell(r['service'])}{_cell(r['port'])}{_cell(r['type'])}"
            f"<td><a href=\"{link}\">{html.escape(r['authority'])}</a></td>"
            f"{_cell(r['ready'])}{_cell(r['draining'])}{_cell(r['version'] or '-')}"
            f"{_cell(_counts(r['subscribers']))}</tr>")
    streams = []
    for s in infos:
        sync = s.syncz()
        behind = f"{sync['behind_seconds']:g}s"
        per_type: dict[str, dict[str, Any]] = sync["types"] or {"-": {}}
        for name, t in per_type.items():
            streams.append(
                f"<tr>{_cell(s.id)}{_cell(s.protocol)}{_cell(s.peer)}{_cell(s.client[:80])}"
                f"{_cell(sync['started'])}{_cell(name)}{_cell(t.get('sent') or '-')}"
                f"{_cell(t.get('sent_at') or '-')}{_cell(t.get('acked') or '-')}"
                f"{_cell(t.get('nack') or '-')}{_cell(t.get('state', '-'))}"
                f"{_cell(behind)}</tr>")
    subscribed = sum(sum(r["subscribers"].values()) for r in ports)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>meshbridge</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 10px;text-align:left}}
table{{border-collapse:collapse}}th{{border-bottom:1px solid #999}}
tr:nth-child(even){{background:#f3f3f3}}</style></head>
<body><h1>meshbridge</h1>
<p>source <b>{html.escape(app.source.name)}</b> &middot;
{len(app.cluster.services)} services &middot; {len(app.views.views())} views &middot;
{len(infos)} streams ({html.escape(_counts(_protocols(infos)))}) &middot;
{subscribed} subscriptions &middot;
<a href="/debug/views">/debug/views</a> &middot; <a href="/debug/streams">/debug/streams</a>
&middot; <a href="/debug/syncz">/debug/syncz</a>
&middot; <a href="/debug/clusters">/debug/clusters</a>
&middot; <a href="/metrics">/metrics</a> &middot; <a href="/ready">/ready</a></p>
<h2>Service ports</h2>
<table id="services"><tr><th>service</th><th>port</th><th>type</th><th>authority</th>
<th>ready</th><th>draining</th><th>version</th><th>subscribers</th></tr>{"".join(rows)}</table>
<h2>Clients</h2>
<table id="streams"><tr><th>id</th><th>protocol</th><th>peer</th><th>client</th>
<th>connected</th><th>type / target</th><th>sent</th><th>sent at</th><th>ACKed</th>
<th>NACK</th><th>state</th><th>behind</th></tr>{"".join(streams)}</table>
</body></html>
"""
    return Response(200, page.encode(), "text/html; charset=utf-8")
