"""What a TokenReview answer proves (linkerd_api.token_review.account_of_review): the
checks Linkerd's identity controller makes of the API server's answer."""

from __future__ import annotations

from typing import Any

import pytest

from linkerd_api.token_review import account_of_review
from linkerd_api.tokens import InvalidToken, ServiceAccount


def review(**status: Any) -> dict[str, Any]:
    return {"kind": "TokenReview", "status": status}


def test_an_authenticated_service_account_for_our_audience_is_that_account() -> None:
    answer = review(authenticated=True, audiences=["identity.l5d.io"],
                    user={"username": "system:serviceaccount:emojivoto:web"})
    assert account_of_review(answer) == ServiceAccount("emojivoto", "web")


@pytest.mark.parametrize(("what", "answer"), [
    ("no status", {"kind": "TokenReview"}),
    ("an error", review(error="invalid bearer token", authenticated=False)),
    ("not authenticated", review(authenticated=False)),
    ("the API server's own audience", review(
        authenticated=True, user={"username": "system:serviceaccount:emojivoto:web"})),
    ("another audience", review(authenticated=True, audiences=["vault"],
                                user={"username": "system:serviceaccount:emojivoto:web"})),
    ("a user", review(authenticated=True, audiences=["identity.l5d.io"],
                      user={"username": "alice"})),
    ("a node", review(authenticated=True, audiences=["identity.l5d.io"],
                      user={"username": "system:node:node-a:x"})),
    ("a name that is no DNS label", review(
        authenticated=True, audiences=["identity.l5d.io"],
        user={"username": "system:serviceaccount:emojivoto:Web_1"})),
])
def test_anything_else_proves_nothing(what: str, answer: dict[str, Any]) -> None:
    with pytest.raises(InvalidToken):
        account_of_review(answer)
