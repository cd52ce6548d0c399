"""Where the API server is and how to prove who we are: in-cluster config or a
kubeconfig, read the way kubectl reads them.

The common cases are read here, with nothing but PyYAML: the service account's token
and CA inside a pod; and a kubeconfig's server, CA (file or data), client certificate
and key (file or data), bearer token (inline or `tokenFile`), basic auth and
`insecure-skip-tls-verify`, with `KUBECONFIG` naming several files merged as kubectl
merges them (the first file to set a name wins, and the first `current-context`).
Credentials that need code to obtain (an `exec` plugin, an `auth-provider`) are handed
to the `kubernetes` package, imported only then: it costs more start-up time and
memory than the rest of meshbridge's imports together, so a run that does not need it
must not pay for it.

Inline certificate data is written to private temporary files (removed at exit), since
TLS contexts load certificates from files.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"


class KubeconfigError(ValueError):
    """A kubeconfig we cannot use; the message says what is wrong in it."""


@dataclass(frozen=True, slots=True)
class Credentials:
    host: str
    headers: dict[str, str]
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    verify: bool


def _headers(auth: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": "meshbridge"}
    if auth:
        headers["Authorization"] = auth
    return headers


def in_cluster(root: Path = SERVICE_ACCOUNT) -> Credentials:
    """The pod's service account, as every in-cluster client finds it."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeconfigError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be "
                              "set")
    try:
        token = (root / "token").read_text().strip()
    except OSError as e:
        raise KubeconfigError(f"cannot read the service account token: {e}") from None
    if not token:
        raise KubeconfigError(f"{root / 'token'} is empty")
    ca = root / "ca.crt"
    if not ca.is_file():
        raise KubeconfigError(f"{ca}: no such file")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return Credentials(f"https://{host}:{port}", _headers(f"Bearer {token}"), str(ca), None,
                       None, True)


def kubeconfig_files(path: str | None) -> list[Path]:
    """The files a kubeconfig path names (`KUBECONFIG` may list several)."""
    text = path or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return [Path(os.path.expanduser(p)) for p in text.split(os.pathsep) if p]


def _named(entries: Any, where: Path, section: str) -> dict[str, tuple[Mapping[str, Any], Path]]:
    out: dict[str, tuple[Mapping[str, Any], Path]] = {}
    if entries is None:
        return out
    if not isinstance(entries, list):
        raise KubeconfigError(f"{where}: {section} must be a list")
    for entry in entries:
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            out[entry["name"]] = (entry, where)
    return out


@dataclass(slots=True)
class _Merged:
    current: str = ""
    contexts: dict[str, tuple[Mapping[str, Any], Path]] | None = None
    clusters: dict[str, tuple[Mapping[str, Any], Path]] | None = None
    users: dict[str, tuple[Mapping[str, Any], Path]] | None = None


def _merge(files: list[Path]) -> _Merged:
    merged = _Merged(contexts={}, clusters={}, users={})
    assert merged.contexts is not None and merged.clusters is not None
    assert merged.users is not None
    import yaml  # here: the Pod relay (kube_relay) imports this module for Credentials

    for f in files:
        if not f.is_file():
            continue
        try:
            raw = yaml.load(f.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except (OSError, yaml.YAMLError) as e:
            raise KubeconfigError(f"cannot read it: {str(e).splitlines()[0]}") from None
        if raw is None:
            continue
        if not isinstance(raw, Mapping):
            raise KubeconfigError("not a kubeconfig (the top level is not a mapping)")
        if not merged.current and isinstance(raw.get("current-context"), str):
            merged.current = raw["current-context"]
        for section, into in (("contexts", merged.contexts), ("clusters", merged.clusters),
                              ("users", merged.users)):
            for name, entry in _named(raw.get(section), f, section).items():
                into.setdefault(name, entry)
    return merged


_TEMP_FILES: list[str] = []


@atexit.register
def _remove_temp_files() -> None:
    for name in _TEMP_FILES:
        with contextlib.suppress(OSError):
            os.unlink(name)


def _material(entry: Mapping[str, Any], key: str, base: Path) -> str | None:
    """A certificate or key: `<key>-data` (base64, written to a private file) or `<key>`
    (a path, relative to the kubeconfig that names it)."""
    data = entry.get(f"{key}-data")
    if data:
        try:
            decoded = base64.b64decode(str(data), validate=False)
        except ValueError as e:
            raise KubeconfigError(f"{key}-data is not base64: {e}") from None
        fd, name = tempfile.mkstemp(prefix="meshbridge-kube-")
        with os.fdopen(fd, "wb") as out:
            out.write(decoded)
        _TEMP_FILES.append(name)
        return name
    path = entry.get(key)
    if path:
        full = Path(os.path.expanduser(str(path)))
        return str(full if full.is_absolute() else base.parent / full)
    return None


def needs_plugin(user: Mapping[str, Any]) -> bool:
    """Credentials that only code can obtain (an exec plugin, an auth provider)."""
    return bool(user.get("exec") or user.get("auth-provider"))


def from_kubeconfig(path: str | None = None, context: str | None = None) -> Credentials:
    """The credentials of `context` (else the current context) in the kubeconfig."""
    files = kubeconfig_files(path)
    merged = _merge(files)
    assert merged.contexts is not None and merged.clusters is not None
    assert merged.users is not None
    name = context or merged.current
    if not name:
        raise KubeconfigError("no current-context is set")
    if name not in merged.contexts:
        raise KubeconfigError("no such context")
    ctx = merged.contexts[name][0].get("context") or {}
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in merged.clusters:
        raise KubeconfigError(f"context {name!r} names cluster {cluster_name!r}, which is "
                              "not defined")
    cluster, cluster_file = merged.clusters[cluster_name]
    cl = cluster.get("cluster") or {}
    server = str(cl.get("server") or "").rstrip("/")
    if not server:
        raise KubeconfigError(f"cluster {cluster_name!r} has no server")
    user: Mapping[str, Any] = {}
    user_file = cluster_file
    if user_name:
        if user_name not in merged.users:
            raise KubeconfigError(f"context {name!r} names user {user_name!r}, which is not "
                                  "defined")
        entry, user_file = merged.users[user_name]
        user = entry.get("user") or {}
    if needs_plugin(user):
        return _from_plugin(path, name)
    auth = None
    if user.get("token"):
        auth = f"Bearer {user['token']}"
    elif user.get("tokenFile"):
        token_file = _material({"t": user["tokenFile"]}, "t", user_file)
        assert token_file is not None
        try:
            auth = f"Bearer {Path(token_file).read_text().strip()}"
        except OSError as e:
            raise KubeconfigError(f"tokenFile: {e}") from None
    elif user.get("username") and user.get("password"):
        basic = base64.b64encode(f"{user['username']}:{user['password']}".encode()).decode()
        auth = f"Basic {basic}"
    return Credentials(
        server, _headers(auth), _material(cl, "certificate-authority", cluster_file),
        _material(user, "client-certificate", user_file), _material(user, "client-key",
                                                                    user_file),
        not cl.get("insecure-skip-tls-verify", False))


def _from_plugin(path: str | None, context: str) -> Credentials:
    """An exec plugin or auth provider: the `kubernetes` package runs it."""
    from kubernetes import client, config  # heavy: only for credentials that need code

    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    except Exception as e:  # the library raises more than ConfigException
        raise KubeconfigError(str(e).removeprefix("Invalid kube-config file. ")) from e
    token = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    return Credentials(cfg.host.rstrip("/"), _headers(token), cfg.ssl_ca_cert, cfg.cert_file,
                       cfg.key_file, bool(cfg.verify_ssl))
