"""Either object module may be imported first (each registers kinds the other decodes):
checked in a fresh interpreter, where nothing is imported yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("first", ["bridge.policy_objects", "bridge.objects"])
def test_either_object_module_may_be_imported_first(first: str) -> None:
    code = (f"import {first}\n"
            "from bridge.objects import decode_object\n"
            "r = decode_object({'kind': 'GRPCRoute', 'metadata': {'name': 'a', "
            "'namespace': 'b'}})\n"
            "assert r is not None and r.kind == 'GRPCRoute'\n")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[2])
