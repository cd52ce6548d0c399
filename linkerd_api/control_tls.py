"""meshbridge's own certificates, for the names linkerd2-proxies expect of their
control plane, issued by the identity service's CA and renewed before they expire.

A proxy reaches each control-plane address over TLS (unless the address is
loopback) and checks the server's certificate against its trust anchors for the name
in `LINKERD2_PROXY_<SVC>_SVC_NAME`. In a Linkerd install those names are the
ServiceAccount identities of the control-plane pods:

  destination and policy  linkerd-destination.<ns>.serviceaccount.identity.<ns>.<domain>
  identity                linkerd-identity.<ns>.serviceaccount.identity.<ns>.<domain>

(`<ns>` the controller namespace). One meshbridge answers for all of them, so its
TLS contexts pick the certificate by the name the client asks for (SNI), defaulting
to the destination's. A certificate is renewed at 70% of its lifetime, as the proxy
renews its own; the `SSLContext`s are reloaded in place, so every new handshake
gets the new certificate and no listener restarts.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

import structlog
from cryptography import x509

from bridge.model import MeshConfig
from h2grpc.server import tls_context
from linkerd_api.ca import CertificateAuthority

log = structlog.get_logger("meshbridge.identity")

RENEW_AT = 0.7  # of a certificate's lifetime
RETRY = 30.0  # seconds, after a renewal that failed


@dataclass(frozen=True, slots=True)
class ControlNames:
    destination: str  # also the policy API's
    identity: str


def control_names(config: MeshConfig) -> ControlNames:
    ns, domain = config.controller_namespace, config.trust_domain

    def name(account: str) -> str:
        return f"{account}.{ns}.serviceaccount.identity.{ns}.{domain}"

    return ControlNames(name("linkerd-destination"), name("linkerd-identity"))


class ControlPlaneTls:
    """The certificates for `names`, as files in a private directory and as server
    SSLContexts that follow their renewals. `run()` renews them; its caller owns it."""

    def __init__(self, ca: CertificateAuthority, names: ControlNames) -> None:
        self.ca = ca
        self.names = names
        self.directory = Path(tempfile.mkdtemp(prefix="meshbridge-control-tls-"))
        self._contexts: dict[str, list[ssl.SSLContext]] = {}
        self.not_after: dict[str, datetime.datetime] = {}
        for name in (names.destination, names.identity):
            self._issue(name)

    def files(self, name: str) -> tuple[Path, Path]:
        """(certificate chain PEM, key PEM) of `name`."""
        stem = name.split(".", 1)[0]
        return self.directory / f"{stem}.crt", self.directory / f"{stem}.key"

    def server_context(self, default: str, client_ca: str | None = None) -> ssl.SSLContext:
        """A TLS server context for HTTP/2 that presents `default`'s certificate, or the
        other control-plane name's when the client asks for it by SNI; with
        `client_ca`, clients must present a certificate it signed."""
        contexts = {name: self._context(name, client_ca) for name in self._names()}
        main = contexts[default]

        def pick(sock: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
            chosen = contexts.get(server_name or "")
            if chosen is not None and chosen is not main:
                sock.context = chosen

        main.sni_callback = pick
        return main

    async def run(self) -> None:
        """Renew each certificate at 70% of its lifetime, for as long as the task lives."""
        while True:
            name, due = min(((n, self.renewal_due(n)) for n in self._names()),
                            key=lambda item: item[1])
            delay = (due - datetime.datetime.now(datetime.UTC)).total_seconds()
            await asyncio.sleep(max(delay, 0.0))
            try:
                self.renew(name)
            except (OSError, ssl.SSLError, ValueError) as e:
                log.error("control-plane certificate renewal failed", identity=name,
                          error=str(e), retry_in=RETRY)
                await asyncio.sleep(RETRY)

    def renewal_due(self, name: str) -> datetime.datetime:
        cert = x509.load_pem_x509_certificate(self.files(name)[0].read_bytes())
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        return start + (end - start) * RENEW_AT

    def renew(self, name: str) -> None:
        self._issue(name)
        cert, key = self.files(name)
        for context in self._contexts.get(name, []):
            context.load_cert_chain(cert, key)  # new handshakes get the new certificate
        log.info("control-plane certificate renewed", identity=name,
                 valid_until=self.not_after[name].isoformat())

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _names(self) -> tuple[str, str]:
        return self.names.destination, self.names.identity

    def _issue(self, name: str) -> None:
        chain, key = self.ca.issue(name)
        cert_path, key_path = self.files(name)
        for path, data in ((cert_path, chain), (key_path, key)):
            partial = path.with_suffix(".new")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            partial.replace(path)  # a reader sees the old file or the new one, whole
        leaf = x509.load_pem_x509_certificate(chain)
        self.not_after[name] = leaf.not_valid_after_utc

    def _context(self, name: str, client_ca: str | None) -> ssl.SSLContext:
        cert, key = self.files(name)
        context = tls_context(str(cert), str(key), client_ca)
        self._contexts.setdefault(name, []).append(context)
        return context
