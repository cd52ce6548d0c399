"""The Kubernetes API client: credentials as kubectl finds them, and JSON requests
against the API server. Used by the kube source's watchers, by the start-up checks
(one list per kind before anything is served) and by the identity service's
TokenReview; it knows nothing of what any of them asks.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

import urllib3

from bridge.sources.base import SourceSpecError


class ApiError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


class Gone(Exception):
    """The resourceVersion we watch from has been compacted away: relist."""


@dataclass(frozen=True, slots=True)
class Credentials:
    host: str
    headers: dict[str, str]
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    verify: bool


def load_credentials(kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """In-cluster config when running in a pod (and no kubeconfig is named), else
    KUBECONFIG / ~/.kube/config, as kubectl does."""
    from kubernetes import client, config  # imported lazily: heavy, and only needed here

    cfg = client.Configuration()
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as e:
            raise SourceSpecError(f"kube source: in-cluster config: {e}") from e
    else:
        # The errors name the file and the context looked for (the library's do not).
        path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        wanted = f"context {context!r}" if context else "its current-context"
        files = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
        if not any(os.path.isfile(f) for f in files):
            raise SourceSpecError(f"kube source: kubeconfig {path}: no such file (give "
                                  "--kubeconfig, or set KUBECONFIG)")
        try:
            config.load_kube_config(config_file=kubeconfig, context=context,
                                    client_configuration=cfg)
        except Exception as e:  # the library raises more than ConfigException for bad files
            reason = str(e).removeprefix("Invalid kube-config file. ")
            if context and f"name {context} in" in reason:
                reason = "no such context"
            raise SourceSpecError(f"kube source: kubeconfig {path}, {wanted}: {reason}") from e
    return credentials_of(cfg)


def credentials_of(cfg: Any) -> Credentials:
    """What a loaded `kubernetes.client.Configuration` says about reaching its server
    (a kubeconfig file's, or a linked cluster's from its Secret)."""
    headers = {"Accept": "application/json", "User-Agent": "meshbridge"}
    # Client versions differ in the key they file the bearer token under.
    token = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    if token:
        headers["Authorization"] = token
    return Credentials(cfg.host.rstrip("/"), headers, cfg.ssl_ca_cert, cfg.cert_file,
                       cfg.key_file, bool(cfg.verify_ssl))


class ApiClient:
    """GET and streaming GET against the API server, JSON in, JSON out."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        kwargs: dict[str, Any] = {"maxsize": 16, "retries": False}
        if creds.host.startswith("https"):
            kwargs["cert_reqs"] = "CERT_REQUIRED" if creds.verify else "CERT_NONE"
            if creds.ca_file:
                kwargs["ca_certs"] = creds.ca_file
            if creds.cert_file:
                kwargs["cert_file"] = creds.cert_file
                kwargs["key_file"] = creds.key_file
        self.pool = urllib3.PoolManager(**kwargs)

    def open(self, path: str, params: dict[str, Any], read_timeout: float) -> Any:
        resp = self.pool.request(
            "GET", self.creds.host + path, fields=params, headers=self.creds.headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=5.0, read=read_timeout),
        )
        if resp.status >= 300:
            body = resp.read(65536)
            resp.release_conn()
            reason = resp.reason or ""
            with contextlib.suppress(ValueError):
                reason = json.loads(body).get("message", reason)
            if resp.status == 410:
                raise Gone(reason)
            raise ApiError(resp.status, reason)
        return resp

    def get_json(self, path: str, params: dict[str, Any]) -> dict[str, Any]:
        resp = self.open(path, params, read_timeout=60.0)
        try:
            data = json.loads(resp.read())
        finally:
            resp.release_conn()
        if not isinstance(data, dict):
            raise ApiError(0, f"{path}: response is not an object")
        return data

    def post_json(self, path: str, body: dict[str, Any], timeout: float = 10.0,
                  ) -> dict[str, Any]:
        """One POST (a TokenReview, say): JSON in, JSON out; ApiError on >= 300."""
        return self._send("POST", path, body, "application/json", timeout)

    def patch_json(self, path: str, body: dict[str, Any], timeout: float = 10.0,
                   ) -> dict[str, Any]:
        """One JSON merge patch (a route's status); ApiError on >= 300 (409: conflict)."""
        return self._send("PATCH", path, body, "application/merge-patch+json", timeout)

    def _send(self, method: str, path: str, body: dict[str, Any], content_type: str,
              timeout: float) -> dict[str, Any]:
        resp = self.pool.request(
            method, self.creds.host + path, body=json.dumps(body).encode(),
            headers={**self.creds.headers, "Content-Type": content_type},
            timeout=urllib3.Timeout(connect=5.0, read=timeout))
        try:
            data = json.loads(resp.data) if resp.data else {}
        except ValueError:
            data = None
        if resp.status >= 300 or not isinstance(data, dict):
            reason = data.get("message", resp.reason) if isinstance(data, dict) else resp.reason
            raise ApiError(resp.status, str(reason or ""))
        return data
