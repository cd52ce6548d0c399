"""Kubeconfigs and in-cluster config read as kubectl reads them, without the
`kubernetes` package. Files only; nothing running."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

from bridge.sources import kubeconfig as kc


def write(path: Path, config: dict[str, object]) -> Path:
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def config(server: str = "https://10.0.0.1:6443", user: dict[str, object] | None = None,
           cluster: dict[str, object] | None = None, name: str = "a") -> dict[str, object]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": name, "user": user if user is not None else {"token": "t-" + name}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }


def test_a_token_and_a_ca_file_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    path = write(tmp_path / "config", config(cluster={"certificate-authority": "ca.pem"}))
    creds = kc.from_kubeconfig(str(path))
    assert creds.host == "https://10.0.0.1:6443"
    assert creds.headers["Authorization"] == "Bearer t-a"
    assert creds.ca_file == str(tmp_path / "ca.pem")
    assert creds.verify and creds.cert_file is None


def test_inline_certificates_are_written_to_private_files(tmp_path: Path) -> None:
    data = {k: base64.b64encode(v.encode()).decode() for k, v in
            (("ca", "CA PEM"), ("cert", "CERT PEM"), ("key", "KEY PEM"))}
    path = write(tmp_path / "config", config(
        cluster={"certificate-authority-data": data["ca"]},
        user={"client-certificate-data": data["cert"], "client-key-data": data["key"]}))
    creds = kc.from_kubeconfig(str(path))
    assert creds.ca_file and Path(creds.ca_file).read_text() == "CA PEM"
    assert creds.cert_file and Path(creds.cert_file).read_text() == "CERT PEM"
    assert creds.key_file and Path(creds.key_file).read_text() == "KEY PEM"
    assert Path(creds.key_file).stat().st_mode & 0o077 == 0
    assert "Authorization" not in creds.headers


def test_a_token_file_basic_auth_and_skipping_verification(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("from-file\n")
    creds = kc.from_kubeconfig(str(write(tmp_path / "c1", config(user={"tokenFile": "tok"}))))
    assert creds.headers["Authorization"] == "Bearer from-file"
    creds = kc.from_kubeconfig(str(write(tmp_path / "c2", config(
        user={"username": "u", "password": "p"}, cluster={"insecure-skip-tls-verify": True}))))
    assert creds.headers["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
    assert not creds.verify


def test_several_files_merge_the_first_name_and_current_context_winning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write(tmp_path / "one", config(server="https://first:1", name="a"))
    second = config(server="https://second:2", name="a")
    second["current-context"] = "b"
    second["clusters"].append({"name": "b", "cluster": {"server": "https://b:3"}})  # type: ignore[attr-defined]
    second["users"].append({"name": "b", "user": {"token": "tb"}})  # type: ignore[attr-defined]
    second["contexts"].append({"name": "b", "context": {"cluster": "b", "user": "b"}})  # type: ignore[attr-defined]
    monkeypatch.setenv("KUBECONFIG", f"{first}:{write(tmp_path / 'two', second)}")
    creds = kc.from_kubeconfig(None)
    assert creds.host == "https://first:1"  # the first file's current-context and cluster
    assert kc.from_kubeconfig(None, "b").headers["Authorization"] == "Bearer tb"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.update({"current-context": ""}), "no current-context"),
    (lambda c: c["contexts"][0]["context"].update({"cluster": "x"}), "cluster 'x'"),
    (lambda c: c["contexts"][0]["context"].update({"user": "x"}), "user 'x'"),
    (lambda c: c["clusters"][0]["cluster"].pop("server"), "has no server"),
])
def test_what_is_wrong_is_said(tmp_path: Path, edit: object, message: str) -> None:
    c = config()
    edit(c)  # type: ignore[operator]
    with pytest.raises(kc.KubeconfigError, match=message):
        kc.from_kubeconfig(str(write(tmp_path / "config", c)))
    with pytest.raises(kc.KubeconfigError, match="no such context"):
        kc.from_kubeconfig(str(write(tmp_path / "config", config())), "nope")


def test_in_cluster_reads_the_service_accounts_token_and_ca(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_text("CA")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    creds = kc.in_cluster(tmp_path)
    assert creds.host == "https://[fd00::1]:443"
    assert creds.headers["Authorization"] == "Bearer sa-token"
    assert creds.ca_file == str(tmp_path / "ca.crt")
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
    with pytest.raises(kc.KubeconfigError, match="KUBERNETES_SERVICE_PORT"):
        kc.in_cluster(tmp_path)


def test_plain_credentials_never_import_the_kubernetes_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An import of the package would now fail: only plugins may need it.
    for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    creds = kc.from_kubeconfig(str(write(tmp_path / "config", config())))
    assert creds.headers["Authorization"] == "Bearer t-a"
    plugin = write(tmp_path / "plugin", config(user={"exec": {"command": "get-token"}}))
    with pytest.raises(ImportError):
        kc.from_kubeconfig(str(plugin))
    assert kc.needs_plugin({"auth-provider": {"name": "oidc"}})
    assert not kc.needs_plugin({"token": "t"})
