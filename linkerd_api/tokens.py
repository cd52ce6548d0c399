"""Who a proxy's token says it is: the identity service's proof of a ServiceAccount.

In a real pod the proxy sends the bytes of a ServiceAccount token projected with the
audience `identity.l5d.io`; Linkerd's identity controller asks the Kubernetes API
(TokenReview) who it belongs to. A `TokenReviewer` is that question. `StaticTokens`
answers it from a file instead — a development mode for the files, demo and sim
sources, where there is no API to ask.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

AUDIENCE = "identity.l5d.io"


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class InvalidToken(Exception):
    """The token proves nothing: unknown, expired, malformed, or for another audience."""


class ReviewFailed(Exception):
    """The token could not be checked right now (the API is unreachable, or refused
    us): the proxy should retry, nothing is said about the token (UNAVAILABLE)."""


class TokenReviewer(Protocol):
    async def review(self, token: bytes) -> ServiceAccount:
        """The ServiceAccount the token belongs to; InvalidToken otherwise, ReviewFailed
        when it cannot be told now."""


class StaticTokens:
    """Tokens from a file, one per line: `TOKEN NAMESPACE/SERVICEACCOUNT` (blank lines
    and lines starting with # ignored). Development mode: the file is the secret."""

    def __init__(self, accounts: dict[bytes, ServiceAccount]) -> None:
        self._accounts = accounts

    @classmethod
    def read(cls, path: Path) -> StaticTokens:
        accounts: dict[bytes, ServiceAccount] = {}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            token, _, who = line.partition(" ")
            namespace, slash, name = who.strip().partition("/")
            if not token or not slash or not namespace or not name:
                raise ValueError(f"{path}:{number}: expected 'TOKEN NAMESPACE/SERVICEACCOUNT'")
            accounts[token.encode()] = ServiceAccount(namespace, name)
        return cls(accounts)

    async def review(self, token: bytes) -> ServiceAccount:
        token = token.strip()
        for known, account in self._accounts.items():
            if hmac.compare_digest(known, token):  # no timing hint about near misses
                return account
        raise InvalidToken("the token is not one this server knows")


class NoReviewer:
    """No way to check tokens was configured: every token is refused, saying why."""

    async def review(self, token: bytes) -> ServiceAccount:
        raise InvalidToken("this server has no way to check tokens: give --identity-tokens "
                           "(development) or run with --source kube (TokenReview)")
