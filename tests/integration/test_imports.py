"""What importing a module brings with it, checked in a fresh interpreter where nothing
is imported yet: either object module may be imported first (each registers kinds the
other decodes), and a protocol layer loads nothing of the process but its interface
(meshbridge.host): not the App, the admin server or the debug pages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def in_a_fresh_interpreter(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("first", ["bridge.policy_objects", "bridge.objects"])
def test_either_object_module_may_be_imported_first(first: str) -> None:
    code = (f"import {first}\n"
            "from bridge.objects import decode_object\n"
            "r = decode_object({'kind': 'GRPCRoute', 'metadata': {'name': 'a', "
            "'namespace': 'b'}})\n"
            "assert r is not None and r.kind == 'GRPCRoute'\n")
    in_a_fresh_interpreter(code)


def test_the_protocol_layers_load_neither_the_app_nor_the_admin_port() -> None:
    code = ("import sys\n"
            "from meshbridge.layers import protocol_layers\n"
            "assert len(protocol_layers()) == 4\n"
            "loaded = {'meshbridge.app', 'meshbridge.admin', 'meshbridge.debug'} & "
            "set(sys.modules)\n"
            "assert not loaded, sorted(loaded)\n")
    in_a_fresh_interpreter(code)
