"""Every project module imports alone, in a fresh interpreter: no module depends on
another having been imported first (the static check of cycles is
tests/unit/test_import_cycles.py)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.unit.test_import_cycles import REPO, project_modules


def _import_alone(module: str) -> str | None:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        return None
    return f"{module}: {proc.stderr.strip().splitlines()[-1] if proc.stderr else proc.returncode}"


# Bounded by the count of modules (about 150 interpreters); the timeout only guards
# against a hang, far above what they take on a loaded 2-core machine.
@pytest.mark.timeout(1800)
def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    # `__main__` modules run a command when imported, rather than define anything.
    modules = sorted(m for m in project_modules() if not m.endswith(".__main__"))
    # Two at a time: the machine has two cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [f for f in pool.map(_import_alone, modules) if f is not None]
    assert failures == []


def test_the_protocol_layers_load_neither_the_app_nor_the_admin_port() -> None:
    # A layer builds against meshbridge.host alone (tests/unit/test_layer_interface.py
    # checks what its modules import; this, what loading them brings along).
    code = ("import sys\n"
            "from meshbridge.layers import PROTOCOL_LAYERS, protocol_layers\n"
            "assert len(protocol_layers()) == len(PROTOCOL_LAYERS)\n"
            "loaded = {'meshbridge.app', 'meshbridge.admin', 'meshbridge.debug'} & "
            "set(sys.modules)\n"
            "assert not loaded, sorted(loaded)\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=300)
