"""The admission webhook's HTTPS listener, spoken to as an API server would and as
a broken client would: every request gets a well-formed answer or a 4xx saying why,
at once, on its own connection, and the certificate comes from files or from the
identity CA."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
from pathlib import Path
from typing import Any

from admission.webhook import WebhookOptions
from linkerd_api.identity import IdentityOptions
from testkit.polling import HANG
from tests.conftest import AppFactory
from tests.integration.test_admission_webhook import _pki

REVIEW: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u-7", "kind": {"group": "linkerd.io", "version": "v1alpha2",
                                             "kind": "ServiceProfile"},
                      "operation": "CREATE", "namespace": "shop",
                      "object": {"apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
                                 "metadata": {"name": "web.shop.svc.cluster.local",
                                              "namespace": "shop"},
                                 "spec": {"routes": [{"name": "r", "condition": {}}]}}}}


def post(conn: http.client.HTTPSConnection, body: bytes, path: str = "/validate",
         method: str = "POST", headers: dict[str, str] | None = None
         ) -> tuple[int, bytes]:
    conn.request(method, path, body=body, headers={"Content-Type": "application/json",
                                                   **(headers or {})})
    resp = conn.getresponse()
    return resp.status, resp.read()


def connection(port: int, ca: Path) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(ca))
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=HANG)


async def test_every_request_gets_an_answer_or_a_4xx_saying_why(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_bytes(_pki(tmp_path))
    app = await make_app(demo_dir, layer_options=(WebhookOptions(
        "127.0.0.1:0", tmp_path / "tls.crt", tmp_path / "tls.key", max_body=64 * 1024),))
    port = app.service("admission").port

    def exchange() -> dict[str, Any]:
        out: dict[str, Any] = {}
        conn = connection(port, tmp_path / "ca.pem")
        # Two reviews on one kept-alive connection, as the API server sends them.
        status, body = post(conn, json.dumps(REVIEW).encode())
        out["refused"] = (status, json.loads(body))
        not_ours = {**REVIEW, "request": {**REVIEW["request"], "kind": {
            "group": "", "version": "v1", "kind": "ConfigMap"}}}
        status, body = post(conn, json.dumps(not_ours).encode())
        out["not_ours"] = (status, json.loads(body))
        out["garbage"] = post(conn, b"{not json")
        out["version"] = post(conn, json.dumps({**REVIEW, "apiVersion": "v9"}).encode())
        out["get"] = post(conn, b"", method="GET")
        out["path"] = post(conn, b"{}", path="/mutate")
        conn.close()
        # Oversized: answered from the header alone, the body never read.
        conn = connection(port, tmp_path / "ca.pem")
        conn.putrequest("POST", "/validate")
        conn.putheader("Content-Length", str(64 * 1024 + 1))
        conn.endheaders()
        resp = conn.getresponse()
        out["oversized"] = (resp.status, resp.read())
        conn.close()
        return out

    out = await asyncio.to_thread(exchange)
    status, review = out["refused"]
    assert status == 200 and review["response"]["uid"] == "u-7"
    assert review["response"]["allowed"] is False
    assert review["response"]["status"]["message"] == (
        "ServiceProfile shop/web.shop.svc.cluster.local: spec.routes[0].condition: must set "
        "at least one field")
    status, review = out["not_ours"]
    assert status == 200 and review["response"]["allowed"] is True
    assert review["response"]["warnings"] == [
        "meshbridge does not validate core/ConfigMap; admitted unchecked"]
    assert out["garbage"][0] == 400 and b"the body is not JSON" in out["garbage"][1]
    assert out["version"][0] == 400 and b"apiVersion 'v9' is not one of" in out["version"][1]
    assert out["get"][0] == 405 and out["path"][0] == 404
    assert out["oversized"][0] == 413 and b"the limit is 65536" in out["oversized"][1]
    counted = app.metrics.get_sample_value("meshbridge_admission_reviews_total", {
        "kind": "-", "result": "bad_request", "reason": "bad_review"})
    assert counted == 2


async def test_the_identity_ca_issues_the_webhook_s_certificate(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    anchors = tmp_path / "anchors.pem"
    app = await make_app(demo_dir, layer_options=(
        IdentityOptions(write_trust_anchors=anchors),
        WebhookOptions("127.0.0.1:0", cert_from_identity=True,
                       names=("meshbridge.meshbridge.svc", "127.0.0.1"))))
    port = app.service("admission").port

    def exchange() -> tuple[int, bytes]:
        conn = connection(port, anchors)  # verifies the name 127.0.0.1 against the SANs
        try:
            return post(conn, json.dumps(REVIEW).encode())
        finally:
            conn.close()

    status, body = await asyncio.to_thread(exchange)
    assert status == 200 and json.loads(body)["response"]["allowed"] is False
