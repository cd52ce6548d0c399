"""deploy/ against a real kube-apiserver: it applies, and its RBAC is exactly enough."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from kubernetes import client, config, dynamic, utils
from kubernetes.client.rest import ApiException

from bridge.cluster import Cluster
from bridge.routes.index import ROUTE_STORE_KINDS
from bridge.sources.kube import KINDS, POLICY_KINDS, KubeSource, watched_kinds
from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.polling import HANG

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SA_USER = "system:serviceaccount:meshbridge:meshbridge"
SA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:meshbridge", "system:authenticated")


def manifests(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def group_and_resource(path: str) -> tuple[str, str]:
    parts = path.strip("/").split("/")
    return ("", parts[-1]) if parts[0] == "api" else (parts[1], parts[-1])


@pytest.fixture(scope="module")
def applied(kube_apiserver: KubeAPIServer) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    for name in ("00-namespace.yaml", "10-rbac.yaml", "20-service.yaml"):
        for doc in manifests(name):
            with contextlib.suppress(utils.FailToCreateError):  # already there from a rerun
                utils.create_from_dict(api, doc)
    yield api
    api.close()


def test_the_folder_applies_in_one_kubectl_apply(applied: client.ApiClient) -> None:
    """`kubectl apply -f deploy/` takes the folder's manifests in file-name order: each
    namespaced object must come after its Namespace (it used to sort before it), and
    every one applies server-side in that order."""
    files = sorted(DEPLOY.glob("*.yaml"))  # what kubectl reads of the folder (no -R)
    assert [f.name for f in files] == ["00-namespace.yaml", "10-rbac.yaml",
                                       "20-service.yaml", "30-deployment.yaml",
                                       "40-webhook.yaml"]
    created: set[str] = set()
    docs = [d for f in files for d in manifests(f.name)]
    for doc in docs:
        ns = doc["metadata"].get("namespace")
        assert ns is None or ns in created, f"{doc['kind']} before its namespace {ns}"
        if doc["kind"] == "Namespace":
            created.add(doc["metadata"]["name"])
    resources = dynamic.DynamicClient(applied).resources
    for doc in docs:
        resources.get(api_version=doc["apiVersion"], kind=doc["kind"]).server_side_apply(
            body=doc, name=doc["metadata"]["name"], namespace=doc["metadata"].get("namespace"),
            field_manager="meshbridge-test", force_conflicts=True, dry_run="All")


def test_the_deployments_pod_passes_pod_security_restricted(
        applied: client.ApiClient) -> None:
    core = client.CoreV1Api(applied)
    ns = "meshbridge-plain-restricted"
    with contextlib.suppress(ApiException):  # there from a rerun
        core.create_namespace({"metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted"}}})
    (deployment,) = manifests("30-deployment.yaml")
    template = deployment["spec"]["template"]
    core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": "plain-manifest",
                                                 "labels": template["metadata"]["labels"]},
                                    "spec": template["spec"]}, dry_run="All")


def test_the_cluster_role_grants_exactly_what_the_kube_source_watches() -> None:
    (role,) = [d for d in manifests("10-rbac.yaml") if d["kind"] == "ClusterRole"]
    granted = {
        (group, resource, verb)
        for rule in role["rules"] for group in rule["apiGroups"]
        for resource in rule["resources"] for verb in rule["verbs"]
    }
    needed = {
        (*group_and_resource(spec.path), verb)
        for mode in ("endpointslices", "endpoints") for spec in watched_kinds(mode)
        for verb in ("get", "list", "watch")
    }
    needed.add(("authentication.k8s.io", "tokenreviews", "create"))  # identity's TokenReview
    # --route-status patches the status subresource of the route kinds, nothing more.
    needed |= {(*group_and_resource(KINDS[k].path)[:1],
                group_and_resource(KINDS[k].path)[1] + "/status", "patch")
               for k in ROUTE_STORE_KINDS}
    assert granted == needed
    assert {s.kind for s in watched_kinds("endpoints")} | {"EndpointSlice"} == set(KINDS)


def access(api: client.ApiClient, verb: str, group: str, resource: str) -> bool:
    review = client.AuthorizationV1Api(api).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": SA_USER, "groups": list(SA_GROUPS),
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource}},
    })
    return bool(review.status.allowed)


def test_the_api_server_enforces_that_role(applied: client.ApiClient) -> None:
    for spec in KINDS.values():
        group, resource = group_and_resource(spec.path)
        for verb in ("list", "watch", "get"):
            assert access(applied, verb, group, resource), (verb, resource)
        for verb in ("create", "update", "delete", "patch"):
            assert not access(applied, verb, group, resource), (verb, resource)
    assert access(applied, "create", "authentication.k8s.io", "tokenreviews")
    assert not access(applied, "list", "", "secrets")
    assert not access(applied, "list", "", "configmaps")


def test_the_deployment_passes_server_side_validation(applied: client.ApiClient) -> None:
    (deployment,) = manifests("30-deployment.yaml")
    created = client.AppsV1Api(applied).create_namespaced_deployment(
        "meshbridge", deployment, dry_run="All")
    container = created.spec.template.spec.containers[0]
    assert container.args[:3] == ["serve", "--source", "kube"]
    assert {p.container_port for p in container.ports} == {8086, 9996, 9443}
    assert container.args[container.args.index("--webhook-listen") + 1] == "0.0.0.0:9443"
    assert container.readiness_probe.http_get.path == "/ready"
    assert container.liveness_probe.http_get.path == "/live"
    assert created.spec.template.spec.service_account_name == "meshbridge"
    assert created.spec.replicas == 2


async def synced_once(source: KubeSource, cluster: Cluster) -> list[MutableMapping[str, Any]]:
    """Run `source` into `cluster` until it has synced; what it logged."""
    synced = asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(source.run(cluster, synced))
        try:
            await asyncio.wait_for(synced.wait(), HANG)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return logs


async def test_the_kube_source_runs_as_that_service_account_without_denials(
    applied: client.ApiClient, kube_apiserver: KubeAPIServer
) -> None:
    kubeconfig = kube_apiserver.token_kubeconfig_for(SA_USER, SA_GROUPS)
    logs = await synced_once(KubeSource(kubeconfig=str(kubeconfig)), Cluster())
    assert not [e for e in logs if e.get("event", "").startswith("access denied")]
    # A CRD not installed is reported as missing (404), which means RBAC let us ask;
    # another test of this session may have installed some (test_kube_policy.py).
    crds = client.ApiextensionsV1Api(applied).list_custom_resource_definition().items
    installed = {(c.spec.group, c.spec.names.plural) for c in crds}
    missing = {e["kind"] for e in logs if e.get("event", "").startswith("CRD not installed")}
    assert missing == {s.kind for s in KINDS.values()
                       if s.optional and group_and_resource(s.path) not in installed}


async def test_a_denied_kind_is_reported_and_the_others_keep_working(
    applied: client.ApiClient, kube_apiserver: KubeAPIServer
) -> None:
    rbac = client.RbacAuthorizationV1Api(applied)
    name = f"partial-{int(time.time() * 1000)}"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["services", "pods", "nodes"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["get", "list", "watch"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"}]})
    source = KubeSource(kubeconfig=str(kube_apiserver.token_kubeconfig_for(name)))
    cluster = Cluster()
    logs = await synced_once(source, cluster)
    denied = {e["kind"] for e in logs if e.get("event", "").startswith("access denied")}
    assert denied == {"ReplicaSet", "Job", "Server", "ServiceProfile", *POLICY_KINDS}
    assert cluster.services  # the kinds it may read were listed
    assert not source.stale


def test_the_linked_clusters_role_grants_exactly_what_their_watches_read() -> None:
    """deploy/multicluster/remote/: what meshbridge watches in a linked cluster
    (bridge/multicluster/remote.py), read-only; and the mirror writes Services only."""
    from bridge.multicluster.remote import REMOTE_KINDS

    remote = [d for d in yaml.safe_load_all(
        (DEPLOY / "multicluster" / "remote" / "remote-access.yaml").read_text()) if d]
    (role,) = [d for d in remote if d["kind"] == "ClusterRole"]
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    assert granted == {(*group_and_resource(KINDS[k].path), verb) for k in REMOTE_KINDS
                       for verb in ("get", "list", "watch")}
    mirror = [d for d in yaml.safe_load_all(
        (DEPLOY / "multicluster" / "20-mirror.yaml").read_text()) if d]
    (role,) = [d for d in mirror if d["kind"] == "ClusterRole"]
    writes = {(r, v) for rule in role["rules"] for r in rule["resources"]
              for v in rule["verbs"] if v not in ("get", "list", "watch")}
    assert writes == {("services", "create"), ("services", "patch"), ("services", "delete")}
