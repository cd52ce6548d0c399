"""The cluster store's lifecycle with links made by flag (folders of manifests: no API
server): linked, its cache filled and counted under Linkerd's metric names; replaced;
unlinked, its cache emptied (or kept, Linkerd 2.20's way); a bad flag logged once."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import prometheus_client
import structlog

from bridge.cluster import Cluster
from bridge.model import ClusterIdentity
from bridge.multicluster.links import Link
from bridge.multicluster.store import ClusterStore
from testkit.polling import eventually

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: ns}}
spec: {{ports: [{{name: http, port: 80}}]}}
"""


def folder(tmp_path: Path, name: str, *services: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    for svc in services:
        (path / f"{svc}.yaml").write_text(SERVICE.format(name=svc))
    return path


def dev_link(name: str, path: Path) -> Link:
    return Link(name, "cluster.local", f"{name}.local", f"--link {name}",
                dev_source=f"files:{path}")


async def test_a_flag_link_is_linked_replaced_and_unlinked(tmp_path: Path) -> None:
    registry = prometheus_client.CollectorRegistry()
    east = folder(tmp_path, "east", "foo", "bar")
    store = ClusterStore(Cluster(), "linkerd", registry, flag_links=[dev_link("east", east)])
    store.start()
    try:
        await eventually(lambda: (lc := store.get("east")) is not None
                         and lc.state == "synced", 10)
        lc = store.get("east")
        assert lc is not None and len(lc.cluster.services) == 2
        assert lc.cluster.identity == ClusterIdentity("east", "cluster.local", "east.local")
        assert registry.get_sample_value("cluster_store_size") == 1
        assert registry.get_sample_value("service_cache_size", {"cluster": "east"}) == 2
        assert registry.get_sample_value("meshbridge_cluster_sync_state",
                                         {"cluster": "east", "state": "synced"}) == 1
        # Another folder and trust domain: the link changes; its cache and identity
        # follow the new source.
        store.set_flag_links([dataclasses.replace(
            dev_link("east", folder(tmp_path, "east2", "baz")), trust_domain="east2.local")])
        await eventually(lambda: {k.name for k in lc.cluster.services} == {"baz"}, 10)
        assert store.get("east") is lc
        assert lc.cluster.identity.trust_domain == "east2.local"
        store.set_flag_links([])
        assert store.get("east") is None and lc.cluster.services == {}
        assert registry.get_sample_value("cluster_store_size") == 0
        assert registry.get_sample_value("service_cache_size", {"cluster": "east"}) is None
    finally:
        store.stop()


async def test_linkerd_2_20s_way_keeps_an_unlinked_clusters_cache(tmp_path: Path) -> None:
    store = ClusterStore(Cluster(), "linkerd",
                         flag_links=[dev_link("east", folder(tmp_path, "east", "foo"))],
                         keep_on_unlink=True)
    store.start()
    try:
        await eventually(lambda: (lc := store.get("east")) is not None
                         and lc.state == "synced", 10)
        lc = store.get("east")
        assert lc is not None
        store.set_flag_links([])
        assert store.get("east") is None and len(lc.cluster.services) == 1
    finally:
        store.stop()


async def test_a_link_whose_source_cannot_be_made_is_logged_once(tmp_path: Path) -> None:
    registry = prometheus_client.CollectorRegistry()
    store = ClusterStore(Cluster(), "linkerd", registry,
                         flag_links=[dev_link("east", tmp_path / "missing")])
    with structlog.testing.capture_logs() as logs:
        store.start()
        store.set_flag_links(store.flag_links.values())  # looked at again: not logged again
        await asyncio.sleep(0)
    store.stop()
    assert store.get("east") is None
    bad = [e for e in logs if e["event"] == "linked cluster not usable"]
    assert len(bad) == 1 and "missing" in bad[0]["reason"]
    assert registry.get_sample_value("meshbridge_cluster_link_errors_total",
                                     {"cluster": "east", "reason": "bad_source"}) == 1
