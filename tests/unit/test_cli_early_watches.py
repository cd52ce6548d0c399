"""`serve --source kube` opens the kube watches before the full CLI parser is built
(meshbridge.cli.early_kube_source); everything else, and anything amiss, leaves the
start to `serve` as before. Nothing here reaches an API server: the cases that open
watches run against a real one in tests/integration (test_serve, test_deploy)."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from meshbridge.cli import early_kube_source


@pytest.mark.parametrize("argv", [
    ["get", "web.app.svc.cluster.local:80"],
    ["serve"],  # the demo source
    ["serve", "--source", "files:/nowhere"],
    ["serve", "--source", "kube", "--help"],
    ["serve", "--source", "kube", "--log-level", "loud"],  # serve reports the mistake
])
def test_no_watches_are_opened_early_but_for_a_kube_serve(argv: list[str]) -> None:
    assert early_kube_source(argv) is None


def test_a_kube_serve_without_credentials_is_left_to_serve(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "no-such-kubeconfig"
    logging_before = structlog.get_config()  # a kube serve sets up its logging first
    try:
        assert early_kube_source(["serve", "--source", "kube", "--kubeconfig",
                                  str(missing)]) is None
    finally:
        structlog.configure(**logging_before)
