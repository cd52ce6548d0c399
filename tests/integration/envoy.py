"""The tests' Envoy: harness.envoy_process's, with a node locality and info-level logs."""

from __future__ import annotations

from pathlib import Path

from harness import envoy_process as _envoy
from harness.envoy_process import XDS_CLUSTER, envoy_binary, stop_quietly

__all__ = ["XDS_CLUSTER", "Envoy", "envoy_binary", "stop_quietly"]


class Envoy(_envoy.Envoy):
    def __init__(self, binary: str, workdir: Path, xds_port: int, api_type: str = "GRPC",
                 node_id: str = "envoy-test") -> None:
        super().__init__(binary, workdir, xds_port, api_type, node_id,
                         cluster="meshbridge-tests",
                         locality={"region": "region-1", "zone": "zone-a"}, log_level="info")
