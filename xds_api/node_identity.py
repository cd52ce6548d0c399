"""Who an xDS client is, from its node (xDS §1.1): its kind and its namespace, which
decide the RouteConfiguration it is sent (Routes §1.2, xDS §3.8).

* Kind: gRPC's xDS clients name themselves in `user_agent_name` ("gRPC C-core ...",
  "gRPC Go", "gRPC Java"); Envoy says "envoy". Node metadata
  `meshbridge.io/client: grpc|envoy` overrides it. Anything else is served as Envoy.
* Namespace: node metadata `NAMESPACE` (what Istio's injector sets), else the
  namespace in an Istio node id `<type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>`.
  Without either the client is in no namespace and gets the producer's routes.
"""

from __future__ import annotations

from typing import Any

CLIENT_METADATA = "meshbridge.io/client"
NAMESPACE_METADATA = "NAMESPACE"
ENVOY = "envoy"
GRPC = "grpc"


def _metadata(node: Any, key: str) -> str:
    value = node.metadata.fields.get(key)
    if value is not None and value.HasField("string_value"):
        return str(value.string_value)
    return ""


def client_kind(node: Any) -> str:
    """"grpc" or "envoy"."""
    override = _metadata(node, CLIENT_METADATA).lower()
    if override in (ENVOY, GRPC):
        return override
    return GRPC if str(node.user_agent_name).lower().startswith("grpc") else ENVOY


def client_namespace(node: Any) -> str:
    ns = _metadata(node, NAMESPACE_METADATA)
    if ns:
        return ns[:63]
    parts = str(node.id).split("~")
    if len(parts) == 4 and "." in parts[2]:
        return parts[2].rsplit(".", 1)[1][:63]
    return ""
