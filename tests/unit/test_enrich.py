"""Enrichment rules (Linkerd §3.3-3.6, §4.8), one endpoint at a time."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.cluster import Cluster
from bridge.model import Endpoint, MeshConfig, ServiceKey, ViewKey
from bridge.views import View, ViewChange, ViewRegistry
from testkit.builders import endpoint, endpoint_slice, load, pod, service


class Sink:
    def on_view_change(self, view: View, change: ViewChange) -> None:
        pass


def served(*objs: dict[str, Any], port: int = 80, config: MeshConfig | None = None,
           ns: str = "app") -> list[Endpoint]:
    cluster = Cluster()
    reg = ViewRegistry(cluster, config or MeshConfig())
    load(cluster, *objs)
    view = reg.subscribe(ViewKey(ServiceKey(ns, "web"), port), Sink(), "test")
    return [r.endpoint for _, r in sorted(view.snapshot.items())]


def one(pod_raw: dict[str, Any], container_port: int = 8080, port: int = 80,
        config: MeshConfig | None = None, ns: str = "app", **svc: Any) -> Endpoint:
    ports = [{"name": "http", "port": port, "targetPort": container_port}]
    eps = served(service("web", ns=ns, ports=ports, **svc), pod_raw,
                 endpoint_slice("web-a", "web", [endpoint(pod_raw["status"]["podIP"],
                                                          pod_raw["metadata"]["name"], ns=ns)],
                                ns=ns, ports=[{"name": "http", "port": container_port}]),
                 port=port, config=config, ns=ns)
    assert len(eps) == 1, eps
    return eps[0]


def test_meshed_pod_gets_identity_h2_hint_and_opaque_transport() -> None:
    enr = one(pod("web-1", "10.0.0.1", sa="web")).enrichment
    assert enr.identity == "web.app.serviceaccount.identity.linkerd.cluster.local"
    assert enr.server_name == enr.identity
    assert enr.hint is not None
    assert (enr.hint.h2, enr.hint.opaque, enr.hint.opaque_transport_port) == (True, False, 4143)
    assert enr.meshed_http2


def test_identity_uses_the_configured_trust_domain_and_controller_namespace() -> None:
    cfg = MeshConfig(trust_domain="trust.domain", controller_namespace="mesh")
    ep = one(pod("web-1", "10.0.0.1", sa="api", labels={"linkerd.io/control-plane-ns": "mesh"}),
             config=cfg)
    assert ep.enrichment.identity == "api.app.serviceaccount.identity.mesh.trust.domain"


def test_pod_meshed_by_another_control_plane_gets_no_identity() -> None:
    ep = one(pod("web-1", "10.0.0.1", labels={"linkerd.io/control-plane-ns": "elsewhere"}))
    assert ep.enrichment.identity == ""
    assert ep.enrichment.hint is not None  # still meshed: hints apply


def test_unmeshed_pod_gets_labels_but_no_hint_or_identity() -> None:
    enr = one(pod("web-1", "10.0.0.1", meshed=False)).enrichment
    assert enr.hint is None and enr.identity == "" and not enr.meshed_http2
    assert dict(enr.metric_labels)["pod"] == "web-1"


def test_transparent_mode_sends_no_opaque_transport_for_non_opaque_ports() -> None:
    ep = one(pod("web-1", "10.0.0.1"), config=MeshConfig(force_opaque_transport=False))
    hint = ep.enrichment.hint
    assert hint is not None and hint.opaque_transport_port is None and hint.h2


def test_default_opaque_ports_make_the_hint_opaque() -> None:
    ep = one(pod("db-1", "10.0.0.1", ports=[{"name": "pg", "containerPort": 5432}]),
             container_port=5432, port=5432)
    hint = ep.enrichment.hint
    assert hint is not None and hint.opaque and not hint.h2
    assert hint.opaque_transport_port == 4143


def test_opaque_ports_annotation_accepts_container_port_names_and_ranges() -> None:
    raw = pod("q-1", "10.0.0.1", annotations={"config.linkerd.io/opaque-ports": "amqp,9000-9001"},
              ports=[{"name": "amqp", "containerPort": 5672}])
    assert one(raw, container_port=5672, port=5672).enrichment.opaque
    assert one(raw, container_port=9001, port=9001).enrichment.opaque
    # An annotation replaces the defaults: 5432 is no longer opaque for this pod.
    assert not one(raw, container_port=5432, port=5432).enrichment.opaque


def test_empty_opaque_ports_annotation_means_none() -> None:
    raw = pod("db-1", "10.0.0.1", annotations={"config.linkerd.io/opaque-ports": ""})
    assert not one(raw, container_port=5432, port=5432).enrichment.opaque


def test_a_server_marks_a_named_port_opaque() -> None:
    server = {"kind": "Server", "metadata": {"name": "metrics", "namespace": "app"},
              "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": "metrics",
                       "proxyProtocol": "opaque"}}
    p = pod("web-1", "10.0.0.1", labels={"app": "web"},
            ports=[{"name": "metrics", "containerPort": 9100}])
    svc = service("web", ports=[{"name": "metrics", "port": 9100}])
    eps = served(svc, p, server,
                 endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")],
                                ports=[{"name": "metrics", "port": 9100}]), port=9100)
    enr = eps[0].enrichment
    assert enr.opaque and enr.hint is not None and enr.hint.opaque
    unselected = served(svc, pod("web-1", "10.0.0.1", labels={"app": "other"},
                                 ports=[{"name": "metrics", "containerPort": 9100}]),
                        server, endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")],
                                               ports=[{"name": "metrics", "port": 9100}]),
                        port=9100)
    assert not unselected[0].enrichment.opaque


def test_skipped_inbound_port_is_served_plain() -> None:
    raw = pod("s-1", "10.0.0.1", annotations={"config.linkerd.io/skip-inbound-ports": "9090"},
              ports=[{"name": "http", "containerPort": 9090}])
    ep = one(raw, container_port=9090, port=9090)
    assert ep.enrichment.hint is None and ep.enrichment.identity == ""


def test_admin_port_gets_no_opaque_transport() -> None:
    ep = one(pod("web-1", "10.0.0.1", ports=[{"name": "admin", "containerPort": 4191}]),
             container_port=4191, port=4191)
    assert ep.enrichment.hint is not None and ep.enrichment.hint.opaque_transport_port is None


@pytest.mark.parametrize(
    "env",
    [
        [],  # proxy container without env
        [{"name": "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "value": "0.0.0.0:4191"},
         {"name": "LINKERD2_PROXY_CONTROL_LISTEN_ADDR", "value": "0.0.0.0:4190"}],  # no inbound
        [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
         {"name": "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "value": "garbage"},
         {"name": "LINKERD2_PROXY_CONTROL_LISTEN_ADDR", "value": "0.0.0.0:4190"}],
    ],
)
def test_meshed_pod_with_a_broken_proxy_is_dropped(env: list[dict[str, str]]) -> None:
    raw = pod("web-1", "10.0.0.1", proxy_env=env)
    eps = served(service("web"), raw,
                 endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    assert eps == []


@pytest.mark.parametrize(
    ("owner", "replicasets", "label"),
    [
        (None, [], ("pod", "web-1")),
        (("ReplicaSet", "web-5d9"), [("web-5d9", ("Deployment", "web"))], ("deployment", "web")),
        (("ReplicaSet", "web-5d9"), [], ("replicaset", "web-5d9")),
        (("StatefulSet", "db"), [], ("statefulset", "db")),
        (("Job", "backup-1"), [], ("k8s_job", "backup-1")),
        (("Job", "backup-1"), [("backup-1", ("CronJob", "backup"))], ("cronjob", "backup")),
        (("DaemonSet", "agent"), [], ("daemonset", "agent")),
    ],
)
def test_owner_kind_metric_labels(owner: tuple[str, str] | None,
                                  replicasets: list[tuple[str, tuple[str, str]]],
                                  label: tuple[str, str]) -> None:
    # The owner objects: ReplicaSets, or a Job when the pod's owner is a Job.
    owner_kind = "Job" if owner and owner[0] == "Job" else "ReplicaSet"
    rs_objs = [{"kind": owner_kind, "metadata": {"name": n, "namespace": "app",
                "ownerReferences": [{"kind": k, "name": o}]}} for n, (k, o) in replicasets]
    raw = pod("web-1", "10.0.0.1", owner=owner, labels={"pod-template-hash": "5d9"})
    eps = served(service("web"), raw, *rs_objs,
                 endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    labels = dict(eps[0].enrichment.metric_labels)
    assert labels[label[0]] == label[1]
    assert labels["serviceaccount"] == "web"
    assert labels["control_plane_ns"] == "linkerd"
    assert labels["pod_template_hash"] == "5d9"
    assert labels["zone"] == "zone-a"


@pytest.mark.parametrize(
    ("text", "ports"),
    [("25,587", {25, 587}), ("4000-4002", {4000, 4001, 4002}), (" 80 , ", {80}),
     ("amqp-tls", {5671}), ("", set())],
)
def test_port_lists_take_numbers_ranges_and_dashed_names(text: str, ports: set[int]) -> None:
    from bridge.port_sets import parse_port_set

    assert parse_port_set(text, {"amqp-tls": 5671}.get) == ports


@pytest.mark.parametrize("text", ["0-", "-5", "5-3", "70000", "0", "x-y"])
def test_bad_port_lists_are_rejected(text: str) -> None:
    from bridge.port_sets import PortSpecError, parse_port_set

    with pytest.raises(PortSpecError):
        parse_port_set(text)
