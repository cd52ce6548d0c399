"""The Linkerd identity service (`io.linkerd.proxy.identity.Identity/Certify`), a
protocol layer of its own: a linkerd2-proxy serves nothing until it holds a
certificate, so a control plane that feeds Linkerd proxies must sign one.

Certify, as Linkerd's identity controller does it:
  1. the requested name must be a proxy identity of this mesh,
     `<sa>.<ns>.serviceaccount.identity.<controller-ns>.<trust-domain>`;
  2. the token must prove a ServiceAccount (linkerd_api.tokens) ...
  3. ... the one the name is for;
  4. the CSR must be for exactly that name, with a P-256 key (linkerd_api.ca);
then the leaf, the issuer's chain and the leaf's expiry go back. Each refusal is a
precise status (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED), logged once a
minute per peer and reason and counted; nothing is issued.
"""

from __future__ import annotations

import argparse
import datetime
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import prometheus_client
import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from bridge.model import MeshConfig
from linkerd_api.ca import BadRequest, CertificateAuthority, Issuer, generate_issuer, load_issuer
from linkerd_api.proto import identity_pb2
from linkerd_api.tokens import (
    InvalidToken,
    NoReviewer,
    ServiceAccount,
    StaticTokens,
    TokenReviewer,
)
from meshbridge.host import Host

log = structlog.get_logger("meshbridge.identity")

SERVICE = "io.linkerd.proxy.identity.Identity"
LOG_EVERY = 60.0  # seconds between log lines for one peer's same refusal


@dataclass(frozen=True, slots=True)
class IdentityOptions:
    issuer_cert: Path | None = None  # PEM, with its key and the trust anchors; else generated
    issuer_key: Path | None = None
    trust_anchors: Path | None = None
    lifetime: float = 24 * 3600.0  # seconds a leaf is valid
    tokens: Path | None = None  # development mode: a static token list
    write_trust_anchors: Path | None = None  # where a generated bundle is written

    def __post_init__(self) -> None:
        given = [p is not None for p in (self.issuer_cert, self.issuer_key, self.trust_anchors)]
        if any(given) and not all(given):
            raise ValueError("--identity-issuer-cert, --identity-issuer-key and "
                             "--identity-trust-anchors go together")
        if self.lifetime < 60:
            raise ValueError("--identity-lifetime must be at least 60 seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Linkerd identity API")
    group.add_argument("--identity-issuer-cert", type=Path, default=None,
                       help="PEM issuer certificate (the linkerd-identity-issuer Secret's "
                            "crt.pem); default: an issuer generated at start")
    group.add_argument("--identity-issuer-key", type=Path, default=None,
                       help="PEM EC key of --identity-issuer-cert")
    group.add_argument("--identity-trust-anchors", type=Path, default=None,
                       help="PEM trust anchor bundle the proxies trust")
    group.add_argument("--identity-lifetime", type=float, default=24 * 3600.0,
                       help="seconds a proxy certificate is valid (default 86400)")
    group.add_argument("--identity-tokens", type=Path, default=None,
                       help="development mode: a file of 'TOKEN NAMESPACE/SERVICEACCOUNT' "
                            "lines that prove ServiceAccounts (no TokenReview)")
    group.add_argument("--identity-write-trust-anchors", type=Path, default=None,
                       help="write the (generated) trust anchor bundle here, for proxies")


def options_from_args(args: argparse.Namespace) -> IdentityOptions:
    return IdentityOptions(args.identity_issuer_cert, args.identity_issuer_key,
                           args.identity_trust_anchors, args.identity_lifetime,
                           args.identity_tokens, args.identity_write_trust_anchors)


def register(host: Host, server: Any) -> None:
    options = host.options_for(IdentityOptions)
    service = IdentityService(host.config, options, host.metrics)
    server.add_generic_rpc_handlers((service.handler(),))
    host.keep("identity", service)


class IdentityService:
    def __init__(self, config: MeshConfig, options: IdentityOptions,
                 registry: prometheus_client.CollectorRegistry | None = None,
                 reviewer: TokenReviewer | None = None) -> None:
        self.config = config
        self.suffix = f".serviceaccount.identity.{config.controller_namespace}." \
                      f"{config.trust_domain}"
        issuer = _issuer(config, options)
        self.ca = CertificateAuthority(issuer, datetime.timedelta(seconds=options.lifetime))
        if options.write_trust_anchors is not None:
            options.write_trust_anchors.write_bytes(issuer.trust_anchors_pem())
            log.info("trust anchors written", path=str(options.write_trust_anchors))
        self.reviewer: TokenReviewer = reviewer or (
            StaticTokens.read(options.tokens) if options.tokens else NoReviewer())
        self._logged: dict[tuple[str, str], float] = {}
        registry = registry or prometheus_client.CollectorRegistry()
        expiry = prometheus_client.Gauge(
            "identity_cert_expiration_timestamp_seconds",
            "when the issuer certificate expires (Unix time)", registry=registry)
        expiry.set(issuer.certificate.not_valid_after_utc.timestamp())
        self.answers = prometheus_client.Counter(
            "meshbridge_identity_certify", "Certify answers, by result", ["result"],
            registry=registry)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Certify": grpc.unary_unary_rpc_method_handler(
                self.certify,
                request_deserializer=identity_pb2.CertifyRequest.FromString,
                response_serializer=identity_pb2.CertifyResponse.SerializeToString),
        })

    def account_of(self, identity: str) -> ServiceAccount | None:
        """The ServiceAccount a proxy identity of this mesh names, or None."""
        if not identity.endswith(self.suffix):
            return None
        name, dot, namespace = identity[:-len(self.suffix)].partition(".")
        if not dot or not name or not namespace or "." in namespace:
            return None
        return ServiceAccount(namespace, name)

    async def certify(self, request: identity_pb2.CertifyRequest,
                      context: grpc.aio.ServicerContext) -> identity_pb2.CertifyResponse:
        identity = request.identity
        wanted = self.account_of(identity)
        if wanted is None:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "bad_identity",
                               f"{identity!r} is not a proxy identity of this mesh "
                               f"(<sa>.<ns>{self.suffix})")
        assert wanted is not None
        try:
            account = await self.reviewer.review(request.token)
        except InvalidToken as e:
            await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "bad_token",
                               f"token for {identity}: {e}")
            raise  # not reached: _refuse aborts
        if account != wanted:
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, "wrong_account",
                               f"the token is ServiceAccount {account}'s, not {wanted}'s")
        try:
            signed = self.ca.sign_request(request.certificate_signing_request, identity)
        except BadRequest as e:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "bad_csr", str(e))
            raise  # not reached
        valid_until = Timestamp()
        valid_until.FromDatetime(signed.not_after)
        self.answers.labels("issued").inc()
        log.info("certificate issued", identity=identity, peer=context.peer(),
                 valid_until=signed.not_after.isoformat())
        return identity_pb2.CertifyResponse(
            leaf_certificate=signed.leaf, intermediate_certificates=list(signed.intermediates),
            valid_until=valid_until)

    async def _refuse(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode,
                      reason: str, detail: str) -> None:
        self.answers.labels(reason).inc()
        key, now = (context.peer(), reason), time.monotonic()
        if now - self._logged.get(key, -LOG_EVERY) >= LOG_EVERY:
            self._logged[key] = now
            log.warning("certify refused", peer=context.peer(), reason=reason, detail=detail)
        await context.abort(code, detail)


def _issuer(config: MeshConfig, options: IdentityOptions) -> Issuer:
    if options.issuer_cert and options.issuer_key and options.trust_anchors:
        return load_issuer(options.issuer_cert, options.issuer_key, options.trust_anchors)
    return generate_issuer(config.trust_domain, config.controller_namespace)
