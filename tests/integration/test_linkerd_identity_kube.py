"""Certify with the kube source: tokens are checked by the real kube-apiserver's
TokenReview API, as Linkerd's identity controller checks them. The tokens are real
projected-style ServiceAccount tokens from the TokenRequest API (audience
identity.l5d.io, as a pod's token volume holds them), signed by the apiserver's own
service-account key."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import grpc
import pytest
import structlog
from cryptography import x509
from kubernetes import client, config

from bridge.model import MeshConfig
from bridge.sources.kube import KubeSource
from bridge.sources.kube_api import load_credentials
from linkerd_api.token_review import KubeTokenReview
from linkerd_api.tokens import ReviewFailed
from meshbridge.app import App
from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.serving import loopback_app
from tests.integration.test_linkerd_identity import certify, csr_for

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

SUFFIX = ".serviceaccount.identity.linkerd.cluster.local"


class Accounts:
    """ServiceAccounts in a namespace of their own, and tokens for them."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = f"id-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace({"metadata": {"name": self.ns}})
        for name in ("web", "voting"):
            self.core.create_namespaced_service_account(self.ns, {"metadata": {"name": name}})

    def identity(self, account: str) -> str:
        return f"{account}.{self.ns}{SUFFIX}"

    def token(self, account: str, audience: str = "identity.l5d.io") -> bytes:
        request = self.core.create_namespaced_service_account_token(account, self.ns, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [audience], "expirationSeconds": 3600}})
        token: str = request.status.token
        return token.encode()


@pytest.fixture
def accounts(kube_apiserver: KubeAPIServer) -> Iterator[Accounts]:
    api = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    yield Accounts(api)
    api.close()


@pytest.fixture
async def app(kube_apiserver: KubeAPIServer) -> AsyncIterator[App]:
    source = KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path))
    served = loopback_app(source, MeshConfig())
    await served.start()
    yield served
    await served.stop(0.2)


def refusals(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "certify refused"]


async def test_the_kube_source_checks_tokens_by_token_review(app: App) -> None:
    assert isinstance(app.service("identity").reviewer, KubeTokenReview)


async def test_a_service_accounts_token_gets_a_leaf_for_exactly_its_identity(
        app: App, accounts: Accounts) -> None:
    web = accounts.identity("web")
    response = await certify(app, web, accounts.token("web"), csr_for(web))
    leaf = x509.load_der_x509_certificate(response.leaf_certificate)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [web]


@pytest.mark.parametrize(("what", "account", "token_of", "audience", "code"), [
    ("another ServiceAccount's token", "voting", "web", "identity.l5d.io",
     grpc.StatusCode.PERMISSION_DENIED),
    ("a token for another audience", "web", "web", "https://kubernetes.default.svc",
     grpc.StatusCode.UNAUTHENTICATED),
    ("a token that is no token", "web", None, "", grpc.StatusCode.UNAUTHENTICATED),
])
async def test_a_token_that_does_not_prove_the_identity_is_refused_and_logged_once(
        app: App, accounts: Accounts, what: str, account: str, token_of: str | None,
        audience: str, code: grpc.StatusCode) -> None:
    identity = accounts.identity(account)
    token = accounts.token(token_of, audience) if token_of else b"eyJnot.a.jwt"
    with structlog.testing.capture_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as e:
        await certify(app, identity, token, csr_for(identity))
    assert e.value.code() == code, what
    (line,) = refusals(logs)
    assert line["peer"].startswith("ipv4:127.0.0.1:") and accounts.ns in line["detail"], what
    assert not app.metrics.get_sample_value("meshbridge_identity_certify_total",
                                            {"result": "issued"}), what


async def test_without_rbac_for_token_reviews_the_reviewer_says_what_is_missing(
        kube_apiserver: KubeAPIServer, accounts: Accounts) -> None:
    kubeconfig = kube_apiserver.token_kubeconfig_for("no-token-reviews")
    reviewer = KubeTokenReview(lambda: load_credentials(str(kubeconfig)))
    with pytest.raises(ReviewFailed, match=r"create.*tokenreviews"):
        await reviewer.review(accounts.token("web"))
