"""The shared gRPC port itself: TLS, mTLS and per-client limits, over real gRPC.

A tiny echo-stream service stands in for the protocol layers here, so that what is
tested is the port's own behaviour; the layers' tests cover their streams.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bridge.sources.files import FilesSource
from meshbridge.app import App, ServeOptions, TlsFiles
from meshbridge.host import GrpcServer, Host, Layer
from meshbridge.limits import Limits
from testkit.polling import HANG, eventually
from testkit.serving import loopback_app

METHOD = "/meshbridge.test.Hold/Stream"


def hold(host: Host, server: GrpcServer) -> None:
    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield b"hello"
        await asyncio.Event().wait()  # hold the stream open until cancelled

    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "meshbridge.test.Hold", {"Stream": grpc.unary_stream_rpc_method_handler(stream)}),))


async def start(tmp_path: Path, **options: Any) -> App:
    (tmp_path / "m").mkdir(exist_ok=True)
    app = App(FilesSource(tmp_path / "m"), options=ServeOptions("127.0.0.1:0", "127.0.0.1:0",
                                                                **options),
              layers=[Layer("hold", hold)])
    await app.start()
    return app


async def first_message(channel: grpc.aio.Channel) -> tuple[grpc.aio.UnaryStreamCall, bytes]:
    call = channel.unary_stream(METHOD)(b"")
    async for msg in call:
        return call, msg
    raise AssertionError(f"stream ended: {await call.code()}")


async def test_streams_over_the_per_client_limit_are_refused_and_others_unaffected(
    tmp_path: Path
) -> None:
    app = await start(tmp_path, limits=Limits(max_streams_per_client=3))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
            held = [await first_message(ch) for _ in range(3)]
            extra = ch.unary_stream(METHOD)(b"")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in extra:
                    pass
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-streams-per-client" in (err.value.details() or "")
            # The held streams are untouched; closing one makes room for a new one.
            held[0][0].cancel()
            await eventually(lambda: app.rpc_guard.open.count("127.0.0.1") < 3, HANG,
                             "the cancelled stream's place given back")
            _, msg = await first_message(ch)
            assert msg == b"hello"
            for call, _ in held[1:]:
                assert not call.done()
    finally:
        await app.stop(0.1)


def _cert(name: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
          ca: bool = False) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = issuer if issuer else (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, bytes]:
    ca, ca_key = _cert("meshbridge-test-ca", None, ca=True)
    other_ca, other_key = _cert("other-ca", None, ca=True)
    server, server_key = _cert("localhost", (ca.subject, ca_key))
    client, client_key = _cert("proxy", (ca.subject, ca_key))
    rogue, rogue_key = _cert("rogue", (other_ca.subject, other_key))
    files = {"ca": _pem(ca), "server": _pem(server), "server_key": _key_pem(server_key)}
    for name, data in files.items():
        (tmp_path / f"{name}.pem").write_bytes(data)
    return {**files, "client": _pem(client), "client_key": _key_pem(client_key),
            "rogue": _pem(rogue), "rogue_key": _key_pem(rogue_key), "other_ca": _pem(other_ca)}


async def test_mtls_admits_a_client_with_a_cert_from_the_ca_and_refuses_others(
    tmp_path: Path, pki: dict[str, bytes]
) -> None:
    tls = TlsFiles(str(tmp_path / "server.pem"), str(tmp_path / "server_key.pem"),
                   str(tmp_path / "ca.pem"))
    app = await start(tmp_path, tls=tls)
    target = f"localhost:{app.grpc_port}"
    try:
        good = grpc.ssl_channel_credentials(pki["ca"], pki["client_key"], pki["client"])
        async with grpc.aio.secure_channel(target, good) as ch:
            _, msg = await first_message(ch)
            assert msg == b"hello"
        refused = {
            "no client cert": grpc.ssl_channel_credentials(pki["ca"]),
            "client cert from another CA": grpc.ssl_channel_credentials(
                pki["ca"], pki["rogue_key"], pki["rogue"]),
            "server not trusted": grpc.ssl_channel_credentials(
                pki["other_ca"], pki["client_key"], pki["client"]),
        }
        for why, creds in refused.items():
            async with grpc.aio.secure_channel(target, creds) as ch:
                call = ch.unary_stream(METHOD)(b"", timeout=HANG)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in call:
                        pass
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, why
        async with grpc.aio.insecure_channel(target) as ch:  # plaintext to a TLS port
            call = ch.unary_stream(METHOD)(b"", timeout=5)
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in call:
                    pass
    finally:
        await app.stop(0.1)


async def test_tls_without_client_ca_serves_any_client_that_trusts_the_server(
    tmp_path: Path, pki: dict[str, bytes]
) -> None:
    tls = TlsFiles(str(tmp_path / "server.pem"), str(tmp_path / "server_key.pem"))
    app = await start(tmp_path, tls=tls)
    try:
        creds = grpc.ssl_channel_credentials(pki["ca"])
        async with grpc.aio.secure_channel(f"localhost:{app.grpc_port}", creds) as ch:
            _, msg = await first_message(ch)
            assert msg == b"hello"
    finally:
        await app.stop(0.1)


async def test_grpc_server_metrics_count_streams_messages_and_codes(tmp_path: Path) -> None:
    app = await start(tmp_path, limits=Limits(max_streams_per_client=1))
    labels = {"grpc_service": "meshbridge.test.Hold", "grpc_method": "Stream",
              "grpc_type": "server_stream"}

    def sample(name: str, **extra: str) -> float:
        return app.metrics.get_sample_value(name, {**labels, **extra}) or 0.0

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
            call, _ = await first_message(ch)
            refused = ch.unary_stream(METHOD)(b"")
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in refused:
                    pass
            call.cancel()
            await eventually(
                lambda: sample("grpc_server_handled_total", grpc_code="Canceled") >= 1, HANG,
                "the cancelled call counted")
    finally:
        await app.stop(0.1)
    assert sample("grpc_server_started_total") == 2
    assert sample("grpc_server_msg_sent_total") == 1
    assert sample("grpc_server_handled_total", grpc_code="ResourceExhausted") == 1
    assert sample("grpc_server_handling_seconds_count") == 1


async def test_the_get_and_xds_clients_speak_mtls_with_matching_flags(
    tmp_path: Path, pki: dict[str, bytes], demo_dir: Path
) -> None:
    import sys

    for name in ("client", "client_key"):
        (tmp_path / f"{name}.pem").write_bytes(pki[name])
    tls = TlsFiles(str(tmp_path / "server.pem"), str(tmp_path / "server_key.pem"),
                   str(tmp_path / "ca.pem"))
    app = loopback_app(FilesSource(demo_dir), tls=tls)
    await app.start()
    try:
        tls_flags = ["--server", f"localhost:{app.grpc_port}", "--ca-cert",
                     str(tmp_path / "ca.pem"), "--cert", str(tmp_path / "client.pem"),
                     "--key", str(tmp_path / "client_key.pem")]
        commands = {
            "get": ["get", "web.emojivoto.svc.cluster.local:80", "--count", "1", "--json"],
            "xds": ["xds", "web.emojivoto.svc.cluster.local:80", "--count", "1", "--json"],
        }
        for name, argv in commands.items():
            ok = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "meshbridge.cli", *argv, *tls_flags,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(ok.communicate(), HANG)
            assert ok.returncode == 0, (name, err.decode())
            assert b"10.244." in out, name  # an endpoint address of the demo's web pods
            # The same command without a client certificate is refused by the server.
            refused = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "meshbridge.cli", *argv, *tls_flags[:4], "--timeout", "5",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            await asyncio.wait_for(refused.communicate(), HANG)
            assert refused.returncode != 0, name
    finally:
        await app.stop(0.1)


async def test_an_oversized_request_is_refused_with_resource_exhausted(tmp_path: Path) -> None:
    app = await start(tmp_path, limits=Limits(max_message_bytes=1024))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
            call = ch.unary_stream(METHOD)(b"x" * 4096)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            _, msg = await first_message(ch)  # the connection still serves others
            assert msg == b"hello"
    finally:
        await app.stop(0.1)
