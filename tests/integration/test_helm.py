"""deploy/helm/meshbridge as people install it: `helm lint` and `helm template`
accept it, and what it renders a real kube-apiserver takes by server-side apply, in
dependency order, with its pod accepted under PodSecurity "restricted"."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException

from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "meshbridge"
NAMESPACE = "meshbridge-helm"
# What must exist before what refers to it.
ORDER = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment",
         "PodDisruptionBudget", "ValidatingWebhookConfiguration")


@pytest.fixture(scope="module")
def helm() -> str:
    """helm, built from the Go module proxy once (scripts/helm.sh) and cached."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "helm.sh")], capture_output=True,
                         text=True, timeout=1500, check=True)
    return out.stdout.strip().splitlines()[-1]


def render(helm: str, *values: str) -> list[dict[str, Any]]:
    sets = [a for v in values for a in ("--set", v)]
    out = subprocess.run([helm, "template", "mb", str(CHART), "--namespace", NAMESPACE,
                          *sets], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_helm_lint_accepts_the_chart(helm: str) -> None:
    for values in ([], ["tls.secretName=meshbridge-tls,tls.clientCA=true",
                        "serviceMonitor.enabled=true"], MULTICLUSTER):
        sets = [a for v in values for a in ("--set", v)]
        out = subprocess.run([helm, "lint", "--strict", str(CHART), *sets],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr


def test_tls_values_mount_the_secret_and_pass_the_flags(helm: str) -> None:
    (deployment,) = [d for d in render(helm, "tls.secretName=mb-tls", "tls.clientCA=true")
                     if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    for flag in ("--tls-cert", "--tls-key", "--client-ca"):
        assert flag in args
    assert pod["volumes"] == [
        {"name": "tls", "secret": {"secretName": "mb-tls"}},
        {"name": "webhook-tls", "secret": {"secretName": "meshbridge-webhook-tls",
                                           "optional": True}}]
    kinds = {d["kind"] for d in render(helm, "serviceMonitor.enabled=true")}
    assert "ServiceMonitor" in kinds and "ServiceMonitor" not in {
        d["kind"] for d in render(helm)}


def test_the_webhook_values_render_deploy_s_configuration_and_its_flags(helm: str) -> None:
    docs = render(helm, "webhook.failurePolicy=Fail", "webhook.caBundle=Q0E=")
    (vwc,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    plain = yaml.safe_load((REPO / "deploy" / "40-webhook.yaml").read_text())
    (ours,), (theirs,) = vwc["webhooks"], plain["webhooks"]
    assert ours["rules"] == theirs["rules"] and ours["sideEffects"] == "None"
    assert ours["failurePolicy"] == "Fail" and theirs["failurePolicy"] == "Ignore"
    assert ours["clientConfig"]["caBundle"] == "Q0E="
    assert ours["clientConfig"]["service"] == {
        "name": "mb-meshbridge", "namespace": NAMESPACE, "port": 9443, "path": "/validate"}
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--webhook-listen") + 1] == "0.0.0.0:9443"
    off = render(helm, "webhook.enabled=false")
    assert "ValidatingWebhookConfiguration" not in {d["kind"] for d in off}
    (deployment,) = [d for d in off if d["kind"] == "Deployment"]
    assert "--webhook-listen" not in deployment["spec"]["template"]["spec"]["containers"][0][
        "args"]
    assert "volumes" not in deployment["spec"]["template"]["spec"]


MULTICLUSTER = ["multicluster.enabled=true", "multicluster.mirror.enabled=true",
                "remoteAccess.enabled=true"]


def test_the_charts_multicluster_objects_are_deploy_multiclusters(helm: str) -> None:
    docs = render(helm, *MULTICLUSTER)
    plain = [d for f in sorted((REPO / "deploy" / "multicluster").rglob("*.yaml"))
             for d in yaml.safe_load_all(f.read_text()) if d]

    def rules(objs: list[dict[str, Any]], kind: str, suffix: str) -> Any:
        (obj,) = [d for d in objs if d["kind"] == kind
                  and d["metadata"]["name"].endswith(suffix)]
        return obj["rules"]

    for kind, suffix in (("Role", "-links"), ("ClusterRole", "-mirror"),
                         ("ClusterRole", "-remote")):
        assert rules(docs, kind, suffix) == rules(plain, kind, suffix), (kind, suffix)
    (serve,) = [d for d in docs if d["kind"] == "Deployment"
                and d["metadata"]["name"] == "mb-meshbridge"]
    args = serve["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--controller-namespace") + 1] == "linkerd"
    (mirror,) = [d for d in docs if d["kind"] == "Deployment"
                 and d["metadata"]["name"].endswith("-mirror")]
    assert mirror["spec"]["template"]["spec"]["containers"][0]["args"][0] == "mirror"
    assert not [d for d in render(helm) if "multicluster" in str(d) or "mirror" in
                d["metadata"]["name"]]


def test_the_charts_role_is_deploy_rbac_yaml_s(helm: str) -> None:
    (ours,) = [d for d in render(helm) if d["kind"] == "ClusterRole"]
    plain = [d for d in yaml.safe_load_all((REPO / "deploy" / "10-rbac.yaml").read_text()) if d]
    (theirs,) = [d for d in plain if d["kind"] == "ClusterRole"]
    assert ours["rules"] == theirs["rules"]


@pytest.fixture(scope="module")
def api(kube_apiserver: KubeAPIServer) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": NAMESPACE,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    except ApiException as e:
        if e.status != 409:  # there from an earlier test in this session
            raise
    yield api
    api.close()


def apply(api: client.ApiClient, doc: dict[str, Any]) -> None:
    resource = dynamic.DynamicClient(api).resources.get(api_version=doc["apiVersion"],
                                                        kind=doc["kind"])
    # The webhook configuration is checked, not stored: registered, it would send every
    # later test's Pods and Services to a webhook that never answers.
    dry_run = "All" if doc["kind"] == "ValidatingWebhookConfiguration" else None
    resource.server_side_apply(body=doc, name=doc["metadata"]["name"],
                               namespace=doc["metadata"].get("namespace"),
                               field_manager="meshbridge-test", force_conflicts=True,
                               dry_run=dry_run)


def dry_run_pod(api: client.ApiClient, template: dict[str, Any], name: str) -> None:
    """Create the Deployment's pod (dry run): PodSecurity enforces on pods."""
    client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
        "spec": template["spec"]}, dry_run="All")


def test_the_rendered_objects_apply_in_order_and_the_pod_is_restricted(
        helm: str, api: client.ApiClient) -> None:
    docs = render(helm, "tls.secretName=mb-tls")
    assert {d["kind"] for d in docs} == set(ORDER)
    for doc in sorted(docs, key=lambda d: ORDER.index(d["kind"])):
        apply(api, doc)
    apps = client.AppsV1Api(api)
    deployment = apps.read_namespaced_deployment("mb-meshbridge", NAMESPACE)
    assert deployment.spec.replicas == 2
    (rendered,) = [d for d in docs if d["kind"] == "Deployment"]
    dry_run_pod(api, rendered["spec"]["template"], "restricted-ok")


def test_a_pod_without_the_restricted_settings_is_refused_there(
        api: client.ApiClient) -> None:
    # The control: the same check refuses a pod that lacks seccomp and runs as root.
    with pytest.raises(ApiException) as e:
        dry_run_pod(api, {"metadata": {}, "spec": {"containers": [
            {"name": "x", "image": "meshbridge:0.1.0"}]}}, "not-restricted")
    assert e.value.status == 403 and "restricted" in (e.value.body or "")
