"""Who an xDS client is, from its node: kind and namespace (xds_api.node_identity;
Routes §1.2, xDS §3.8)."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2

from xds_api.node_identity import client_kind, client_namespace


def node(id_: str = "", agent: str = "", **metadata: str) -> base_pb2.Node:
    n = base_pb2.Node(id=id_, user_agent_name=agent)
    n.metadata.update(metadata)
    return n


@pytest.mark.parametrize(("agent", "metadata", "kind"), [
    ("envoy", {}, "envoy"),
    ("gRPC C-core linux/x86_64", {}, "grpc"),
    ("gRPC Go", {}, "grpc"),
    ("", {}, "envoy"),
    ("envoy", {"meshbridge.io/client": "grpc"}, "grpc"),
    ("gRPC Java", {"meshbridge.io/client": "envoy"}, "envoy"),
    ("gRPC Java", {"meshbridge.io/client": "other"}, "grpc"),
])
def test_the_client_kind_comes_from_the_user_agent_or_the_metadata(
        agent: str, metadata: dict[str, str], kind: str) -> None:
    assert client_kind(node(agent=agent, **metadata)) == kind


@pytest.mark.parametrize(("id_", "metadata", "ns"), [
    ("web-0.emojivoto", {"NAMESPACE": "emojivoto"}, "emojivoto"),
    ("sidecar~10.0.0.1~web-0.shop~shop.svc.cluster.local", {}, "shop"),
    ("sidecar~10.0.0.1~web-0.shop~shop.svc.cluster.local", {"NAMESPACE": "other"}, "other"),
    ("proxyless-probe", {}, ""),
    ("a~b~c~d", {}, ""),
])
def test_the_client_namespace_is_metadata_then_istios_node_id(
        id_: str, metadata: dict[str, str], ns: str) -> None:
    assert client_namespace(node(id_, **metadata)) == ns
