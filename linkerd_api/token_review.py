"""Who a token belongs to, asked of the Kubernetes API: the TokenReview reviewer the
identity service uses with `--source kube`, as Linkerd's identity controller does.

One review is one `POST /apis/authentication.k8s.io/v1/tokenreviews` with
`spec.audiences: ["identity.l5d.io"]`, made with the kube source's own credentials
(so the RBAC is one rule: `create` on `tokenreviews`). The answer proves a
ServiceAccount only when all of these hold:

  * `status.error` is empty and `status.authenticated` is true;
  * `status.audiences` contains `identity.l5d.io` — an API server that is not
    audience-aware answers for its own audience, which is not ours;
  * `status.user.username` is `system:serviceaccount:<ns>:<sa>`, each part a DNS-1123
    label (Linkerd checks the same form: four parts, the first `system`).

The request is blocking HTTP (urllib3), so it runs in a thread: the event loop keeps
serving every other stream while the API answers.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import structlog
import urllib3

from bridge.sources.kube_api import ApiClient, ApiError, Credentials
from linkerd_api.tokens import AUDIENCE, InvalidToken, ReviewFailed, ServiceAccount

log = structlog.get_logger("meshbridge.identity")

PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
# The one ClusterRole rule this needs (deploy/rbac.yaml, the Helm chart).
RBAC_RULE = ("authentication.k8s.io", "tokenreviews", "create")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class KubeTokenReview:
    """A TokenReviewer that asks the API server. `credentials` is called once, in the
    review thread, the first time a token arrives (it may read a kubeconfig)."""

    def __init__(self, credentials: Callable[[], Credentials], timeout: float = 10.0) -> None:
        self._credentials = credentials
        self._client: ApiClient | None = None
        self.timeout = timeout

    async def review(self, token: bytes) -> ServiceAccount:
        try:
            text = token.decode("ascii").strip()
        except UnicodeDecodeError:
            raise InvalidToken("the token is not a bearer token (not ASCII)") from None
        if not text:
            raise InvalidToken("the token is empty")
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": text, "audiences": [AUDIENCE]}}
        answer = await asyncio.to_thread(self._post, body)
        return account_of_review(answer)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            if self._client is None:
                self._client = ApiClient(self._credentials())
            return self._client.post_json(PATH, body, timeout=self.timeout)
        except ApiError as e:
            if e.status in (401, 403):
                raise ReviewFailed(f"the Kubernetes API refused our TokenReview ({e}): "
                                   "meshbridge's ServiceAccount needs `create` on "
                                   "tokenreviews.authentication.k8s.io (deploy/rbac.yaml)"
                                   ) from None
            raise ReviewFailed(f"TokenReview failed: {e}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise ReviewFailed(f"TokenReview failed: {e}") from None
        except Exception as e:  # a kubeconfig that cannot be loaded, say
            raise ReviewFailed(f"TokenReview failed: {type(e).__name__}: {e}") from None


def account_of_review(review: dict[str, Any]) -> ServiceAccount:
    """The ServiceAccount a TokenReview's answer proves; InvalidToken says why not."""
    status = review.get("status")
    if not isinstance(status, dict):
        raise InvalidToken("the TokenReview has no status")
    if status.get("error"):
        raise InvalidToken(f"the token is invalid: {status['error']}")
    if status.get("authenticated") is not True:
        raise InvalidToken("the token could not be authenticated")
    audiences = status.get("audiences") or []
    if not isinstance(audiences, list) or AUDIENCE not in audiences:
        raise InvalidToken(f"the token is not for the audience {AUDIENCE} "
                           f"(the review says {audiences or 'the API server'})")
    user = status.get("user")
    username = user.get("username") if isinstance(user, dict) else None
    parts = username.split(":") if isinstance(username, str) else []
    if len(parts) != 4 or parts[0] != "system" or parts[1] != "serviceaccount":
        raise InvalidToken(f"the token is {username!r}'s, not a ServiceAccount's "
                           "(system:serviceaccount:<namespace>:<name>)")
    _, _, namespace, name = parts
    for label in (namespace, name):
        if not _LABEL.fullmatch(label):
            raise InvalidToken(f"{label!r} in {username!r} is not a DNS-1123 label")
    return ServiceAccount(namespace, name)
