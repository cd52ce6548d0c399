"""The envtest kube-apiserver is real: it stores, validates, watches and authorizes."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.polling import HANG, eventually_sync

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

# The first test to use the fixture may build kube-apiserver (about 4 minutes
# on 2 cores when nothing is cached), which the default 300 s timeout would cut.
pytestmark = [pytest.mark.kube, pytest.mark.timeout(1800)]


def _client(kubeconfig: object) -> client.ApiClient:
    api_client: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))
    return api_client


@pytest.fixture
def admin(kube_apiserver: KubeAPIServer) -> Iterator[client.ApiClient]:
    api_client = _client(kube_apiserver.kubeconfig_path)
    yield api_client
    api_client.close()


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespace(client.V1Namespace(metadata={"name": name}))
    yield name
    client.CoreV1Api(admin).delete_namespace(name)


def test_version_and_readiness(kube_apiserver: KubeAPIServer, admin: client.ApiClient) -> None:
    assert kube_apiserver.url.startswith("https://127.0.0.1:")
    info = client.VersionApi(admin).get_code()
    assert info.major == "1"
    assert info.git_version.startswith("v1.")
    assert kube_apiserver.apiserver_running


def test_discovery_objects_roundtrip(admin: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(admin)
    discovery = client.DiscoveryV1Api(admin)
    node_name = f"node-{namespace}"

    node = core.create_node(
        {
            "metadata": {
                "name": node_name,
                "labels": {"topology.kubernetes.io/zone": "zone-a"},
            }
        }
    )
    try:
        assert node.metadata.labels["topology.kubernetes.io/zone"] == "zone-a"

        pod = core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "web-0", "labels": {"app": "web"}},
                "spec": {
                    "nodeName": node_name,
                    "containers": [
                        {
                            "name": "web",
                            "image": "example/web:1",
                            "ports": [{"containerPort": 8080}],
                        }
                    ],
                },
            },
        )
        assert pod.status.phase == "Pending"  # defaulted by the apiserver

        # Status only changes through the status subresource.
        core.patch_namespaced_pod_status(
            "web-0",
            namespace,
            {
                "status": {
                    "phase": "Running",
                    "podIP": "10.244.1.5",
                    "podIPs": [{"ip": "10.244.1.5"}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            },
        )
        got = core.read_namespaced_pod("web-0", namespace)
        assert got.status.phase == "Running"
        assert got.status.pod_ip == "10.244.1.5"
        assert [(c.type, c.status) for c in got.status.conditions] == [("Ready", "True")]
        # ... and a plain update cannot change it.
        core.patch_namespaced_pod("web-0", namespace, {"status": {"podIP": "10.244.9.9"}})
        assert core.read_namespaced_pod("web-0", namespace).status.pod_ip == "10.244.1.5"

        svc = core.create_namespaced_service(
            namespace,
            {
                "metadata": {"name": "web"},
                "spec": {
                    "selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                },
            },
        )
        # A ClusterIP was allocated from --service-cluster-ip-range=10.96.0.0/16.
        assert svc.spec.cluster_ip.startswith("10.96.")
        assert svc.spec.type == "ClusterIP"

        discovery.create_namespaced_endpoint_slice(
            namespace,
            {
                "metadata": {
                    "name": "web-abc12",
                    "labels": {"kubernetes.io/service-name": "web"},
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [
                    {
                        "addresses": ["10.244.1.5"],
                        "conditions": {"ready": True, "serving": True, "terminating": False},
                        "nodeName": node_name,
                        "zone": "zone-a",
                        "targetRef": {"kind": "Pod", "name": "web-0", "namespace": namespace},
                    }
                ],
            },
        )

        # Validation is real: a loopback address is rejected.
        with pytest.raises(ApiException) as invalid:
            discovery.create_namespaced_endpoint_slice(
                namespace,
                {
                    "metadata": {"name": "bad"},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": ["127.0.0.1"]}],
                },
            )
        assert invalid.value.status == 422

        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=web"
        )
        assert [s.metadata.name for s in slices.items] == ["web-abc12"]
        (ep,) = slices.items[0].endpoints
        assert ep.addresses == ["10.244.1.5"]
        assert ep.conditions.ready is True
        assert ep.node_name == node_name
        assert ep.zone == "zone-a"
        assert ep.target_ref.name == "web-0"
        assert [(p.name, p.port) for p in slices.items[0].ports] == [("http", 8080)]

        assert [s.metadata.name for s in core.list_namespaced_service(namespace).items] == ["web"]
        pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
        assert [(p.metadata.name, p.status.pod_ip) for p in pods] == [("web-0", "10.244.1.5")]
        assert node_name in [n.metadata.name for n in core.list_node().items]
    finally:
        core.delete_node(node_name)


def test_watch_sees_update(admin: client.ApiClient, namespace: str) -> None:
    discovery = client.DiscoveryV1Api(admin)
    discovery.create_namespaced_endpoint_slice(
        namespace,
        {
            "metadata": {"name": "api-1", "labels": {"kubernetes.io/service-name": "api"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.2.1"], "conditions": {"ready": True}}],
        },
    )
    listed = discovery.list_namespaced_endpoint_slice(namespace)
    start_rv = listed.metadata.resource_version

    events: queue.Queue[dict[str, Any]] = queue.Queue()
    w = watch.Watch()

    def run() -> None:
        stream = w.stream(
            discovery.list_namespaced_endpoint_slice,
            namespace,
            resource_version=start_rv,
            timeout_seconds=30,
        )
        try:
            events.put(next(stream))
        except Exception as exc:
            events.put({"type": "EXCEPTION", "object": exc})
        finally:
            stream.close()

    watcher = threading.Thread(target=run, daemon=True)
    watcher.start()
    discovery.patch_namespaced_endpoint_slice(
        "api-1",
        namespace,
        {
            "endpoints": [
                {"addresses": ["10.244.2.1"], "conditions": {"ready": True}},
                {"addresses": ["10.244.2.2"], "conditions": {"ready": False}},
            ]
        },
    )
    ev = events.get(timeout=HANG)
    watcher.join(timeout=HANG)
    assert ev["type"] == "MODIFIED"
    obj = ev["object"]
    assert obj.metadata.name == "api-1"
    assert int(obj.metadata.resource_version) > int(start_rv)
    assert [(e.addresses, e.conditions.ready) for e in obj.endpoints] == [
        (["10.244.2.1"], True),
        (["10.244.2.2"], False),
    ]


def test_compaction_expires_old_resource_versions(
    kube_apiserver: KubeAPIServer, admin: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(admin)
    created = core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "c"}, "data": {"v": "1"}}
    )
    old_rv = created.metadata.resource_version
    core.patch_namespaced_config_map("c", namespace, {"data": {"v": "2"}})

    # Before compaction the old resourceVersion is still watchable.
    w = watch.Watch()
    first = next(
        iter(
            w.stream(
                core.list_namespaced_config_map,
                namespace,
                resource_version=old_rv,
                timeout_seconds=5,
            )
        )
    )
    w.stop()
    assert first["type"] == "MODIFIED"
    assert first["object"].data == {"v": "2"}

    compacted = kube_apiserver.compact_etcd()
    assert compacted > int(old_rv)

    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(
            core.list_namespaced_config_map,
            namespace,
            resource_version=old_rv,
            timeout_seconds=5,
        ):
            pytest.fail("a watch from a compacted resourceVersion delivered an event")
    assert gone.value.status == 410
    assert "Expired" in str(gone.value.reason)

    # A fresh list gives a resourceVersion that can be watched again.
    fresh_rv = core.list_namespaced_config_map(namespace).metadata.resource_version
    assert int(fresh_rv) >= compacted
    stream = watch.Watch().stream(
        core.list_namespaced_config_map, namespace, resource_version=fresh_rv, timeout_seconds=1
    )
    assert list(stream) == []


def test_rbac_applies_to_non_admin_tokens(
    kube_apiserver: KubeAPIServer, admin: client.ApiClient, namespace: str
) -> None:
    user = f"reader-{namespace}"
    with _client(kube_apiserver.token_kubeconfig_for(user, ["meshbridge-test"])) as as_user:
        core = client.CoreV1Api(as_user)
        review = client.AuthenticationV1Api(as_user).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        assert review.status.user_info.username == user
        assert "meshbridge-test" in review.status.user_info.groups

        with pytest.raises(ApiException) as denied:
            core.list_namespaced_pod(namespace)
        assert denied.value.status == 403

        # Not the aggregated ClusterRole "view": without kube-controller-manager
        # nothing aggregates rules into it, so it grants nothing here.
        rbac = client.RbacAuthorizationV1Api(admin)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "rules": [
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "pod-reader",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            },
        )

        def can_list() -> bool:
            try:
                core.list_namespaced_pod(namespace)
            except ApiException as exc:
                if exc.status != 403:
                    raise
                return False
            return True

        eventually_sync(can_list, HANG, "the role binding never took effect", period=0.1)
        # The grant is namespaced: other namespaces and writes stay forbidden.
        with pytest.raises(ApiException) as still_denied:
            core.list_namespaced_pod("default")
        assert still_denied.value.status == 403
        with pytest.raises(ApiException) as no_write:
            core.create_namespaced_config_map(namespace, {"metadata": {"name": "nope"}})
        assert no_write.value.status == 403


@pytest.mark.parametrize("kill", [False, True], ids=["graceful", "sigkill"])
def test_apiserver_restart_keeps_etcd_state(
    kube_apiserver: KubeAPIServer, admin: client.ApiClient, namespace: str, kill: bool
) -> None:
    core = client.CoreV1Api(admin)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "kept"}, "data": {"k": "v"}})
    url = kube_apiserver.url
    kube_apiserver.stop_apiserver(kill=kill)
    try:
        assert not kube_apiserver.apiserver_running
        # Connection refused (no HTTP answer at all), after urllib3's retries.
        with pytest.raises(urllib3.exceptions.MaxRetryError):
            core.read_namespaced_config_map("kept", namespace, _request_timeout=2)
    finally:
        kube_apiserver.start_apiserver()
    assert kube_apiserver.url == url
    assert core.read_namespaced_config_map("kept", namespace).data == {"k": "v"}
