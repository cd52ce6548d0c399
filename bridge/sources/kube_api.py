"""The Kubernetes API client: credentials as kubectl finds them
(bridge/sources/kubeconfig.py), and requests against the API server: JSON, or the
API's protobuf where the caller asks for it (bridge/sources/kube_wire.py). Used by the
kube source's watchers, by the start-up checks (one list per kind before anything is
served) and by the identity service's TokenReview; it knows nothing of what any of
them asks.
"""

from __future__ import annotations

import json
import os
from typing import Any

import urllib3

from bridge.sources import kubeconfig as kubeconfig_reader
from bridge.sources.base import SourceSpecError
from bridge.sources.kubeconfig import Credentials

__all__ = ["ApiClient", "ApiError", "Credentials", "Gone", "load_credentials", "watch_params"]

WATCH_TIMEOUT_RANGE = (240, 480)  # seconds; randomised like client-go to spread renewals


class ApiError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


class Gone(Exception):
    """The resourceVersion we watch from has been compacted away: relist."""


def refusal(status: int, reason: str, body: bytes,
            content_type: str | None) -> ApiError | Gone:
    """The error for an answer >= 300: the Status's message where the body has one."""
    from bridge.sources import kube_wire  # the protobuf messages: only once answered

    message = kube_wire.status_message(body, content_type) or reason
    return Gone(message) if status == 410 else ApiError(status, message)


def load_credentials(kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """In-cluster config when running in a pod (and no kubeconfig is named), else
    KUBECONFIG / ~/.kube/config, as kubectl does (bridge/sources/kubeconfig.py)."""
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return kubeconfig_reader.in_cluster()
        except kubeconfig_reader.KubeconfigError as e:
            raise SourceSpecError(f"kube source: in-cluster config: {e}") from e
    # The errors name the file and the context looked for.
    path = kubeconfig or os.environ.get("KUBECONFIG") or kubeconfig_reader.DEFAULT_KUBECONFIG
    wanted = f"context {context!r}" if context else "its current-context"
    if not any(f.is_file() for f in kubeconfig_reader.kubeconfig_files(kubeconfig)):
        raise SourceSpecError(f"kube source: kubeconfig {path}: no such file (give "
                              "--kubeconfig, or set KUBECONFIG)")
    try:
        return kubeconfig_reader.from_kubeconfig(kubeconfig, context)
    except kubeconfig_reader.KubeconfigError as e:
        raise SourceSpecError(f"kube source: kubeconfig {path}, {wanted}: {e}") from e


def watch_params(timeout: int, resource_version: str | None,
                 extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """The query of one watch: from `resource_version`, or (None) with the state sent
    first (WatchList: `sendInitialEvents`, ended by the `k8s.io/initial-events-end`
    bookmark), bookmarks asked for either way; `extra` is the kind's selectors."""
    params = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout),
              **dict(extra)}
    if resource_version is None:
        params |= {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
    else:
        params["resourceVersion"] = resource_version
    return params


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

    def open(self, path: str, params: dict[str, Any], read_timeout: float,
             accept: str | None = None) -> Any:
        """A streaming GET; ApiError (Gone for 410) when the server answers >= 300."""
        resp = self.request(path, params, read_timeout, accept)
        if resp.status >= 300:
            body = resp.read(65536)
            resp.release_conn()
            raise refusal(resp.status, resp.reason or "", body,
                          resp.headers.get("Content-Type"))
        return resp

    def request(self, path: str, params: dict[str, Any], read_timeout: float,
                accept: str | None = None) -> Any:
        """A streaming GET, whatever the server answers (the Pod relay passes the
        status on as it is)."""
        headers = self.creds.headers if accept is None else {**self.creds.headers,
                                                             "Accept": accept}
        return self.pool.request(
            "GET", self.creds.host + path, fields=params, headers=headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=5.0, read=read_timeout),
        )

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
