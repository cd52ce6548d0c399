"""The identity service's listeners, as a linkerd2-proxy meets them: it has no
certificate when it first asks for one, so Certify is served on a listener of its own
with server-only TLS (`--identity-listen`) while the gRPC port requires mTLS; and
meshbridge's own TLS can come from its CA (`--tls-from-identity`), with the
control-plane names the proxies check. Real TLS and real gRPC over loopback."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bridge.sources.files import FilesSource
from linkerd_api.ca import CertificateAuthority, generate_issuer
from linkerd_api.control_tls import RENEW_AT
from linkerd_api.identity import IdentityOptions, IdentityService
from linkerd_api.proto import identity_pb2
from meshbridge.app import App, TlsFiles
from testkit.linkerd import Stream
from testkit.polling import HANG
from testkit.serving import Apps, serving_workers
from tests.integration.test_linkerd_identity import CERTIFY, TOKENS, WEB, csr_for

DESTINATION = "linkerd-destination.linkerd.serviceaccount.identity.linkerd.cluster.local"
IDENTITY = "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"
Start = Callable[..., Any]


def pem(der: bytes) -> bytes:
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)


@pytest.fixture
def start(demo_dir: Path, tmp_path: Path, apps: Apps) -> Start:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)

    async def started(tls: TlsFiles | None = None, **identity: Any) -> App:
        # --tls-from-identity is not served by workers yet (docs/workers.md): one process.
        workers = 1 if identity.get("tls_from_identity") else serving_workers()
        return await apps.start(FilesSource(demo_dir, poll_interval=0.05), tls=tls,
                                layer_options=(IdentityOptions(tokens=tokens, **identity),),
                                workers=workers)

    return started


@pytest.fixture
def issuer_files(tmp_path: Path) -> dict[str, Path]:
    """An issuer as Linkerd's linkerd-identity-issuer Secret holds it, and the
    gRPC port's mTLS files: the destination's certificate, client CA = the anchors."""
    issuer = generate_issuer("cluster.local")
    files = {name: tmp_path / f"{name}.pem" for name in
             ("issuer_cert", "issuer_key", "trust_anchors", "cert", "key")}
    files["issuer_cert"].write_bytes(issuer.certificate.public_bytes(serialization.Encoding.PEM))
    files["issuer_key"].write_bytes(issuer.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    files["trust_anchors"].write_bytes(issuer.trust_anchors_pem())
    chain, key = CertificateAuthority(issuer).issue(DESTINATION)
    files["cert"].write_bytes(chain)
    files["key"].write_bytes(key)
    return files


def channel(port: int, anchors: Path, name: str, key: bytes | None = None,
            chain: bytes | None = None) -> grpc.aio.Channel:
    """A channel that checks the server as a proxy does: the anchors, for `name`."""
    credentials = grpc.ssl_channel_credentials(anchors.read_bytes(), key, chain)
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials,
                                   options=[("grpc.ssl_target_name_override", name)])


async def certify_over(ch: grpc.aio.Channel, key: ec.EllipticCurvePrivateKey,
                       ) -> identity_pb2.CertifyResponse:
    call = ch.unary_unary(CERTIFY,
                          request_serializer=identity_pb2.CertifyRequest.SerializeToString,
                          response_deserializer=identity_pb2.CertifyResponse.FromString)
    response = await call(identity_pb2.CertifyRequest(
        identity=WEB, token=b"web-token", certificate_signing_request=csr_for(WEB, key)),
        timeout=HANG)
    assert isinstance(response, identity_pb2.CertifyResponse)
    return response


async def served_certificate(port: int, anchors: Path, name: str) -> x509.Certificate:
    """The certificate a TLS client verifying with `anchors` for `name` (as SNI and
    as the name checked) is given; the handshake fails if it does not verify."""
    context = ssl.create_default_context(cafile=str(anchors))
    context.set_alpn_protocols(["h2"])
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                              server_hostname=name)
    try:
        sock = writer.get_extra_info("ssl_object")
        assert sock.selected_alpn_protocol() == "h2"
        return x509.load_der_x509_certificate(sock.getpeercert(binary_form=True))
    finally:
        writer.close()


async def test_a_proxy_without_a_certificate_gets_one_from_the_identity_listener_then_uses_it_on_the_mtls_port(  # noqa: E501
        start: Start, issuer_files: dict[str, Path]) -> None:
    files = issuer_files
    app = await start(TlsFiles(str(files["cert"]), str(files["key"]), str(files["trust_anchors"])),
                      issuer_cert=files["issuer_cert"], issuer_key=files["issuer_key"],
                      trust_anchors=files["trust_anchors"], listen="127.0.0.1:0")
    service: IdentityService = app.service("identity")
    anchors = files["trust_anchors"]
    key = ec.generate_private_key(ec.SECP256R1())

    # Without a certificate, the mTLS port refuses the handshake...
    async with channel(app.grpc_port, anchors, DESTINATION) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await certify_over(ch, key)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # ... the identity listener does not ask for one, and presents linkerd-identity's.
    async with channel(service.listen_port, anchors, IDENTITY) as ch:
        response = await certify_over(ch, key)
    chain = pem(response.leaf_certificate) + b"".join(
        pem(c) for c in response.intermediate_certificates)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    async with channel(app.grpc_port, anchors, DESTINATION, key_pem, chain) as ch:
        update = await Stream(ch, "Get", "web.emojivoto.svc.cluster.local:80").next()
    assert update.HasField("add")
    served = await served_certificate(service.listen_port, anchors, IDENTITY)
    assert served.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName) == [IDENTITY]


async def test_tls_from_identity_serves_the_control_plane_names_the_trust_anchors_verify(
        start: Start) -> None:
    app = await start(tls_from_identity=True)
    service: IdentityService = app.service("identity")
    anchors = service.trust_anchors_path
    for name in (DESTINATION, IDENTITY):  # the default certificate, and one by SNI
        served = await served_certificate(app.grpc_port, anchors, name)
        assert served.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName) == [name]
    async with channel(app.grpc_port, anchors, IDENTITY) as ch:
        response = await certify_over(ch, ec.generate_private_key(ec.SECP256R1()))
    assert response.leaf_certificate
    async with channel(app.grpc_port, anchors, DESTINATION) as ch:
        assert (await Stream(ch, "Get", "web.emojivoto.svc.cluster.local:80").next()
                ).HasField("add")


async def test_a_renewed_control_plane_certificate_is_served_to_the_next_handshake(
        start: Start) -> None:
    app = await start(tls_from_identity=True, lifetime=3600)
    service: IdentityService = app.service("identity")
    control = service.control_tls
    assert control is not None
    anchors = service.trust_anchors_path
    before = await served_certificate(app.grpc_port, anchors, DESTINATION)
    due = control.renewal_due(DESTINATION)
    lifetime = before.not_valid_after_utc - before.not_valid_before_utc
    assert due == before.not_valid_before_utc + lifetime * RENEW_AT
    control.renew(DESTINATION)
    after = await served_certificate(app.grpc_port, anchors, DESTINATION)
    assert after.serial_number != before.serial_number
    assert after.not_valid_after_utc >= before.not_valid_after_utc


async def test_serve_says_where_the_trust_anchors_and_a_proxys_environment_are(
        start: Start) -> None:
    app = await start(listen="127.0.0.1:0")
    service: IdentityService = app.service("identity")
    env_file = service.state_dir / "proxy.env"
    text = env_file.read_text()
    assert f"LINKERD2_PROXY_IDENTITY_SVC_ADDR=127.0.0.1:{service.listen_port}\n" in text
    assert f"LINKERD2_PROXY_DESTINATION_SVC_ADDR=127.0.0.1:{app.grpc_port}\n" in text
    assert f"LINKERD2_PROXY_IDENTITY_SVC_NAME={IDENTITY}\n" in text
    assert service.trust_anchors_path.read_bytes() == service.ca.issuer.trust_anchors_pem()
    assert service.proxy_environment("127.0.0.1:0", app.grpc_port)[
        "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS"] in text


async def test_the_proxy_environment_names_every_workload_setting_a_sidecar_needs(
        start: Start) -> None:
    # A by-hand run with a real linkerd2-proxy sourced proxy.env and had no context
    # token on its Get streams: the injector's LINKERD2_PROXY_DESTINATION_CONTEXT.
    app = await start(listen="127.0.0.1:0")
    service: IdentityService = app.service("identity")
    text = (service.state_dir / "proxy.env").read_text()
    for name in ("LINKERD2_PROXY_DESTINATION_CONTEXT", "LINKERD2_PROXY_POLICY_WORKLOAD",
                 "LINKERD2_PROXY_IDENTITY_SERVER_ID", "LINKERD2_PROXY_IDENTITY_DIR",
                 "LINKERD2_PROXY_IDENTITY_TOKEN_FILE"):
        assert f"export {name}=" in text, name
    assert ("export LINKERD2_PROXY_DESTINATION_CONTEXT="
            """'{"ns":"<ns>","nodeName":"<node>","pod":"<pod>"}'\n""") in text
