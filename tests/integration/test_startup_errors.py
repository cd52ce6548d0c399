"""Start-up failures of `meshbridge serve`, as a person meets them: the real CLI in a
subprocess ends with a non-zero exit and one line on stderr that names the problem
(and no traceback unless --debug)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.net import free_port, ready
from testkit.processes import running, stop

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture


def serve(*args: str, env: dict[str, str] | None = None,
          home: Path | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
               and not k.startswith("MESHBRIDGE_")}
    if home is not None:
        environ["HOME"] = str(home)
    environ.update(env or {})
    argv = [sys.executable, "-m", "meshbridge", "serve", "--listen", "127.0.0.1:0",
            "--admin", "127.0.0.1:0", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=environ,
                          check=False)


def the_one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The run failed, said nothing on stdout and exactly one line on stderr."""
    assert proc.returncode != 0, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "serving" not in lines[0]
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def write_kubeconfig(path: Path) -> Path:
    path.write_text("""\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: only, context: {cluster: c, user: u}}]
current-context: only
""")
    return path


def test_kube_source_without_any_kubeconfig_names_the_file_it_looked_for(
        tmp_path: Path) -> None:
    line = the_one_line(serve("--source", "kube", home=tmp_path))
    assert "~/.kube/config" in line and "no such file" in line


def test_kube_source_with_a_missing_kubeconfig_names_it(tmp_path: Path) -> None:
    line = the_one_line(serve("--source", "kube", "--kubeconfig", "/nonexistent",
                              home=tmp_path))
    assert "/nonexistent" in line and "no such file" in line


def test_kube_source_with_an_unknown_context_names_the_file_and_the_context(
        tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc.yaml")
    line = the_one_line(serve("--source", "kube", "--kubeconfig", str(kc),
                              "--context", "nope", home=tmp_path))
    assert str(kc) in line and "'nope'" in line and "no such context" in line


def test_debug_adds_the_traceback(tmp_path: Path) -> None:
    proc = serve("--source", "kube", "--kubeconfig", "/nonexistent", "--debug",
                 home=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "/nonexistent" in proc.stderr


def test_an_identity_rbac_denies_everything_is_refused_at_start(
        kube_apiserver: KubeAPIServer, tmp_path: Path) -> None:
    kc = kube_apiserver.token_kubeconfig_for("meshbridge-unbound")
    line = the_one_line(serve("--source", "kube", "--kubeconfig", str(kc), home=tmp_path))
    assert "RBAC denies listing" in line and "EndpointSlice" in line and "Service" in line


def test_an_identity_denied_only_pods_still_serves(
        kube_apiserver: KubeAPIServer, tmp_path: Path) -> None:
    """RBAC denying a kind the endpoint view can do without is the watcher's "access
    denied; other kinds keep working", not a start-up failure."""
    user = "meshbridge-no-pods"
    api = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    rbac = client.RbacAuthorizationV1Api(api)
    rules = [
        {"apiGroups": [""], "resources": ["services", "endpoints", "nodes"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["list", "watch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "watch"]},
        {"apiGroups": ["policy.linkerd.io", "linkerd.io"], "resources": ["*"],
         "verbs": ["list", "watch"]},
    ]
    role = {"metadata": {"name": user}, "rules": rules}
    binding = {"metadata": {"name": user},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": user},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": user}]}
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)
    admin_port = free_port()
    kc = kube_apiserver.token_kubeconfig_for(user)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MESHBRIDGE_")}
    try:
        with running([sys.executable, "-m", "meshbridge", "serve", "--source", "kube",
                      "--kubeconfig", str(kc), "--listen", "127.0.0.1:0",
                      "--admin", f"127.0.0.1:{admin_port}", "--log-format", "json"],
                     lambda: ready(admin_port), "/ready never answered 200",
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     env=environ) as proc:
            out = stop(proc)
    finally:
        rbac.delete_cluster_role_binding(user)
        rbac.delete_cluster_role(user)
        api.close()
    assert proc.returncode == 0, out
    assert "access denied; other kinds keep working" in out and '"kind": "Pod"' in out


@pytest.mark.parametrize("flag", ["--listen", "--admin"])
def test_a_busy_port_is_one_line_naming_the_flag_and_address(
        busy_port: int, flag: str) -> None:
    line = the_one_line(serve(flag, f"127.0.0.1:{busy_port}"))
    assert f"{flag} 127.0.0.1:{busy_port}" in line and "in use" in line


def test_a_busy_webhook_port_is_one_line_naming_its_flag(busy_port: int,
                                                         tmp_path: Path) -> None:
    line = the_one_line(serve("--webhook-listen", f"127.0.0.1:{busy_port}", "--webhook-cert",
                              str(tmp_path / "absent.crt"), "--webhook-key",
                              str(tmp_path / "absent.key")))
    assert f"--webhook-listen 127.0.0.1:{busy_port}" in line and "in use" in line


def test_a_webhook_without_a_certificate_is_refused_at_start() -> None:
    line = the_one_line(serve("--webhook-listen", "127.0.0.1:0"))
    assert "--webhook-listen needs --webhook-cert/--webhook-key" in line


@pytest.mark.parametrize("address", ["localhost", "localhost:http", "127.0.0.1:70000"])
def test_a_bad_listen_address_is_one_line(address: str) -> None:
    line = the_one_line(serve("--listen", address))
    assert f"--listen '{address}'" in line


def test_an_unknown_log_level_is_refused() -> None:
    line = the_one_line(serve("--log-level", "bogus"))
    assert "--log-level" in line and "bogus" in line and "info" in line


def test_an_unknown_log_level_from_the_environment_names_the_variable() -> None:
    line = the_one_line(serve(env={"MESHBRIDGE_LOG_LEVEL": "bogus"}))
    assert "MESHBRIDGE_LOG_LEVEL='bogus'" in line
