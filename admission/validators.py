"""Which validator checks which kind: one table, keyed by the API group and kind an
AdmissionRequest names. A kind not in the table is not meshbridge's: the webhook
admits it with a warning.

A kind's validator can be replaced with `Validators.register` (a test, or another
layer that reads a kind of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from admission.annotations import validate_pod, validate_service
from admission.policy import validate_policy
from admission.problems import Problem
from admission.profiles import validate_profile
from bridge.cluster import Cluster
from bridge.policy_objects import GATEWAY_GROUP, LINKERD_POLICY_GROUP

Validator = Callable[[Mapping[str, Any]], list[Problem]]

# (group, kind) of the Linkerd policy kinds, and the kind bridge stores each as.
_POLICY_KINDS = {
    (LINKERD_POLICY_GROUP, "Server"): "Server",
    (LINKERD_POLICY_GROUP, "ServerAuthorization"): "ServerAuthorization",
    (LINKERD_POLICY_GROUP, "AuthorizationPolicy"): "AuthorizationPolicy",
    (LINKERD_POLICY_GROUP, "MeshTLSAuthentication"): "MeshTLSAuthentication",
    (LINKERD_POLICY_GROUP, "NetworkAuthentication"): "NetworkAuthentication",
    (LINKERD_POLICY_GROUP, "HTTPRoute"): "HTTPRoute",
    (GATEWAY_GROUP, "HTTPRoute"): "GatewayHTTPRoute",
    (GATEWAY_GROUP, "GRPCRoute"): "GRPCRoute",
}


class Validators:
    """The validators of every kind meshbridge reads; `cluster` is what meshbridge
    holds now (a new Server is checked against the Servers already there)."""

    def __init__(self, cluster: Cluster) -> None:
        self._by_kind: dict[tuple[str, str], Validator] = {
            ("linkerd.io", "ServiceProfile"): validate_profile,
            ("", "Pod"): validate_pod,
            ("", "Service"): validate_service,
        }
        for key, store_kind in _POLICY_KINDS.items():
            self._by_kind[key] = _policy(store_kind, cluster)

    def register(self, group: str, kind: str, validator: Validator) -> None:
        self._by_kind[(group, kind)] = validator

    def kinds(self) -> list[tuple[str, str]]:
        return sorted(self._by_kind)

    def validate(self, group: str, kind: str, raw: Mapping[str, Any]) -> list[Problem] | None:
        """The object's problems (none: admitted), or None if the kind is not ours."""
        validator = self._by_kind.get((group, kind))
        return None if validator is None else validator(raw)


def _policy(store_kind: str, cluster: Cluster) -> Validator:
    return lambda raw: validate_policy(raw, store_kind, cluster)
