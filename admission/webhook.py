"""The admission webhook as a layer of the process: its flags, its certificate, its
listener, its counters.

    --webhook-listen ADDR        serve the webhook on ADDR over HTTPS (off by default)
    --webhook-cert/--webhook-key PEM files (a kubernetes.io/tls Secret mounted as a
                                 volume), reloaded when they change; or
    --webhook-cert-from-identity a certificate from the identity CA for
                                 --webhook-names, renewed at 70% of its lifetime (the
                                 caBundle is then the identity trust anchors)

Counters: `meshbridge_admission_reviews_total{kind, result, reason}`, result one of
admitted, refused, ignored (not a kind meshbridge reads) and bad_request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import prometheus_client
import structlog
from cryptography import x509

from admission.review import BadReview, answer, decide, parse
from admission.server import DEFAULT_MAX_BODY, HttpsListener, Reply
from admission.validators import Validators
from meshbridge.host import GrpcServer, Host, Layer, split_listen_address

log = structlog.get_logger("meshbridge.admission")

DEFAULT_NAMES = "meshbridge.meshbridge.svc"
RENEW_AT = 0.7  # of the certificate's lifetime
RETRY = 30.0  # seconds after a renewal that failed


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    """The webhook's options (`--webhook-*`); no listen address: no webhook."""

    listen: str = ""
    cert: Path | None = None
    key: Path | None = None
    cert_from_identity: bool = False
    names: tuple[str, ...] = (DEFAULT_NAMES,)
    max_body: int = DEFAULT_MAX_BODY

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("--webhook-cert and --webhook-key go together")
        if self.listen and self.cert is None and not self.cert_from_identity:
            raise ValueError("--webhook-listen needs --webhook-cert/--webhook-key or "
                             "--webhook-cert-from-identity")
        if self.cert is not None and self.cert_from_identity:
            raise ValueError("--webhook-cert and --webhook-cert-from-identity exclude "
                             "each other")
        if self.listen:
            split_listen_address(self.listen)  # ValueError names the address


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("admission webhook")
    group.add_argument("--webhook-listen", default="", metavar="ADDR",
                       help="serve the validating admission webhook on ADDR (host:port) "
                            "over HTTPS; off when empty")
    group.add_argument("--webhook-cert", type=Path, default=None,
                       help="PEM certificate of the webhook (e.g. a mounted kubernetes.io/"
                            "tls Secret's tls.crt); reloaded when the file changes")
    group.add_argument("--webhook-key", type=Path, default=None,
                       help="PEM private key of --webhook-cert")
    group.add_argument("--webhook-cert-from-identity", action="store_true",
                       help="issue the webhook's certificate from the identity CA for "
                            "--webhook-names (the caBundle is the identity trust anchors)")
    group.add_argument("--webhook-names", default=DEFAULT_NAMES,
                       help="comma-separated DNS names (or IPs) the identity-issued "
                            "certificate is for: the webhook Service's <svc>.<ns>.svc")


def options_from_args(args: argparse.Namespace) -> WebhookOptions:
    names = tuple(n.strip() for n in str(args.webhook_names).split(",") if n.strip())
    return WebhookOptions(str(args.webhook_listen), args.webhook_cert, args.webhook_key,
                          bool(args.webhook_cert_from_identity), names or (DEFAULT_NAMES,))


def register(host: Host, server: GrpcServer) -> None:
    options = host.options_for(WebhookOptions)
    if not options.listen:
        return
    webhook = AdmissionWebhook(host, options)
    host.add_hooks(webhook)  # its own listener, started once the gRPC port serves
    host.keep("admission", webhook)


LAYER = Layer("admission.webhook", register, (WebhookOptions,))


class AdmissionWebhook:
    def __init__(self, host: Host, options: WebhookOptions) -> None:
        self.host = host
        self.options = options
        self.validators = Validators(host.cluster)
        self.reviews = prometheus_client.Counter(
            "meshbridge_admission_reviews", "AdmissionReviews answered, by kind, result "
            "(admitted, refused, ignored, bad_request) and reason",
            ["kind", "result", "reason"], registry=host.metrics)
        self.listener: HttpsListener | None = None
        self.certificate: WebhookCertificate | None = None
        self.port = 0

    # ---------------------------------------------------------- reviews

    def handle(self, body: bytes) -> Reply:
        try:
            review = parse(body)
        except BadReview as e:
            self.reviews.labels("-", "bad_request", "bad_review").inc()
            log.warning("bad AdmissionReview", reason=str(e))
            return Reply.text(400, str(e))
        verdict = decide(review, self.validators)
        result = ("refused" if not verdict.allowed else
                  "ignored" if verdict.reason == "not_ours" else "admitted")
        self.reviews.labels(verdict.kind, result, verdict.reason).inc()
        if not verdict.allowed:
            request = review["request"]
            log.info("admission refused", kind=verdict.kind, operation=request.get("operation"),
                     dry_run=bool(request.get("dryRun")), reason=verdict.message)
        return Reply(200, json.dumps(answer(review, verdict)).encode(), "application/json")

    # ---------------------------------------------------------- listeners (LayerHooks)

    def grpc_port_tls(self) -> ssl.SSLContext | None:
        return None  # the gRPC port's TLS is not the webhook's

    async def start_listeners(self, listen: str, port: int) -> None:
        if self.options.cert is not None and self.options.key is not None:
            self.certificate = FileCertificate(self.options.cert, self.options.key)
        else:
            try:
                ca = self.host.service("identity").ca
            except KeyError:
                raise ValueError("--webhook-cert-from-identity needs the identity layer") \
                    from None
            self.certificate = IdentityCertificate(ca, self.options.names)
        self.listener = HttpsListener(self.handle, self.certificate.context,
                                      max_body=self.options.max_body)
        host, port = split_listen_address(self.options.listen)
        try:
            self.port = await self.listener.start(host, port)
        except OSError as e:
            # The start-up error names this flag, not the gRPC or admin one.
            e.listen_flag = ("--webhook-listen", self.options.listen)  # type: ignore[attr-defined]
            raise
        self.certificate.start()
        log.info("serving the admission webhook", port=self.port, path=self.listener.path,
                 kinds=len(self.validators.kinds()))

    async def stop_listeners(self, grace: float) -> None:
        if self.listener is not None:
            await self.listener.stop()
        if self.certificate is not None:
            await self.certificate.stop()


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])  # the API server would try h2 otherwise
    return context


class WebhookCertificate:
    """A server SSLContext whose certificate is kept current in place: new handshakes
    get a new certificate, no listener restarts."""

    def __init__(self) -> None:
        self.context = _server_context()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._keep_current(), name="webhook-certificate")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _keep_current(self) -> None:
        raise NotImplementedError


class FileCertificate(WebhookCertificate):
    """From PEM files, reloaded when either changes (a Secret volume is updated in
    place when the Secret is). Files not there yet (the Secret is created after
    meshbridge, by cert-manager say) are waited for: until then handshakes fail and
    the API server applies the webhook's failurePolicy."""

    POLL = 10.0  # seconds between looks at the files

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__()
        self.cert, self.key = cert, key
        self._stamp: tuple[float, float] | None = None
        self.loaded = False
        self._load()
        if not self.loaded:
            log.warning("webhook certificate not there yet; the webhook answers once it is",
                        cert=str(cert), key=str(key))

    def _load(self) -> None:
        try:
            stamp = self.cert.stat().st_mtime, self.key.stat().st_mtime
        except FileNotFoundError:
            return
        if stamp != self._stamp:
            self.context.load_cert_chain(self.cert, self.key)
            self._stamp = stamp
            if self.loaded:
                log.info("webhook certificate reloaded", cert=str(self.cert))
            self.loaded = True

    async def _keep_current(self) -> None:
        while True:
            await asyncio.sleep(self.POLL)  # a polling period, not synchronisation
            try:
                self._load()
            except (OSError, ssl.SSLError) as e:
                log.error("webhook certificate reload failed", cert=str(self.cert),
                          error=str(e))


class IdentityCertificate(WebhookCertificate):
    """Issued by the identity CA for `names`, renewed at 70% of its lifetime."""

    def __init__(self, ca: Any, names: tuple[str, ...]) -> None:
        super().__init__()
        self.ca, self.names = ca, names
        self.directory = Path(tempfile.mkdtemp(prefix="meshbridge-webhook-tls-"))
        self.not_after = self._issue()

    def _issue(self) -> datetime.datetime:
        chain, key = self.ca.issue(self.names[0], self.names[1:])
        cert_path, key_path = self.directory / "tls.crt", self.directory / "tls.key"
        for path, data in ((cert_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        self.context.load_cert_chain(cert_path, key_path)
        leaf = x509.load_pem_x509_certificate(chain)
        self._renew_at = leaf.not_valid_before_utc + (
            leaf.not_valid_after_utc - leaf.not_valid_before_utc) * RENEW_AT
        return leaf.not_valid_after_utc

    async def _keep_current(self) -> None:
        while True:
            delay = (self._renew_at - datetime.datetime.now(datetime.UTC)).total_seconds()
            await asyncio.sleep(max(delay, 0.0))
            try:
                self.not_after = self._issue()
                log.info("webhook certificate renewed", valid_until=self.not_after.isoformat())
            except (OSError, ssl.SSLError, ValueError) as e:
                log.error("webhook certificate renewal failed", error=str(e), retry_in=RETRY)
                await asyncio.sleep(RETRY)

    async def stop(self) -> None:
        await super().stop()
        shutil.rmtree(self.directory, ignore_errors=True)
