"""What a run ran on, for the report: a figure means little without the commit, the
versions, the cores and how busy the machine was while it was taken.

`at_start` is taken before the server starts, `at_end` after the clients stopped; the
load averages bracket the run (a 1-minute load near or above the cores says other
work shared the machine).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from meshbridge.layers import load_optional

ROOT = Path(__file__).resolve().parents[2]
XDS_LAYER = "xds_api.service"
# Today's behaviour: every LbEndpoint carries Linkerd's metadata. A server whose xDS
# options have no metadata profile is reported as this.
DEFAULT_PROFILE = "linkerd"


def commit(root: Path = ROOT) -> str:
    """The checked-out commit, "+dirty" when tracked files differ; "unknown" outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _version(module: str) -> str:
    mod = load_optional(module)
    return str(getattr(mod, "__version__", "unknown")) if mod is not None else "absent"


def _protobuf_version() -> str:
    try:
        from google.protobuf import __version__
    except ImportError:
        return "absent"
    return str(__version__)


def metadata_profile(layer_options: tuple[object, ...]) -> str:
    """The xDS endpoint-metadata profile the server runs with (`--xds-endpoint-metadata`):
    read from the xDS layer's options (those given, else its defaults); "linkerd" when
    the layer has no such option."""
    mod = load_optional(XDS_LAYER)
    kind = getattr(mod, "XdsOptions", None) if mod is not None else None
    options: object | None = next((o for o in layer_options
                                   if kind is not None and isinstance(o, kind)), None)
    if options is None and kind is not None:
        options = kind()
    return profile_of(options)


def profile_of(options: object | None) -> str:
    """The metadata profile a layer-options dataclass names, if it names one."""
    if options is None or not dataclasses.is_dataclass(options):
        return DEFAULT_PROFILE
    for f in dataclasses.fields(options):
        if "metadata" in f.name:
            value = getattr(options, f.name)
            return str(getattr(value, "value", value))
    return DEFAULT_PROFILE


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def at_start(layer_options: tuple[object, ...] = ()) -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "commit": commit(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "grpcio": _version("grpc"),
        "protobuf": _protobuf_version(),
        "platform": platform.platform(),
        "cores": os.cpu_count() or 0,
        "cores_usable": usable,
        "load_start": load_average(),
        "load_end": [],
        "xds_endpoint_metadata": metadata_profile(layer_options),
        "executable": sys.executable,
    }


def at_end(env: dict[str, Any]) -> None:
    env["load_end"] = load_average()
