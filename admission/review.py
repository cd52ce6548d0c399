"""AdmissionReview in, AdmissionReview out: the webhook's protocol, with no I/O.

The API server POSTs an `admission.k8s.io/v1` (or `v1beta1`) AdmissionReview whose
`request` names the object's kind and carries the object; the answer is an
AdmissionReview of the same version whose `response` has the request's `uid` and
`allowed`, and, when refused, a `status` whose message `kubectl` prints after
"denied the request:". Here a refusal is one line: the object, the field and the
rule (`admission.problems`).

Bad input gets an answer the API server can act on, never silence: a body that is
not JSON, or not an AdmissionReview of a version we speak, or without a request uid,
is a `BadReview` (the server answers 400 with the reason); a kind that is not
meshbridge's is allowed with a warning; a request without an object (a DELETE) is
allowed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from admission.problems import refusal
from admission.validators import Validators

VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class BadReview(ValueError):
    """Not an AdmissionReview we can answer; the message says why (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What was decided, for the answer and the counters."""

    allowed: bool
    kind: str  # group/kind ("core" for the core group), for the counters
    reason: str  # admitted | not_ours | no_object | a Problem's reason
    message: str = ""
    warnings: tuple[str, ...] = field(default=())


def parse(body: bytes) -> Mapping[str, Any]:
    """The AdmissionReview in `body`, or BadReview saying what is wrong with it."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadReview(f"the body is not JSON: {e}") from None
    if not isinstance(review, Mapping):
        raise BadReview("the body is not a JSON object")
    version, kind = review.get("apiVersion"), review.get("kind")
    if kind != "AdmissionReview":
        raise BadReview(f"kind {kind!r} is not AdmissionReview")
    if version not in VERSIONS:
        raise BadReview(f"apiVersion {version!r} is not one of {', '.join(VERSIONS)}")
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("the request has no uid")
    if not isinstance(request.get("kind"), Mapping):
        raise BadReview("the request names no kind")
    return review


def decide(review: Mapping[str, Any], validators: Validators) -> Verdict:
    request = review["request"]
    group_version_kind = request["kind"]
    group = str(group_version_kind.get("group") or "")
    kind = str(group_version_kind.get("kind") or "")
    label = f"{group or 'core'}/{kind}"
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        return Verdict(True, label, "no_object")  # DELETE and CONNECT carry none
    problems = validators.validate(group, kind, obj)
    if problems is None:
        return Verdict(True, label, "not_ours", warnings=(
            f"meshbridge does not validate {label}; admitted unchecked",))
    if not problems:
        return Verdict(True, label, "admitted")
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    namespace = str(meta.get("namespace") or request.get("namespace") or "")
    name = str(meta.get("name") or request.get("name") or meta.get("generateName") or "")
    first = problems[0]
    return Verdict(False, label, first.reason, refusal(kind, namespace, name, first))


def answer(review: Mapping[str, Any], verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview that answers `review`."""
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 400, "reason": "Invalid", "message": verdict.message}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": review["apiVersion"], "kind": "AdmissionReview",
            "response": response}
