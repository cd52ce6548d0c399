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
precise status (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED; UNAVAILABLE when
the token cannot be checked now), logged once a minute per peer and reason and
counted; nothing is issued.

Tokens are checked by the kube source's TokenReview (linkerd_api.token_review) with
`--source kube`, or by a static list (`--identity-tokens`, development mode).

Since a proxy asks for its certificate before it has one, Certify can also be served
on a listener of its own with server-only TLS (`--identity-listen`) while the gRPC
port requires client certificates. `--tls-from-identity` serves the gRPC port over
TLS with certificates this CA issues for the control-plane names the proxies expect
(linkerd_api.control_tls). At start the layer writes what a linkerd2-proxy needs —
the trust anchors and its environment — to files and logs where they are.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import hashlib
import shlex
import shutil
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import prometheus_client
import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from bridge.model import MeshConfig
from h2grpc.limits import H2Limits
from h2grpc.server import Server as NativeServer
from linkerd_api.ca import BadRequest, CertificateAuthority, Issuer, generate_issuer, load_issuer
from linkerd_api.control_tls import ControlNames, ControlPlaneTls, control_names
from linkerd_api.proto import identity_pb2
from linkerd_api.service import RepeatLog
from linkerd_api.token_review import KubeTokenReview
from linkerd_api.tokens import (
    InvalidToken,
    NoReviewer,
    ReviewFailed,
    ServiceAccount,
    StaticTokens,
    TokenReviewer,
)
from meshbridge.host import GrpcServer, Host, Layer

log = structlog.get_logger("meshbridge.identity")

SERVICE = "io.linkerd.proxy.identity.Identity"
LOG_EVERY = 60.0  # seconds between log lines for one peer's same refusal
# Where Linkerd's proxy injector points a sidecar's profile and policy lookups by IP
# (the private ranges), for the environment written at start.
CLUSTER_NETWORKS = "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8"


@dataclass(frozen=True, slots=True)
class IdentityOptions:
    issuer_cert: Path | None = None  # PEM, with its key and the trust anchors; else generated
    issuer_key: Path | None = None
    trust_anchors: Path | None = None
    lifetime: float = 24 * 3600.0  # seconds a leaf is valid
    tokens: Path | None = None  # development mode: a static token list
    write_trust_anchors: Path | None = None  # where a generated bundle is written
    listen: str | None = None  # Certify on a listener of its own, server-only TLS
    tls_from_identity: bool = False  # the gRPC port's TLS from this CA's certificates

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
    group.add_argument("--identity-listen", default=None, metavar="ADDR",
                       help="also serve Certify on ADDR (host:port) over server-only TLS "
                            "with the linkerd-identity certificate this CA issues, for "
                            "proxies that have no certificate yet while the gRPC port "
                            "requires one (--client-ca)")
    group.add_argument("--tls-from-identity", action="store_true",
                       help="serve the gRPC port over TLS with certificates this CA "
                            "issues for linkerd-destination (destination, policy) and "
                            "linkerd-identity (Certify, by SNI), renewed before expiry; "
                            "instead of --tls-cert/--tls-key")


def options_from_args(args: argparse.Namespace) -> IdentityOptions:
    if args.tls_from_identity and getattr(args, "tls_cert", None):
        raise ValueError("--tls-from-identity and --tls-cert exclude each other")
    return IdentityOptions(args.identity_issuer_cert, args.identity_issuer_key,
                           args.identity_trust_anchors, args.identity_lifetime,
                           args.identity_tokens, args.identity_write_trust_anchors,
                           args.identity_listen, args.tls_from_identity)


def register(host: Host, server: GrpcServer) -> None:
    options = host.options_for(IdentityOptions)
    if options.tls_from_identity and not host.sni_certificates:
        # The port presents linkerd-destination or linkerd-identity by SNI.
        raise ValueError("--tls-from-identity needs --grpc-transport native")
    service = IdentityService(host.config, options, host.metrics, reviewer_for(host, options),
                              limits=dataclasses.replace(
                                  host.limits.h2,
                                  max_message_bytes=host.limits.max_message_bytes))
    server.add_generic_rpc_handlers((service.handler(),))
    host.add_hooks(service)
    host.keep("identity", service)


LAYER = Layer("linkerd_api.identity", register, (IdentityOptions,))


def reviewer_for(host: Host, options: IdentityOptions) -> TokenReviewer:
    """Static tokens when given; else a TokenReview through the API the source
    watches; else none."""
    if options.tokens is not None:
        return StaticTokens.read(options.tokens)
    credentials = host.kube_credentials()
    if credentials is not None:
        return KubeTokenReview(credentials)
    return NoReviewer()


class IdentityService:
    def __init__(self, config: MeshConfig, options: IdentityOptions,
                 registry: prometheus_client.CollectorRegistry | None = None,
                 reviewer: TokenReviewer | None = None,
                 limits: H2Limits | None = None) -> None:
        self.config = config
        self.options = options
        self.limits = limits
        self.suffix = f".serviceaccount.identity.{config.controller_namespace}." \
                      f"{config.trust_domain}"
        issuer = _issuer(config, options)
        self.generated = options.issuer_cert is None
        self.ca = CertificateAuthority(issuer, datetime.timedelta(seconds=options.lifetime))
        # What a proxy needs (the anchors, its environment) and, with TLS from this CA,
        # the control plane's own keys: in a private directory, removed at stop.
        self.state_dir = Path(tempfile.mkdtemp(prefix="meshbridge-identity-"))
        self.trust_anchors_path = options.write_trust_anchors or (
            options.trust_anchors or self.state_dir / "ca-bundle.pem")
        if options.trust_anchors is None or options.write_trust_anchors is not None:
            self.trust_anchors_path.write_bytes(issuer.trust_anchors_pem())
        self.reviewer: TokenReviewer = reviewer or (
            StaticTokens.read(options.tokens) if options.tokens else NoReviewer())
        self.names: ControlNames = control_names(config)
        self.control_tls = (ControlPlaneTls(self.ca, self.names)
                            if options.listen or options.tls_from_identity else None)
        self.listener: NativeServer | None = None
        self.listen_port = 0
        self._renewals: asyncio.Task[None] | None = None
        # Keyed by the peer's address, not its port (a client reconnecting from ever new
        # ports is one peer), and bounded: a flood of refusals grows nothing.
        self._logged = RepeatLog(LOG_EVERY)
        registry = registry or prometheus_client.CollectorRegistry()
        # Linkerd's identity controller's gauge: seconds left until the issuer expires
        # (negative once it has), computed at each scrape.
        expires = issuer.certificate.not_valid_after_utc.timestamp()
        prometheus_client.Gauge(
            "issuer_cert_ttl_seconds", "seconds until the identity issuer certificate "
            "expires", registry=registry).set_function(lambda: expires - time.time())
        self.answers = prometheus_client.Counter(
            "meshbridge_identity_certify", "Certify answers, by result", ["result"],
            registry=registry)
        log.info("issuer cert loaded", generated=self.generated,
                 invalid_after=issuer.certificate.not_valid_after_utc.isoformat(),
                 ttl_seconds=int(expires - time.time()),
                 trust_anchors=str(self.trust_anchors_path), reviewer=type(self.reviewer).__name__)

    # ---------------------------------------------------------- LayerHooks

    def grpc_port_tls(self) -> ssl.SSLContext | None:
        """The gRPC port's TLS (--tls-from-identity), or None: the App's own choice."""
        if self.control_tls is None or not self.options.tls_from_identity:
            return None
        return self.control_tls.server_context(self.names.destination)

    async def start_listeners(self, grpc_listen: str, grpc_port: int) -> None:
        """Start the Certify listener (--identity-listen) and the renewals, and say what
        a linkerd2-proxy needs; the App calls this once its gRPC port is bound."""
        if self.control_tls is not None:
            self._renewals = asyncio.create_task(self.control_tls.run(),
                                                 name="identity-control-tls")
        if self.options.listen and self.control_tls is not None:
            listener = NativeServer(limits=self.limits)
            listener.add_generic_rpc_handlers((self.handler(),))
            self.listen_port = listener.add_secure_port(
                self.options.listen, self.control_tls.server_context(self.names.identity))
            if self.listen_port == 0:
                raise OSError(f"cannot listen on --identity-listen {self.options.listen}")
            await listener.start()
            self.listener = listener
            log.info("serving Certify over server-only TLS", port=self.listen_port,
                     identity=self.names.identity)
        self._announce(grpc_listen, grpc_port)

    async def stop_listeners(self, grace: float) -> None:
        if self.listener is not None:
            await self.listener.stop(grace)
        if self._renewals is not None:
            self._renewals.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewals
        if self.control_tls is not None:
            self.control_tls.close()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def proxy_environment(self, grpc_listen: str, grpc_port: int) -> dict[str, str]:
        """The settings a linkerd2-proxy sidecar needs to use this meshbridge (those of
        the workload itself are shown as <placeholders>)."""
        host = _advertised_host(grpc_listen)
        identity_addr = f"{host}:{grpc_port}"
        if self.listener is not None and self.options.listen:
            identity_addr = f"{_advertised_host(self.options.listen)}:{self.listen_port}"
        workload = f"<sa>.<ns>{self.suffix}"
        return {
            "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS": self.ca.issuer.trust_anchors_pem().decode(),
            "LINKERD2_PROXY_IDENTITY_SVC_ADDR": identity_addr,
            "LINKERD2_PROXY_IDENTITY_SVC_NAME": self.names.identity,
            "LINKERD2_PROXY_DESTINATION_SVC_ADDR": f"{host}:{grpc_port}",
            "LINKERD2_PROXY_DESTINATION_SVC_NAME": self.names.destination,
            "LINKERD2_PROXY_POLICY_SVC_ADDR": f"{host}:{grpc_port}",
            "LINKERD2_PROXY_POLICY_SVC_NAME": self.names.destination,
            "LINKERD2_PROXY_IDENTITY_SERVER_ID": workload,
            "LINKERD2_PROXY_IDENTITY_SERVER_NAME": workload,
            "LINKERD2_PROXY_IDENTITY_DIR": "<dir with the proxy's key.p8 and csr.der>",
            "LINKERD2_PROXY_IDENTITY_TOKEN_FILE": "<file with the ServiceAccount token>",
            # The proxy sends it as every Get's context token: the node is what
            # topology-aware answers need, the pod what /debug/streams names.
            "LINKERD2_PROXY_DESTINATION_CONTEXT": '{"ns":"<ns>","nodeName":"<node>","pod":"<pod>"}',
            "LINKERD2_PROXY_POLICY_WORKLOAD": '{"ns":"<ns>","pod":"<pod>"}',
            "LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS": CLUSTER_NETWORKS,
            "LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS": CLUSTER_NETWORKS,
        }

    def _announce(self, grpc_listen: str, grpc_port: int) -> None:
        env = self.proxy_environment(grpc_listen, grpc_port)
        env_file = self.state_dir / "proxy.env"
        env_file.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()),
                            encoding="utf-8")
        shown = {k: v for k, v in env.items() if k != "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS"}
        log.info("a linkerd2-proxy needs", trust_anchors=str(self.trust_anchors_path),
                 env_file=str(env_file), **shown)

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
        except ReviewFailed as e:
            await self._refuse(context, grpc.StatusCode.UNAVAILABLE, "review_failed",
                               f"token for {identity} not checked: {e}")
            raise  # not reached
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
        # Linkerd's line names the leaf by the MD5 of its DER; so does ours.
        fingerprint = hashlib.md5(signed.leaf, usedforsecurity=False).hexdigest()
        log.info("issued certificate", identity=identity, peer=context.peer(),
                 valid_until=signed.not_after.isoformat(), leaf_md5=fingerprint)
        return identity_pb2.CertifyResponse(
            leaf_certificate=signed.leaf, intermediate_certificates=list(signed.intermediates),
            valid_until=valid_until)

    async def _refuse(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode,
                      reason: str, detail: str) -> None:
        self.answers.labels(reason).inc()
        peer = context.peer()
        if self._logged.admit((peer.rpartition(":")[0] or peer, reason)) is not None:
            log.warning("certify refused", peer=peer, reason=reason, detail=detail)
        await context.abort(code, detail)


def _advertised_host(listen: str) -> str:
    """The host a proxy dials for a listen address (a wildcard: this machine)."""
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "*", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _issuer(config: MeshConfig, options: IdentityOptions) -> Issuer:
    if options.issuer_cert and options.issuer_key and options.trust_anchors:
        return load_issuer(options.issuer_cert, options.issuer_key, options.trust_anchors)
    return generate_issuer(config.trust_domain, config.controller_namespace)
