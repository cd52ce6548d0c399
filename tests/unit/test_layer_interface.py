"""The layers build against meshbridge.host alone, and the App holds them to it: a layer
that asks for options it does not declare, options no mounted layer declares, or hooks
of the wrong shape stop the start with one line naming the layer, before any port is
bound or the source runs."""

from __future__ import annotations

import ast
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.sources.catalog import DEMO_DIR
from bridge.sources.files import FilesSource
from linkerd_api.endpoint_streams import Semantics
from linkerd_api.identity import IdentityOptions
from linkerd_api.service import LinkerdOptions
from meshbridge.app import App, ServeOptions
from meshbridge.host import GrpcServer, Host, Layer, LayerError
from meshbridge.layers import PROTOCOL_LAYERS, layer, protocol_layers
from testkit.recorders import HandlerRecorder
from testkit.serving import Apps
from tests.conftest import AppFactory
from xds_api.service import XdsOptions

REPO = Path(__file__).resolve().parents[2]
# What of the process a layer package may import: the interface, and two helpers.
ALLOWED = {"meshbridge.host", "meshbridge.loopmetrics", "meshbridge.client_tls"}


def app_of(*layers: Layer, layer_options: tuple[object, ...] = (),
           grpc_transport: str = "native") -> App:
    return App(FilesSource(DEMO_DIR), None, ServeOptions(
        "127.0.0.1:0", "127.0.0.1:0", grpc_transport=grpc_transport,
        layer_options=layer_options), list(layers))


async def refusal(app: App) -> str:
    """The one line the App stops with; nothing was bound, no source runs."""
    with pytest.raises(LayerError) as refused:
        await app.start()
    assert app.grpc_port == 0 and app.admin_port == 0 and app.grpc_server is None
    message = str(refused.value)
    assert "\n" not in message
    return message


def imports_of(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package", ["linkerd_api", "xds_api", "admission"])
def test_a_layer_package_imports_of_the_process_only_its_interface(package: str) -> None:
    wrong = {f"{path.relative_to(REPO)}: {name}"
             for path in (REPO / package).rglob("*.py") for name in imports_of(path)
             if name.split(".")[0] == "meshbridge" and name not in ALLOWED}
    assert not wrong, f"imports beyond meshbridge.host: {sorted(wrong)}"


def test_the_interface_imports_neither_the_app_nor_the_admin_port() -> None:
    imported = imports_of(REPO / "meshbridge" / "host.py")
    assert not {"meshbridge.app", "meshbridge.admin", "meshbridge.debug"} & imported


def test_every_layer_declares_its_name_and_options() -> None:
    layers = protocol_layers()
    assert [x.name for x in layers] == list(PROTOCOL_LAYERS)
    assert all(x.options and all(isinstance(k, type) for k in x.options) for x in layers)


async def test_a_layer_asking_for_options_it_does_not_declare_stops_the_start() -> None:
    def register(host: Host, server: GrpcServer) -> None:
        host.options_for(XdsOptions)

    message = await refusal(app_of(Layer("greedy", register, (LinkerdOptions,))))
    assert message == ("layer greedy: asks for XdsOptions, but declares LinkerdOptions "
                       "as its options")


async def test_options_no_mounted_layer_declares_stop_the_start() -> None:
    # As a test mounting only Linkerd's layer but configuring xDS would otherwise
    # silently serve xDS's defaults.
    message = await refusal(app_of(layer("linkerd_api.service"),
                                   layer_options=(XdsOptions(draining=True),)))
    assert message == ("options XdsOptions given, but no mounted layer declares them "
                       "(mounted: linkerd_api.service)")


class Hooks:
    def grpc_port_tls(self) -> ssl.SSLContext | None:
        return None

    async def start_listeners(self, listen: str, port: int) -> None:
        pass

    async def stop_listeners(self, grace: float) -> None:
        pass


class NoGrace(Hooks):
    async def stop_listeners(self) -> None:  # type: ignore[override]
        pass


class BlockingStart(Hooks):
    def start_listeners(self, listen: str, port: int) -> None:  # type: ignore[override]
        pass


class NoTls:
    async def start_listeners(self, listen: str, port: int) -> None:
        pass

    async def stop_listeners(self, grace: float) -> None:
        pass


@pytest.mark.parametrize(("hooks", "says"), [
    (NoGrace(), "layer hooked: hook stop_listeners() cannot be called as "
                "async stop_listeners(grace)"),
    (BlockingStart(), "layer hooked: hook start_listeners must be "
                      "async start_listeners(listen, port)"),
    (NoTls(), "layer hooked: its hooks have no grpc_port_tls()"),
])
async def test_hooks_of_the_wrong_shape_stop_the_start(hooks: object, says: str) -> None:
    def register(host: Host, server: GrpcServer) -> None:
        host.add_hooks(hooks)  # type: ignore[arg-type]

    assert await refusal(app_of(Layer("hooked", register))) == says


def test_hooks_of_the_right_shape_are_taken() -> None:
    hooks = Hooks()

    def register(host: Host, server: GrpcServer) -> None:
        host.add_hooks(hooks)

    app = app_of(Layer("hooked", register))
    app._mount(HandlerRecorder())
    assert app.layer_hooks == [hooks]


def test_the_host_says_whether_the_port_can_choose_certificates_by_sni() -> None:
    seen: dict[str, bool] = {}

    def register(host: Host, server: GrpcServer) -> None:
        seen[host.options_for(LinkerdOptions).semantics] = host.sni_certificates

    cases: tuple[tuple[str, Semantics], ...] = (("native", "proto"),
                                                ("grpcio", "linkerd-2.20"))
    for transport, semantics in cases:
        app_of(Layer("probe", register, (LinkerdOptions,)), grpc_transport=transport,
               layer_options=(LinkerdOptions(semantics),))._mount(HandlerRecorder())
    assert seen == {"proto": True, "linkerd-2.20": False}


async def test_identity_from_its_own_ca_refuses_a_port_that_cannot_choose_by_sni() -> None:
    app = app_of(layer("linkerd_api.identity"), grpc_transport="grpcio",
                 layer_options=(IdentityOptions(tls_from_identity=True),))
    with pytest.raises(ValueError, match="--tls-from-identity needs --grpc-transport native"):
        app._mount(HandlerRecorder())


def test_the_source_s_kubernetes_credentials_are_offered_only_by_a_kube_source() -> None:
    got: list[Callable[[], Any] | None] = []

    def register(host: Host, server: GrpcServer) -> None:
        got.append(host.kube_credentials())

    app_of(Layer("probe", register))._mount(HandlerRecorder())
    assert got == [None]  # a files source reaches no API


async def test_a_misspelt_option_fails_rather_than_being_ignored(
        make_app: AppFactory, apps: Apps, demo_dir: Path) -> None:
    with pytest.raises(TypeError, match="extra"):
        ServeOptions("127.0.0.1:0", "127.0.0.1:0", extra={})  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="layer_option"):
        await make_app(demo_dir, layer_option=(XdsOptions(),))
    assert not apps.started
