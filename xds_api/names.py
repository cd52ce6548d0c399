"""One name everywhere: the authority `<svc>.<ns>.svc.<cluster-domain>:<port>`.

That one string is the Linkerd `Get` path, the xDS Cluster name, the
ClusterLoadAssignment's `cluster_name`, the proxyless Listener name (a gRPC client
dials `xds:///<authority>`) and its RouteConfiguration name. A StatefulSet instance
`<hostname>.<svc>.<ns>.svc.<cluster-domain>:<port>` names the View of that one pod.
The grammar is the core's (`bridge.authority`); xDS adds only that a name must be
spelled canonically, so that each View has exactly one resource name.
"""

from __future__ import annotations

from functools import lru_cache

from bridge.authority import AuthorityError, parse_authority, view_authority
from bridge.model import ViewKey


# Every response looks its names up again; parsing once per name keeps a push to
# thousands of streams from parsing the same name thousands of times.
@lru_cache(maxsize=1 << 16)
def parse_resource_name(name: str, cluster_domain: str) -> ViewKey | None:
    """The View a resource name stands for, or None if it names no service port."""
    try:
        key = parse_authority(name, cluster_domain, default_port=None)
    except AuthorityError:
        return None
    # `web.emojivoto.svc.cluster.local:080` would be a second name for one View.
    return key if view_authority(key, cluster_domain) == name else None


def expand_short_name(name: str, cluster_domain: str) -> str:
    """`web.emojivoto:80` -> `web.emojivoto.svc.cluster.local:80`, for people typing
    names on the command line; anything else is returned unchanged."""
    host, sep, port = name.rpartition(":")
    if sep and host.count(".") == 1:
        return f"{host}.svc.{cluster_domain}:{port}"
    if sep and host.endswith(".svc"):
        return f"{host}.{cluster_domain}:{port}"
    return name


# ---------------------------------------------------------------------- LEDS (xDS §7)

# Our LEDS collections: `xdstp://meshbridge/envoy.config.endpoint.v3.LbEndpoint/`
# `<host>/<port>/<region>/<zone>/*`, one per locality of a CLA, and in each one
# resource per endpoint, `.../<region>/<zone>/<ip>_<port>`. Segments keep to
# [A-Za-z0-9._-] (anything else is written `~xx`, its hex), so that Envoy, which
# decodes and re-encodes xdstp:// names, sends back exactly the name it was given; an
# empty region or zone is `-` (a label value never is).
LEDS_AUTHORITY = "meshbridge"
LEDS_PREFIX = f"xdstp://{LEDS_AUTHORITY}/envoy.config.endpoint.v3.LbEndpoint/"
GLOB = "/*"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _escape(segment: str) -> str:
    if not segment:
        return "-"
    return "".join(c if c in _SAFE else "".join(f"~{b:02x}" for b in c.encode())
                   for c in segment)


def _unescape(segment: str) -> str | None:
    if segment == "-":
        return ""
    out = bytearray()
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "~":
            try:
                out.append(int(segment[i + 1:i + 3], 16))
            except ValueError:
                return None
            i += 3
        elif c in _SAFE:
            out.extend(c.encode())
            i += 1
        else:
            return None
    try:
        text = out.decode()
    except UnicodeDecodeError:
        return None
    return text if _escape(text) == segment else None  # one spelling per name


def leds_collection(cluster_name: str, locality: tuple[str, str]) -> str:
    """The glob collection of one locality of a CLA."""
    host, _, port = cluster_name.rpartition(":")
    region, zone = locality
    return f"{LEDS_PREFIX}{host}/{port}/{_escape(region)}/{_escape(zone)}{GLOB}"


def leds_member(collection: str, ip: str, port: int) -> str:
    """The name of one endpoint's LbEndpoint resource in a collection."""
    return f"{collection[:-len(GLOB)]}/{_escape(ip)}_{port}"


def collection_of(name: str) -> str:
    """The collection a LEDS resource name belongs to (a collection is its own)."""
    if name.endswith(GLOB):
        return name
    return name.rpartition("/")[0] + GLOB


@lru_cache(maxsize=1 << 14)
def parse_leds_collection(name: str, cluster_domain: str
                          ) -> tuple[str, ViewKey, tuple[str, str]] | None:
    """(CLA name, View, locality) of one of our collections, or None if it is none."""
    if not (name.startswith(LEDS_PREFIX) and name.endswith(GLOB)):
        return None
    parts = name[len(LEDS_PREFIX):-len(GLOB)].split("/")
    if len(parts) != 4:
        return None
    host, port, region, zone = parts
    cluster_name = f"{host}:{port}"
    key = parse_resource_name(cluster_name, cluster_domain)
    region_text, zone_text = _unescape(region), _unescape(zone)
    if key is None or region_text is None or zone_text is None:
        return None
    return cluster_name, key, (region_text, zone_text)
