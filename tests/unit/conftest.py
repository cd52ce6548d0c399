"""tests/unit/ runs nothing: a unit test that opens a socket, a gRPC channel or server,
or starts a process fails, naming what it tried. Such a test belongs in
tests/integration/, which talks to real peers."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from typing import Any

import grpc
import pytest


def _refuse(what: str) -> Callable[..., Any]:
    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(f"a unit test may not {what}: it belongs in tests/integration/")
    return refused


@pytest.fixture(autouse=True)
def nothing_running(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, _refuse(f"{name} a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a process"))
    monkeypatch.setattr(os, "fork", _refuse("fork"))
    for module in (grpc, grpc.aio):
        for name in ("server", "insecure_channel", "secure_channel"):
            monkeypatch.setattr(module, name, _refuse(f"open a gRPC {name.split('_')[-1]}"))
