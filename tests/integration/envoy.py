"""The tests' Envoy: harness.envoy_process's, with a node locality and info-level logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import envoy_process as _envoy
from harness.envoy_process import XDS_CLUSTER, eds_cluster, envoy_binary, stop_quietly

__all__ = ["XDS_CLUSTER", "Envoy", "eds_cluster", "envoy_binary", "stop_quietly"]


class Envoy(_envoy.Envoy):
    def __init__(self, binary: str, workdir: Path, xds_port: int, api_type: str = "GRPC",
                 node_id: str = "envoy-test", metadata: dict[str, str] | None = None,
                 static_clusters: list[dict[str, Any]] | None = None,
                 static_listeners: list[dict[str, Any]] | None = None) -> None:
        super().__init__(binary, workdir, xds_port, api_type, node_id,
                         cluster="meshbridge-tests",
                         locality={"region": "region-1", "zone": "zone-a"}, log_level="info",
                         metadata=metadata, static_clusters=static_clusters,
                         static_listeners=static_listeners)
