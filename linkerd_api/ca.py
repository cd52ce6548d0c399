"""The certificate authority behind the identity service: a trust anchor, an issuer
it signed, and leaf certificates the issuer signs for proxies' own keys.

What a linkerd2-proxy accepts (its TLS stack checks the leaf against its trust
anchors for its local name): a leaf whose only DNS SAN is the identity, with
extended key usage serverAuth and clientAuth (the same certificate serves both sides
of mTLS), signed by an issuer that is a CA (`basicConstraints CA:TRUE`,
`keyCertSign`). Keys are ECDSA P-256, as Linkerd's own.

The issuer can be loaded from PEM files (as Linkerd's `linkerd-identity-issuer`
Secret holds them) or generated at start, for the demo and the tests.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Leaves start this long before now, so that a proxy whose clock is a little behind
# ours does not see a certificate from the future.
CLOCK_SKEW = datetime.timedelta(seconds=20)
DEFAULT_LIFETIME = datetime.timedelta(hours=24)  # Linkerd's default issuance lifetime
CN_MAX = 64  # characters in an X.509 common name (RFC 5280 ub-common-name)

Clock = Callable[[], datetime.datetime]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class BadRequest(ValueError):
    """A CSR or a name the CA will not sign: the caller's fault (INVALID_ARGUMENT)."""


@dataclass(frozen=True, slots=True)
class Issuer:
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    # Certificates between the issuer and the anchors (usually none), then the issuer.
    chain: tuple[x509.Certificate, ...]
    trust_anchors: tuple[x509.Certificate, ...]

    def trust_anchors_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.trust_anchors)


@dataclass(frozen=True, slots=True)
class Signed:
    leaf: bytes  # DER
    intermediates: tuple[bytes, ...]  # DER, leaf's issuer first
    not_after: datetime.datetime


def generate_issuer(trust_domain: str, controller_namespace: str = "linkerd",
                    lifetime: datetime.timedelta = datetime.timedelta(days=365),
                    clock: Clock = _now) -> Issuer:
    """A fresh trust anchor and an issuer under it, named as Linkerd names them
    (root.<ns>.<domain>, identity.<ns>.<domain>)."""
    now = clock()
    anchor_key = ec.generate_private_key(ec.SECP256R1())
    anchor = _ca_certificate(f"root.{controller_namespace}.{trust_domain}", anchor_key,
                             None, anchor_key, now, lifetime, path_length=1)
    issuer_key = ec.generate_private_key(ec.SECP256R1())
    issuer = _ca_certificate(f"identity.{controller_namespace}.{trust_domain}",
                             issuer_key, anchor, anchor_key, now, lifetime, path_length=0)
    return Issuer(issuer, issuer_key, (issuer,), (anchor,))


def load_issuer(cert: Path, key: Path, trust_anchors: Path) -> Issuer:
    """The issuer from PEM files: its certificate (optionally followed by the
    intermediates up to an anchor), its EC key, and the trust anchor bundle."""
    chain = tuple(x509.load_pem_x509_certificates(cert.read_bytes()))
    loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key}: the issuer key must be an EC key")
    anchors = tuple(x509.load_pem_x509_certificates(trust_anchors.read_bytes()))
    issuer = chain[0]
    der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if issuer.public_key().public_bytes(*der) != loaded.public_key().public_bytes(*der):
        raise ValueError(f"{key} is not the key of the certificate in {cert}")
    if not _is_ca(issuer):
        raise ValueError(f"{cert}: the issuer certificate is not a CA (basicConstraints)")
    return Issuer(issuer, loaded, chain, anchors)


class CertificateAuthority:
    def __init__(self, issuer: Issuer, lifetime: datetime.timedelta = DEFAULT_LIFETIME,
                 clock: Clock = _now) -> None:
        self.issuer = issuer
        self.lifetime = lifetime
        self.clock = clock

    def sign_request(self, csr_der: bytes, identity: str) -> Signed:
        """Sign the key in `csr_der` for exactly `identity`; BadRequest says why not."""
        try:
            csr = x509.load_der_x509_csr(csr_der)
        except ValueError as e:
            raise BadRequest(f"the certificate signing request is not DER: {e}") from None
        try:
            valid = csr.is_signature_valid
        except (InvalidSignature, ValueError, TypeError):
            valid = False
        if not valid:
            raise BadRequest("the certificate signing request's signature does not verify")
        key = csr.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
            raise BadRequest("the certificate signing request's key is not ECDSA P-256")
        try:
            names = csr.extensions.get_extension_for_class(
                x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        except x509.ExtensionNotFound:
            names = []
        if names != [identity]:
            raise BadRequest(f"the certificate signing request names {names or 'nothing'}, "
                             f"not {identity}")
        return self._sign(key, identity)

    def issue(self, identity: str, also: Sequence[str] = ()) -> tuple[bytes, bytes]:
        """A key and a certificate for `identity`, as PEM: for meshbridge's own
        control-plane names (the destination, policy and identity addresses) and its
        admission webhook; `also`: more names (DNS names or IP addresses) it is for."""
        key = ec.generate_private_key(ec.SECP256R1())
        signed = self._sign(key.public_key(), identity, also)
        chain = [signed.leaf, *signed.intermediates]
        pem = b"".join(x509.load_der_x509_certificate(c).public_bytes(serialization.Encoding.PEM)
                       for c in chain)
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return pem, key_pem

    def _sign(self, key: ec.EllipticCurvePublicKey, identity: str,
              also: Sequence[str] = ()) -> Signed:
        now = self.clock()
        # Certificates hold whole seconds: valid_until must say what the leaf says.
        not_after = (now + self.lifetime).replace(microsecond=0)
        issuer = self.issuer.certificate
        if not_after > issuer.not_valid_after_utc:
            not_after = issuer.not_valid_after_utc  # a leaf never outlives its issuer
        # X.509 caps a common name at 64 characters, and identities such as
        # linkerd-destination's are longer: those leaves have an empty subject and the
        # name in a critical SAN only (RFC 5280, section 4.2.1.6); proxies check the SAN anyway.
        fits = len(identity) <= CN_MAX
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)] if fits else [])
        leaf = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer.subject)
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_encipherment=True, content_commitment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(identity), *(_general_name(n) for n in also)]),
                critical=not fits)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.issuer.key.public_key()), critical=False)
            .sign(self.issuer.key, hashes.SHA256())
        )
        return Signed(leaf.public_bytes(serialization.Encoding.DER),
                      tuple(c.public_bytes(serialization.Encoding.DER)
                            for c in self.issuer.chain),
                      not_after)


def _general_name(name: str) -> x509.GeneralName:
    """A subject alternative name: an IP address as such, anything else as DNS."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _ca_certificate(name: str, key: ec.EllipticCurvePrivateKey,
                    signer: x509.Certificate | None, signer_key: ec.EllipticCurvePrivateKey,
                    now: datetime.datetime, lifetime: datetime.timedelta,
                    path_length: int) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer.subject if signer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=False, content_commitment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(signer_key, hashes.SHA256())
    )


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False
