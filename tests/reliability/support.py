"""What the fault and soak tests share: a sim cluster and its targets (the clients
that follow them are testkit.fleet's)."""

from __future__ import annotations

from bridge.sources.sim import Churn, ClusterShape, Scenario, SimCluster


def sim_cluster(services: int = 10, endpoints: int = 10, seed: int = 1) -> SimCluster:
    return SimCluster(Scenario(seed=seed, cluster=ClusterShape(
        namespaces=2, services=services, endpoints_per_service=endpoints, zones=3),
        churn=Churn(rate=0)))


def target(i: int, sim: SimCluster) -> str:
    svc = sim.services[i % len(sim.services)]
    return f"{svc.name}.{svc.namespace}.svc.cluster.local:8080"
