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

from bridge.authority import AuthorityError, parse_authority
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
    return key if key.authority(cluster_domain) == name else None


def expand_short_name(name: str, cluster_domain: str) -> str:
    """`web.emojivoto:80` -> `web.emojivoto.svc.cluster.local:80`, for people typing
    names on the command line; anything else is returned unchanged."""
    host, sep, port = name.rpartition(":")
    if sep and host.count(".") == 1:
        return f"{host}.svc.{cluster_domain}:{port}"
    if sep and host.endswith(".svc"):
        return f"{host}.{cluster_domain}:{port}"
    return name
