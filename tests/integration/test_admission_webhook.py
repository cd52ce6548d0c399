"""The admission webhook registered with a real kube-apiserver: the API server calls
meshbridge over HTTPS on 127.0.0.1 (clientConfig.url, caBundle from this test's CA)
with deploy/40-webhook.yaml's rules and failurePolicy. Bad objects are refused at
create with the field named, good ones are admitted, --dry-run=server is answered,
and with meshbridge stopped creates still succeed (failurePolicy Ignore)."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import ipaddress
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client, config

from admission.webhook import WebhookOptions
from bridge.sources.kube import KubeSource
from meshbridge.app import App, ServeOptions
from meshbridge.layers import protocol_layers
from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.polling import HANG, eventually_sync
from tests.integration.test_kube_policy import install_crds

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

REPO = Path(__file__).resolve().parents[2]
CRDS = Path(__file__).parent / "crds"
WAIT = HANG
DENIED = 'admission webhook "validate.meshbridge.io" denied the request: '


def _pki(directory: Path) -> bytes:
    """A CA and a server certificate for 127.0.0.1 signed by it (tls.crt, tls.key in
    `directory`); returns the CA's PEM, the caBundle."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook-test-ca")])

    def build(subject: x509.Name, public: Any, ca: bool) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                .public_key(public).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(hours=2))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))

    ca = build(ca_name, ca_key.public_key(), True).sign(ca_key, hashes.SHA256())
    leaf = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "meshbridge-webhook")]),
                 key.public_key(), False).add_extension(
        x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
        critical=False).sign(ca_key, hashes.SHA256())
    (directory / "tls.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return ca.public_bytes(serialization.Encoding.PEM)


def webhook_configuration(name: str, port: int, ca: bytes, label: str,
                          failure_policy: str = "Ignore") -> dict[str, Any]:
    """deploy/40-webhook.yaml, pointed at 127.0.0.1:`port` and at namespaces labelled
    `label` only (the API server is shared with other tests)."""
    (found,) = [d for d in yaml.safe_load_all(
        (REPO / "deploy" / "40-webhook.yaml").read_text()) if d]
    vwc: dict[str, Any] = copy.deepcopy(found)
    vwc["metadata"]["name"] = name
    (hook,) = vwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore"  # the default the manifest ships
    hook["failurePolicy"] = failure_policy
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate",
                            "caBundle": base64.b64encode(ca).decode()}
    hook["namespaceSelector"] = {"matchLabels": {"meshbridge-webhook-test": label}}
    return vwc


@pytest.fixture
def api(kube_apiserver: KubeAPIServer) -> Iterator[client.ApiClient]:
    c = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    install_crds(c)
    install_crds(c, CRDS / "serviceprofiles.yaml")
    yield c
    c.close()


class Cluster:
    """A namespace of the test API server, and the calls the test makes in it."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.ns = f"wh-{uuid.uuid4().hex[:8]}"
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.core.create_namespace({"metadata": {"name": self.ns, "labels": {
            "meshbridge-webhook-test": self.ns}}})

    def create(self, group: str, version: str, plural: str, body: dict[str, Any],
               dry_run: bool = False) -> str:
        """"" when admitted, else the API server's message."""
        try:
            self.custom.create_namespaced_custom_object(
                group, version, self.ns, plural, body, dry_run="All" if dry_run else None)
        except client.ApiException as e:
            return str(json.loads(e.body).get("message", e.body))
        return ""

    def exists(self, group: str, version: str, plural: str, name: str) -> bool:
        try:
            self.custom.get_namespaced_custom_object(group, version, self.ns, plural, name)
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise
        return True


def profile(name: str, condition: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
            "metadata": {"name": name},
            "spec": {"routes": [{"name": "GET /books", "condition": condition}]}}


def route(name: str, port: int) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web",
                                     "port": port}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}


def server(name: str, access_policy: str, app: str = "web") -> dict[str, Any]:
    return {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server",
            "metadata": {"name": name},
            "spec": {"podSelector": {"matchLabels": {"app": app}}, "port": 8080,
                     "proxyProtocol": "HTTP/1", "accessPolicy": access_policy}}


SP = ("linkerd.io", "v1alpha2", "serviceprofiles")
HTTPROUTE = ("gateway.networking.k8s.io", "v1", "httproutes")
SERVER = ("policy.linkerd.io", "v1beta3", "servers")


async def test_bad_objects_are_refused_at_create_naming_the_field_and_good_ones_pass(
        api: client.ApiClient, kube_apiserver: KubeAPIServer, tmp_path: Path) -> None:
    cluster = Cluster(api)
    ns = cluster.ns
    cluster.core.create_namespaced_service(ns, {"metadata": {"name": "web"}, "spec": {
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    ca = _pki(tmp_path)
    app = App(KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path)),
              options=ServeOptions("127.0.0.1:0", "127.0.0.1:0", layer_options=(
                  WebhookOptions("127.0.0.1:0", tmp_path / "tls.crt", tmp_path / "tls.key"),)),
              layers=protocol_layers())
    await app.start()
    admission = client.AdmissionregistrationV1Api(api)
    vwc = webhook_configuration(f"meshbridge-{ns}", app.service("admission").port, ca, ns)
    admission.create_validating_webhook_configuration(vwc)
    stopped = False

    def while_serving() -> None:
        # In a thread: the API server calls back into this process's event loop.
        bad_sp = profile(f"web.{ns}.svc.cluster.local", {})
        # The API server takes the configuration up within moments; --dry-run=server
        # asks the webhook without storing anything.
        eventually_sync(lambda: cluster.create(*SP, bad_sp, dry_run=True) != "", WAIT,
                        "the API server calls the webhook")

        message = cluster.create(*SP, bad_sp)
        assert message == (f"{DENIED}ServiceProfile {ns}/web.{ns}.svc.cluster.local: "
                           "spec.routes[0].condition: must set at least one field")
        assert not cluster.exists(*SP, f"web.{ns}.svc.cluster.local")

        message = cluster.create(*HTTPROUTE, route("to-81", 81))
        assert message.startswith(f"{DENIED}HTTPRoute {ns}/to-81: spec.parentRefs[0].port: "
                                  f"Service {ns}/web has no port 81"), message

        message = cluster.create(*SERVER, server("web-http", "allow-everyone"))
        assert message.startswith(f"{DENIED}Server {ns}/web-http: spec.accessPolicy: "
                                  "'allow-everyone' is not one of"), message

        # Good ones pass, in --dry-run=server (nothing stored) and for real.
        good_sp = profile(f"web.{ns}.svc.cluster.local", {"method": "GET",
                                                          "pathRegex": "/books"})
        assert cluster.create(*SP, good_sp, dry_run=True) == ""
        assert not cluster.exists(*SP, f"web.{ns}.svc.cluster.local")
        assert cluster.create(*SP, good_sp) == ""
        assert cluster.create(*HTTPROUTE, route("to-80", 80)) == ""
        assert cluster.create(*SERVER, server("web-http", "all-authenticated")) == ""
        # A second Server for the same pods and port, once meshbridge has seen the first.
        eventually_sync(lambda: any(s.meta.name == "web-http"
                                    for s in app.cluster.servers_in(ns)), WAIT,
                        "the kube source has the first Server")
        message = cluster.create(*SERVER, server("web-http-2", "deny"))
        assert f"spec.podSelector: Server {ns}/web-http already covers port 8080" in message

    try:
        await asyncio.to_thread(while_serving)
        metrics = app.metrics
        refused = metrics.get_sample_value("meshbridge_admission_reviews_total", {
            "kind": "linkerd.io/ServiceProfile", "result": "refused", "reason": "invalid"})
        admitted = metrics.get_sample_value("meshbridge_admission_reviews_total", {
            "kind": "linkerd.io/ServiceProfile", "result": "admitted", "reason": "admitted"})
        assert refused is not None and refused >= 2 and admitted == 2

        # meshbridge stopped: failurePolicy Ignore admits what it would have refused.
        await app.stop(0.1)
        stopped = True
        name = f"api.{ns}.svc.cluster.local"
        assert await asyncio.to_thread(cluster.create, *SP, profile(name, {})) == ""
        assert await asyncio.to_thread(cluster.exists, *SP, name)
    finally:
        admission.delete_validating_webhook_configuration(vwc["metadata"]["name"])
        if not stopped:
            await app.stop(0.1)
