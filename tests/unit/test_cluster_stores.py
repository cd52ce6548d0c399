"""The Cluster as per-kind stores: each kind's store owns its objects, indexes and its
part of the change; a Cluster is a value with an identity, so several can coexist."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import prometheus_client
import pytest

from bridge.cluster import Cluster, ClusterChange, Event, EventType, KindStore, ListenerStage
from bridge.cluster.stores import CORE_STORES, ServiceStore
from bridge.decoding import Meta
from bridge.model import ClusterIdentity, MeshConfig, ServiceKey, ViewKey
from bridge.views import ViewRegistry
from bridge.views.metrics import ViewMetrics
from testkit.builders import delete, endpoint, endpoint_slice, load, pod, service
from testkit.recorders import ViewRecorder

WEB = ServiceKey("app", "web")


def test_two_clusters_in_one_process_keep_their_own_objects_and_name_their_views() -> None:
    local = Cluster()
    east = Cluster(ClusterIdentity("east", "east.local", "east.example"))
    metrics = prometheus_client.CollectorRegistry()
    load(east, service("web"), pod("web-1", "10.1.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.1.0.1", "web-1")]))
    assert WEB in east.services and WEB not in local.services
    assert not local.pods and ("app", "web-1") in east.pods

    views = ViewRegistry(east, MeshConfig(), ViewMetrics(metrics))
    view = views.subscribe(ViewKey(WEB, 80), ViewRecorder(), "linkerd")
    assert view.cluster is east
    assert [e.endpoint.ip for e in view.snapshot.values()] == ["10.1.0.1"]
    labels = {"cluster": "east", "namespace": "app", "service": "web", "port": "80",
              "hostname": "", "nodename": ""}
    assert metrics.get_sample_value("endpoints_subscribers", labels) == 1


def test_the_local_cluster_is_named_after_the_flags() -> None:
    config = MeshConfig(cluster_domain="corp.local", trust_domain="corp.example")
    assert config.local_cluster() == ClusterIdentity("local", "corp.local", "corp.example")
    assert Cluster(config.local_cluster()).name == "local"


def test_the_cluster_ip_index_follows_a_service_changing_its_address() -> None:
    cluster = Cluster()
    load(cluster, service("web", clusterIP="10.96.0.10"))
    assert [s.meta.name for s in cluster.services_with_cluster_ip("10.96.0.10")] == ["web"]
    load(cluster, service("web", clusterIP="10.96.0.11"))
    assert cluster.services_with_cluster_ip("10.96.0.10") == []
    assert [s.meta.name for s in cluster.services_with_cluster_ip("10.96.0.11")] == ["web"]
    delete(cluster, service("web", clusterIP="10.96.0.11"))
    assert cluster.services_with_cluster_ip("10.96.0.11") == []
    assert not cluster.store(ServiceStore).by_cluster_ip


@dataclass(frozen=True, slots=True)
class Widget:
    meta: Meta
    size: int = 0
    kind: str = "Widget"


class WidgetStore(KindStore[tuple[str, str], Widget]):
    """A kind of our own: stored by name, and only a change of size is a change."""

    kinds = frozenset({"Widget"})

    def key(self, obj: Widget) -> tuple[str, str]:
        return (obj.meta.namespace, obj.meta.name)

    def changed(self, key: tuple[str, str], old: Widget | None, new: Widget | None,
                change: ClusterChange) -> None:
        if old is None or new is None or old.size != new.size:
            change.kinds.add("Widget")


def test_a_new_kind_is_one_store_class_and_one_registry_entry() -> None:
    cluster = Cluster(stores=(*CORE_STORES, WidgetStore))
    heard: list[ClusterChange] = []
    cluster.add_listener(heard.append, ListenerStage.RESOURCES)
    w: Any = Widget(Meta("w", "app"), 1)  # not a KubeObject the decoders know
    assert cluster.apply([Event(EventType.ADDED, w)]).kinds == {"Widget"}
    assert cluster.objects("Widget") == [w]
    assert not cluster.apply([Event(EventType.MODIFIED, w)])  # the same object again
    assert len(heard) == 1
    assert cluster.store(WidgetStore).objects == {("app", "w"): w}
    cluster.apply([Event(EventType.DELETED, w)])
    assert cluster.objects("Widget") == [] and len(heard) == 2


def test_two_stores_may_not_claim_one_kind() -> None:
    with pytest.raises(ValueError, match="Service"):
        Cluster(stores=(*CORE_STORES, ServiceStore))
