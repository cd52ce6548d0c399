"""What `serve` checks before it serves anything, so that an ordinary mistake (a busy
port, a kubeconfig that is not there, a ClusterRole that was never bound) ends the
process with one line that names it, not with a traceback or, worse, a server that
says it is serving and then quietly stops.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from bridge.sources.kube import KubeSource
    from bridge.sources.kube_api import Credentials

log = structlog.get_logger("meshbridge.startup")

# The kinds the endpoint view cannot do without: denied at start, the process would
# serve an empty mesh and call itself ready. Other kinds denied are served as empty,
# with the watcher's "access denied; other kinds keep working" line.
_REQUIRED = frozenset({"Service", "EndpointSlice", "Endpoints"})


class StartupError(Exception):
    """A reason not to start, as the one line a person reads."""


def check_listen_address(flag: str, address: str) -> None:
    """`host:port` with a port in range; StartupError naming the flag otherwise."""
    from meshbridge.host import split_listen_address

    try:
        _, port = split_listen_address(address)
    except ValueError:
        raise StartupError(f"{flag} {address!r}: expected HOST:PORT (e.g. 127.0.0.1:8086, "
                           f":8086 for every address, port 0 for any free port)") from None
    if port > 65535:
        raise StartupError(f"{flag} {address!r}: port {port} is above 65535")
    _probe_bind(flag, address)


def _probe_bind(flag: str, address: str) -> None:
    """Bind and let go, as the server will (SO_REUSEADDR): a busy port or a host that
    does not resolve is found before anything starts, in one line. Losing a race after
    this is still caught where the server binds (`describe_os_error`)."""
    from meshbridge.host import split_listen_address

    host, port = split_listen_address(address)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(None if host in ("", "*") else host, port,
                                   socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except OSError as e:
        raise StartupError(f"{flag} {address}: cannot resolve {host!r}: {e.strerror or e}"
                           ) from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as e:
            raise StartupError(describe_os_error(flag, address, e)) from None


def load_kube_credentials(kubeconfig: str | None, context: str | None) -> Credentials:
    """The kube source's credentials, loaded before anything is served (the source
    would otherwise find them missing only once the ports are open)."""
    from bridge.sources.base import SourceSpecError
    from bridge.sources.kube_api import load_credentials

    try:
        return load_credentials(kubeconfig, context)
    except SourceSpecError as e:
        raise StartupError(str(e)) from e


def check_kube_access(creds: Credentials, endpoints_api: str) -> None:
    """List one object of every watched kind as the watchers will; StartupError when
    the API server rejects the credentials (401), or RBAC denies a kind the endpoint
    view needs or every kind (403). Anything else (the API server not answering yet,
    a CRD not installed) is left to the watchers, which retry."""
    from bridge.sources.kube import watched_kinds
    from bridge.sources.kube_api import ApiClient, ApiError

    client = ApiClient(creds)
    denied: list[str] = []
    specs = watched_kinds(endpoints_api)
    reason = ""
    for spec in specs:
        try:
            resp = client.open(spec.path, {"limit": 1}, read_timeout=10.0)
        except ApiError as e:
            if e.status == 401:
                raise StartupError(f"kube API {creds.host} rejected the credentials "
                                   f"(HTTP 401: {e.reason})") from None
            if e.status == 403:
                denied.append(spec.kind)
                reason = e.reason
            continue
        except Exception:  # not reachable (yet): the watchers retry with back-off
            return
        resp.release_conn()
    fatal = [k for k in denied if k in _REQUIRED]
    if fatal or (denied and len(denied) == len(specs)):
        kinds = ", ".join(fatal or denied)
        raise StartupError(
            f"kube API {creds.host}: RBAC denies listing {kinds} (HTTP 403: {reason}); "
            "bind the ClusterRole in deploy/10-rbac.yaml to meshbridge's identity")


def open_kube_watches(kubeconfig: str | None, context: str | None, endpoints_api: str,
                      options: dict[str, Any]) -> KubeSource | None:
    """The kube source with every watch opened, if its credentials load and pass
    `check_kube_access`; else None (serve then checks again, and reports).

    The Pods' watch opens first, in a relay process (bridge/sources/kube_relay.py),
    as soon as the credentials are loaded: before the kube source's own modules are
    imported and the access checked, so that the API server starts sending the
    biggest state at once and is never held back by this process's GIL."""
    from bridge.sources.kube_kinds import KINDS
    from bridge.sources.kube_relay import RelayedWatch

    try:
        creds = load_kube_credentials(kubeconfig, context)
    except StartupError:
        return None
    pods = RelayedWatch.initial(creds, KINDS["Pod"])
    try:
        from bridge.sources.kube import KubeSource

        check_kube_access(creds, endpoints_api)
        source = KubeSource(**{**options, "credentials": creds})
    except Exception:  # StartupError, a bad option: serve's own path says what
        pods.release_conn()
        return None
    source.start_watches({"Pod": pods})
    return source


def describe_os_error(flag: str, address: str, error: OSError) -> str:
    """`--listen 127.0.0.1:8086: address already in use` and the like."""
    return f"{flag} {address}: cannot listen: {error.strerror or error}"
