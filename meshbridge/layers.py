"""The one list of what plugs into the process: the protocol layers `serve` mounts on
the gRPC port, and the subcommands the protocols and tools contribute. The CLI, the
tests, the benchmarks and the harness all load layers from here, so that adding a
layer is one line.

A layer module exposes `LAYER` (a `meshbridge.host.Layer`: its name, its
`register(host, server)` and its options class) and optionally `add_arguments(parser)`
and `options_from_args(args)`; a subcommand module exposes `add_arguments(parser)`
and `run(args) -> int`. A module that is not installed is simply absent.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshbridge.host import Layer

# Protocol layers, in the order `serve` mounts them on the shared gRPC port.
PROTOCOL_LAYERS: tuple[str, ...] = (
    "linkerd_api.service", "linkerd_api.identity", "linkerd_api.policy.service",
    "xds_api.service", "admission.webhook")


@dataclass(frozen=True, slots=True)
class Command:
    module: str
    help: str


# Subcommands besides `serve`, imported only when they run (or when their --help is
# asked for).
COMMANDS: dict[str, Command] = {
    "get": Command("linkerd_api.client", "print what a destination Get stream says about a target"),
    "profile": Command("linkerd_api.profile_client", "print a destination GetProfile stream"),
    "policy": Command("linkerd_api.policy.client",
                      "print what an OutboundPolicies Watch says about a target, as routes"),
    "xds": Command("xds_api.client", "print what an xDS (ADS) subscription receives"),
    "compare": Command("harness.compare.cli", "run a comparison scenario over both protocols"),
    "shadow": Command("harness.shadow.cli", "compare two control planes' answers continuously"),
    "status": Command("meshbridge.status", "print every client's sync state, or what one "
                      "proxy holds (istio.io/debug/syncz, config_dump)"),
    "mirror": Command("meshbridge.mirror", "keep the mirror and federated Services of the "
                                           "linked clusters (Linkerd's service mirror)"),
}


def load_optional(module: str) -> ModuleType | None:
    """The module, or None when it (not one of its imports) is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            return None
        raise


def layer_modules() -> list[ModuleType]:
    return [m for m in map(load_optional, PROTOCOL_LAYERS) if m is not None]


def protocol_layers() -> list[Layer]:
    """Every installed layer, in mount order."""
    return [_layer_of(m) for m in layer_modules()]


def layer(module: str) -> Layer:
    """One layer by module name (tests mount a single layer)."""
    mod = load_optional(module)
    if mod is None:
        raise LookupError(f"protocol layer {module} is not installed")
    return _layer_of(mod)


def _layer_of(module: ModuleType) -> Layer:
    # Imported here: the CLI imports this module, and its client commands (get, xds)
    # load no server code.
    from meshbridge.host import Layer, LayerError

    found = getattr(module, "LAYER", None)
    if not isinstance(found, Layer):
        raise LayerError(f"layer {module.__name__}: exposes no LAYER (a meshbridge.host.Layer)")
    return found
