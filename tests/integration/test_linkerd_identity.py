"""The identity service (linkerd_api.identity) as a linkerd2-proxy uses it: a client
that makes its own P-256 key, asks Certify for its local name with its token, and
checks the leaf against the trust anchors for that name, as the proxy's TLS stack
does. Over real gRPC on loopback."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from linkerd_api.identity import IdentityOptions
from linkerd_api.proto import identity_pb2
from meshbridge.app import App
from testkit.polling import HANG
from tests.conftest import AppFactory

CERTIFY = "/io.linkerd.proxy.identity.Identity/Certify"
WEB = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
TOKENS = "web-token emojivoto/web\nvoting-token emojivoto/voting\n" \
         "long-token emojivoto/a-service-account-with-a-rather-long-name\n"


def csr_for(name: str, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None,
            ) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    cn = [x509.NameAttribute(NameOID.COMMON_NAME, name)] if len(name) <= 64 else []
    request = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name(cn))
               .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), False)
               .sign(key, hashes.SHA256()))
    return request.public_bytes(serialization.Encoding.DER)


@pytest.fixture
async def served(make_app: AppFactory, demo_dir: Path, tmp_path: Path,
                 ) -> tuple[App, Path]:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    anchors = tmp_path / "ca-bundle.pem"
    app = await make_app(demo_dir, layer_options=(
        IdentityOptions(tokens=tokens, write_trust_anchors=anchors, lifetime=3600),))
    return app, anchors


async def certify(app: App, identity: str, token: bytes, csr: bytes,
                  ) -> identity_pb2.CertifyResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        call: Callable[..., object] = channel.unary_unary(
            CERTIFY, request_serializer=identity_pb2.CertifyRequest.SerializeToString,
            response_deserializer=identity_pb2.CertifyResponse.FromString)
        response = await call(identity_pb2.CertifyRequest(  # type: ignore[misc]
            identity=identity, token=token, certificate_signing_request=csr), timeout=HANG)
        assert isinstance(response, identity_pb2.CertifyResponse)
        return response


async def test_a_proxy_gets_a_leaf_for_its_name_that_its_trust_anchors_verify(
        served: tuple[App, Path]) -> None:
    app, anchors = served
    response = await certify(app, WEB, b"web-token\n", csr_for(WEB))
    leaf = x509.load_der_x509_certificate(response.leaf_certificate)
    chain = [x509.load_der_x509_certificate(c) for c in response.intermediate_certificates]
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [WEB]
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    expires = response.valid_until.ToDatetime(datetime.UTC)
    assert expires == leaf.not_valid_after_utc
    now = datetime.datetime.now(datetime.UTC)
    assert now + datetime.timedelta(minutes=59) < expires <= now + datetime.timedelta(hours=1)
    # What the proxy's TLS stack checks, both ways round (server and client side of mTLS).
    store = Store(x509.load_pem_x509_certificates(anchors.read_bytes()))
    verifier = PolicyBuilder().store(store).build_server_verifier(x509.DNSName(WEB))
    verifier.verify(leaf, chain)
    PolicyBuilder().store(store).build_client_verifier().verify(leaf, chain)
    assert chain[0].extensions.get_extension_for_class(x509.BasicConstraints).value.ca


async def test_a_name_too_long_for_a_common_name_gets_a_leaf_named_by_its_san_alone(
        served: tuple[App, Path]) -> None:
    app, anchors = served
    name = "a-service-account-with-a-rather-long-name.emojivoto" + WEB[len("web.emojivoto"):]
    response = await certify(app, name, b"long-token", csr_for(name))
    leaf = x509.load_der_x509_certificate(response.leaf_certificate)
    chain = [x509.load_der_x509_certificate(c) for c in response.intermediate_certificates]
    store = Store(x509.load_pem_x509_certificates(anchors.read_bytes()))
    PolicyBuilder().store(store).build_server_verifier(x509.DNSName(name)).verify(leaf, chain)
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).critical


@pytest.mark.parametrize(("what", "identity", "token", "csr", "code"), [
    ("an unknown token", WEB, b"nobody", None, grpc.StatusCode.UNAUTHENTICATED),
    ("another account's token", WEB, b"voting-token", None, grpc.StatusCode.PERMISSION_DENIED),
    ("a name of another mesh", "web.emojivoto.serviceaccount.identity.other.cluster.local",
     b"web-token", None, grpc.StatusCode.INVALID_ARGUMENT),
    ("a name that is no proxy identity", "web.emojivoto.svc.cluster.local", b"web-token",
     None, grpc.StatusCode.INVALID_ARGUMENT),
    ("a CSR that is not DER", WEB, b"web-token", b"not a csr", grpc.StatusCode.INVALID_ARGUMENT),
    ("a CSR for another name", WEB, b"web-token",
     csr_for("voting.emojivoto.serviceaccount.identity.linkerd.cluster.local"),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("a CSR with an RSA key", WEB, b"web-token",
     csr_for(WEB, rsa.generate_private_key(public_exponent=65537, key_size=2048)),
     grpc.StatusCode.INVALID_ARGUMENT),
])
async def test_a_bad_request_gets_a_precise_status_and_no_certificate(
        served: tuple[App, Path], what: str, identity: str, token: bytes,
        csr: bytes | None, code: grpc.StatusCode) -> None:
    app, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await certify(app, identity, token, csr if csr is not None else csr_for(identity))
    assert e.value.code() == code, what
    assert e.value.details(), what
    issued = app.metrics.get_sample_value("meshbridge_identity_certify_total",
                                          {"result": "issued"})
    assert not issued, what


async def test_without_a_way_to_check_tokens_every_certify_is_unauthenticated(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await certify(app, WEB, b"web-token", csr_for(WEB))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "--identity-tokens" in (e.value.details() or "")


def test_the_wire_format_is_linkerds() -> None:
    request = identity_pb2.CertifyRequest(identity="a", token=b"t",
                                          certificate_signing_request=b"c")
    assert request.SerializeToString() == b"\x0a\x01a\x12\x01t\x1a\x01c"
    response = identity_pb2.CertifyResponse(leaf_certificate=b"L",
                                            intermediate_certificates=[b"I", b"J"])
    response.valid_until.seconds = 1
    assert response.SerializeToString() == b"\x0a\x01L\x12\x01I\x12\x01J\x1a\x02\x08\x01"
    assert identity_pb2.DESCRIPTOR.package == "io.linkerd.proxy.identity"
    assert identity_pb2.DESCRIPTOR.services_by_name["Identity"].methods_by_name[
        "Certify"].full_name == "io.linkerd.proxy.identity.Identity.Certify"


async def test_the_issuers_time_left_is_exported_under_linkerds_name(
        served: tuple[App, Path]) -> None:
    app, _ = served
    issuer = app.service("identity").ca.issuer.certificate
    left = app.metrics.get_sample_value("issuer_cert_ttl_seconds")
    expected = issuer.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert left is not None and abs(left - expected.total_seconds()) < 60
