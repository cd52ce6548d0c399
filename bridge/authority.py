"""One name everywhere: `<svc>.<ns>.svc.<cluster-domain>[:port]`.

The same string is a Linkerd `Get` path, an xDS Cluster and ClusterLoadAssignment
name and a proxyless-gRPC Listener name. `<instance>.<svc>.<ns>.svc.<domain>` names
one StatefulSet pod (matched against the endpoint hostname). The rules are Linkerd's
(Linkerd §2.1, §2.3): no short names, no default namespace, no trailing dot, the cluster
domain must match, IP hosts are not service names.
"""

from __future__ import annotations

import ipaddress
import re

from bridge.model import FilterKey, ServiceKey, ViewKey

MAX_AUTHORITY = 253 + len(":65535")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class AuthorityError(ValueError):
    """The authority names no service port; the message says why."""


def service_host(service: ServiceKey, cluster_domain: str) -> str:
    """A service's DNS name, `<svc>.<ns>.svc.<domain>` (a ServiceProfile is named so)."""
    return f"{service.name}.{service.namespace}.svc.{cluster_domain}"


def format_authority(service: ServiceKey, port: int, cluster_domain: str,
                     instance: str = "") -> str:
    """The one spelling of a service port's name: `<svc>.<ns>.svc.<domain>:<port>`, or
    `<instance>.<svc>.<ns>.svc.<domain>:<port>` for one StatefulSet pod. Every name the
    process writes comes from here, so `parse_authority` reads back what it wrote."""
    host = service_host(service, cluster_domain)
    if instance:
        host = f"{instance}.{host}"
    return f"{host}:{port}"


def view_authority(key: ViewKey, cluster_domain: str) -> str:
    """The one name of a View: its service port, and its StatefulSet pod if it names
    one (the subscriber's node is no part of a name)."""
    return format_authority(key.service, key.port, cluster_domain, key.filter.hostname)


def split_authority(authority: str, default_port: int | None = 80) -> tuple[str, int]:
    """Split an authority's `host[:port]` (IPv6 hosts in brackets); the port must be
    1..65535. A listen address (`:8086`, port 0) is not an authority."""
    if not authority:
        raise AuthorityError("empty authority")
    if len(authority) > MAX_AUTHORITY:
        raise AuthorityError(f"authority longer than {MAX_AUTHORITY} characters")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise AuthorityError("unclosed '[' in IPv6 host")
        host, rest = authority[1:end], authority[end + 1:]
        if rest and not rest.startswith(":"):
            raise AuthorityError("unexpected text after ']'")
        port_text = rest[1:] if rest else None
    elif authority.count(":") > 1:
        raise AuthorityError("too many colons (IPv6 hosts need brackets)")
    else:
        host, sep, port_text_ = authority.partition(":")
        port_text = port_text_ if sep else None
    if port_text is None:
        if default_port is None:
            raise AuthorityError("missing port")
        return host, default_port
    if not (port_text.isascii() and port_text.isdigit()):  # not '²' or '٨٠'
        raise AuthorityError(f"invalid port {port_text!r}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise AuthorityError(f"invalid port {port}")
    return host, port


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_service_host(host: str, cluster_domain: str) -> tuple[ServiceKey, str]:
    """`svc.ns.svc.<domain>` -> (service, "") ; `inst.svc.ns.svc.<domain>` -> (service, inst)."""
    labels = host.split(".")
    suffix = ["svc", *cluster_domain.split(".")]
    if len(labels) <= len(suffix) or labels[-len(suffix):] != suffix:
        raise AuthorityError(
            f"host {host!r} is not <service>.<namespace>.svc.{cluster_domain}")
    head = labels[: -len(suffix)]
    if len(head) not in (2, 3):
        raise AuthorityError(
            f"host {host!r} is not <service>.<namespace>.svc.{cluster_domain}")
    for label in head:
        if not _LABEL.match(label):
            raise AuthorityError(f"{label!r} is not a DNS label")
    if len(head) == 2:
        return ServiceKey(head[1], head[0]), ""
    return ServiceKey(head[2], head[1]), head[0]


def parse_authority(
    authority: str, cluster_domain: str, default_port: int | None = 80
) -> ViewKey:
    """The View an authority names, with an unfiltered key (no subscriber node)."""
    host, port = split_authority(authority, default_port)
    if is_ip(host):
        raise AuthorityError(f"IP address {host} is not a service name")
    service, instance = parse_service_host(host, cluster_domain)
    return ViewKey(service, port, FilterKey(hostname=instance))



TARGET_FORMS = ("<svc>.<ns>[:port], <svc>.<ns>.svc[.<domain>][:port], "
                "<pod>.<svc>.<ns>.svc.<domain>:<port>, outbound|<port>||<host>, or IP:port")


def parse_target(text: str, cluster_domain: str = "cluster.local",
                 default_port: int = 80) -> str:
    """The one grammar for the names people type to every subcommand (`get`,
    `profile`, `xds`, `shadow`), as the canonical authority the servers use.

    Short names are completed with `cluster_domain` (`web.emojivoto` ->
    `web.emojivoto.svc.cluster.local:80`); a full name keeps the domain it names (the
    server judges it); Istio's cluster names `outbound|80||web.emojivoto.svc.cluster.local`
    name the same service port (subsets are not served, so one is refused); an IP
    address with a port stays itself (a Linkerd GetProfile takes one). The port
    defaults to 80, as in an HTTP authority. AuthorityError quotes the name and says
    what is wrong with it."""
    try:
        return _target(text.strip(), cluster_domain, default_port)
    except AuthorityError as e:
        raise AuthorityError(f"name {text!r}: {e}") from None


def _target(text: str, cluster_domain: str, default_port: int) -> str:
    if "|" in text:
        parts = text.split("|")
        if len(parts) != 4:
            raise AuthorityError("an Istio cluster name is outbound|<port>|<subset>|<host>")
        direction, port_text, subset, host = parts
        if direction != "outbound":
            raise AuthorityError(f"{direction!r} clusters name no service; use outbound")
        if subset:
            raise AuthorityError(f"subset {subset!r}: meshbridge serves no subsets")
        if not port_text:
            raise AuthorityError("missing port")
        text = f"{host}:{port_text}"
    host, port = split_authority(text, default_port)
    if not host:
        raise AuthorityError("missing host")
    if is_ip(host):
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    labels = host.split(".")
    if "" in labels:
        raise AuthorityError("empty DNS label (a trailing dot, or two dots)")
    domain = cluster_domain.strip(".").split(".")
    if len(labels) == 2:
        labels += ["svc", *domain]
    elif len(labels) in (3, 4) and labels[-1] == "svc":
        labels += domain
    if "svc" not in labels[2:4] or labels[-1] == "svc":
        raise AuthorityError(f"expected {TARGET_FORMS}")
    for label in labels:
        if not _LABEL.match(label):
            raise AuthorityError(f"{label!r} is not a DNS label")
    return f"{'.'.join(labels)}:{port}"
