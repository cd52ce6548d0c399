"""What a destination request names: its authority and the caller's context token.

Authorities are parsed by the core (`bridge.authority`), so a name means the same to
Linkerd clients, xDS clients and the debug pages; this module adds what is Linkerd's
own (§2.1-2.3): port 80 when none is given, the length of a DNS name, a clear
word on trailing dots, and the context token. Nothing here knows about gRPC: a bad
request raises `AuthorityError` and `linkerd_api.service` maps it to a status.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from bridge import authority as core
from bridge.authority import AuthorityError
from bridge.model import ServiceKey

# The port a proxy means when its authority names none (§2.1).
DEFAULT_PORT = 80
# RFC 1035: a name is at most 253 characters (the core bounds the whole authority).
MAX_NAME_LENGTH = 253
# Tokens are a few dozen bytes of JSON; anything far larger is not one of ours.
MAX_TOKEN_LENGTH = 4096


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    @property
    def ip(self) -> str | None:
        """The host as a normalised IP address, or None when it is a name."""
        return normalise_ip(self.host)


@dataclass(frozen=True, slots=True)
class ServiceName:
    """`<svc>.<ns>.svc.<domain>`, or `<instance>.<svc>.<ns>.svc.<domain>` for one
    StatefulSet pod (§2.3)."""

    service: ServiceKey
    instance: str = ""


@dataclass(frozen=True, slots=True)
class ContextToken:
    """What the calling proxy says about itself (§2.2). All fields optional."""

    ns: str = ""
    node_name: str = ""
    pod: str = ""
    # json | legacy | empty | invalid: how the token was read, for logs and tests.
    form: str = "empty"


def normalise_ip(text: str) -> str | None:
    # Go's net.ParseIP takes no IPv6 zone (`fe80::1%eth0`), so neither do we.
    if "%" in text:
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def split_host_port(path: str) -> HostPort:
    """Split an authority as Linkerd's getHostAndPort does: no port means 80; an IPv6
    host needs brackets; the port is a number in 1..65535."""
    host, port = core.split_authority(path, default_port=DEFAULT_PORT)
    if len(host) > MAX_NAME_LENGTH:
        raise AuthorityError(
            f"name is {len(host)} characters long; DNS names are at most {MAX_NAME_LENGTH}")
    return HostPort(host, port)


def parse_service_name(host: str, cluster_domain: str) -> ServiceName:
    """Read a fully qualified service name (parseK8sServiceName, §2.3).

    Short names, the default namespace, trailing dots and other cluster domains are
    refused: a proxy always asks for the fully qualified name.
    """
    if host.endswith("."):
        raise AuthorityError("a trailing dot is not supported; name the service without it")
    service, instance = core.parse_service_host(host, cluster_domain)
    return ServiceName(service, instance)


def parse_context_token(token: str) -> ContextToken:
    """Read a proxy's context token: JSON `{"ns","nodeName","pod"}` (a trailing
    newline included, as the proxy injector writes it), or the legacy `ns:<ns>`.
    Anything else is an empty token, never an error (§2.2)."""
    if not token.strip():
        return ContextToken()
    if len(token) > MAX_TOKEN_LENGTH:
        return ContextToken(form="invalid")
    try:
        raw = json.loads(token)
    except (ValueError, RecursionError):  # RecursionError: `[[[[...` nested deep
        raw = _NOT_JSON
    if raw is None:
        # Go's json.Unmarshal of `null` into a struct succeeds and sets nothing.
        return ContextToken(form="json")
    if isinstance(raw, dict):
        # JSON null leaves a field unset; any other non-string fails Go's Unmarshal
        # as a whole.
        fields = {k: "" if raw.get(k) is None else raw[k] for k in ("ns", "nodeName", "pod")}
        if all(isinstance(v, str) for v in fields.values()):
            return ContextToken(fields["ns"], fields["nodeName"], fields["pod"], "json")
    parts = token.split(":")
    if len(parts) == 2 and parts[0] == "ns":
        return ContextToken(ns=parts[1], form="legacy")
    return ContextToken(form="invalid")


_NOT_JSON = object()
