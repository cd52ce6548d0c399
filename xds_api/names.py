"""One name everywhere: the authority `<svc>.<ns>.svc.<cluster-domain>:<port>`.

That one string is the Linkerd `Get` path, the xDS Cluster name, the
ClusterLoadAssignment's `cluster_name`, the proxyless Listener name (a gRPC client
dials `xds:///<authority>`) and its RouteConfiguration name. A StatefulSet instance
`<hostname>.<svc>.<ns>.svc.<cluster-domain>:<port>` names the View of that one pod.
"""

from __future__ import annotations

import re

from bridge.model import FilterKey, ServiceKey, ViewKey

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_NAME = 253 + 6  # a DNS name and ":65535"


def parse_resource_name(name: str, cluster_domain: str) -> ViewKey | None:
    """The View a resource name stands for, or None if it names no service port.

    Only the canonical spelling is accepted, so that every name maps to one View and
    back (`ViewKey.authority`) without two names sharing one resource.
    """
    if len(name) > MAX_NAME:
        return None
    host, sep, port_text = name.rpartition(":")
    if not sep or not port_text.isdigit() or port_text.startswith("0"):
        return None
    port = int(port_text)
    if not 1 <= port <= 65535:
        return None
    suffix = f".svc.{cluster_domain}"
    if not host.endswith(suffix):
        return None
    labels = host[: -len(suffix)].split(".")
    if not all(_LABEL.match(label) for label in labels):
        return None
    if len(labels) == 2:
        svc, ns = labels
        key = ViewKey(ServiceKey(ns, svc), port, FilterKey())
    elif len(labels) == 3:
        hostname, svc, ns = labels
        key = ViewKey(ServiceKey(ns, svc), port, FilterKey(hostname=hostname))
    else:
        return None
    return key if key.authority(cluster_domain) == name else None


def resource_name(key: ViewKey, cluster_domain: str) -> str:
    return key.authority(cluster_domain)


def expand_short_name(name: str, cluster_domain: str) -> str:
    """`web.emojivoto:80` -> `web.emojivoto.svc.cluster.local:80`, for people typing
    names on the command line; anything else is returned unchanged."""
    host, sep, port = name.rpartition(":")
    if sep and host.count(".") == 1 and ".svc" not in host:
        return f"{host}.svc.{cluster_domain}:{port}"
    if sep and host.endswith(".svc"):
        return f"{host}.{cluster_domain}:{port}"
    return name
