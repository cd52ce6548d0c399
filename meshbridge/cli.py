"""`meshbridge serve | get | profile | xds | compare | bench`.

Each subcommand registers itself on the parser; the protocol-specific clients live
with their protocol (`linkerd_api.client`, `xds_api.client`) and are imported only
when their subcommand runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from bridge.model import DEFAULT_MESHED_HTTP2_PARAMS, DEFAULT_OPAQUE_PORTS, MeshConfig
from bridge.port_sets import PortSpecError, parse_port_set
from h2grpc.limits import H2Limits, knobs
from meshbridge import gctune, layers
from meshbridge.limits import Limits
from meshbridge.log import configure_logging

log = structlog.get_logger("meshbridge.cli")

# H2Limits fields set by Limits' own flags, and those that cannot be 0.
_LIMITS_FLAGS = frozenset({"max_concurrent_streams", "max_message_bytes"})
_POSITIVE = frozenset({"stream_window", "connection_window", "max_header_list", "window",
                       "read_slice", "write_high_water", "max_header_fields"})


def add_mesh_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster-domain", default="cluster.local")
    p.add_argument("--trust-domain", default=None,
                   help="identity trust domain (default: the cluster domain)")
    p.add_argument("--controller-namespace", default="linkerd")
    p.add_argument("--default-opaque-ports", default=DEFAULT_OPAQUE_PORTS,
                   help="ports treated as opaque when a pod does not say (Linkerd's default)")
    p.add_argument("--disable-h2-upgrade", action="store_true",
                   help="do not hint h2 for meshed endpoints")
    p.add_argument("--outbound-transport-mode", choices=("transport-header", "transparent"),
                   default="transport-header",
                   help="transport-header: every meshed endpoint gets opaque transport")
    p.add_argument("--disable-ipv6", action="store_true")
    p.add_argument("--ext-endpoint-zone-weights", action="store_true",
                   help="weight same-zone endpoints x10")
    p.add_argument("--meshed-http2-client-params", default=json.dumps(
        dict(DEFAULT_MESHED_HTTP2_PARAMS)), help="JSON, proto field names; '' for none")


def mesh_config(args: argparse.Namespace) -> MeshConfig:
    try:
        opaque = parse_port_set(args.default_opaque_ports)
    except PortSpecError as e:
        raise SystemExit(f"--default-opaque-ports: {e}") from None
    params = None
    if args.meshed_http2_client_params:
        try:
            params = json.loads(args.meshed_http2_client_params)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--meshed-http2-client-params: not JSON: {e}") from None
    return MeshConfig(
        cluster_domain=args.cluster_domain.strip(".") or "cluster.local",
        trust_domain=args.trust_domain if args.trust_domain is not None else args.cluster_domain,
        controller_namespace=args.controller_namespace,
        default_opaque_ports=opaque,
        enable_h2_upgrade=not args.disable_h2_upgrade,
        force_opaque_transport=args.outbound_transport_mode == "transport-header",
        enable_ipv6=not args.disable_ipv6,
        zone_weights=args.ext_endpoint_zone_weights,
        meshed_http2_params=params,
    )


SERVE_HELP = "serve the destination API and xDS from one source"


def _add_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", default="demo", help="demo | files:DIR | sim:FILE | kube")
    p.add_argument("--listen", default="0.0.0.0:8086", help="gRPC address for both APIs")
    p.add_argument("--admin", default="0.0.0.0:9996", help="admin HTTP address")
    p.add_argument("--kubeconfig", default=None, help="kube source: kubeconfig file")
    p.add_argument("--context", default=None, help="kube source: kubeconfig context")
    p.add_argument("--endpoints-api", choices=("endpointslices", "endpoints"),
                   default="endpointslices",
                   help="kube source: watch EndpointSlices (default) or v1 Endpoints")
    p.add_argument("--log-format", choices=("json", "console"), default="console")
    p.add_argument("--log-level", default="info")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="seconds to let streams end after SIGTERM")
    p.add_argument("--tls-cert", default=None, help="PEM certificate for the gRPC port")
    p.add_argument("--tls-key", default=None, help="PEM private key for --tls-cert")
    p.add_argument("--client-ca", default=None,
                   help="PEM CA bundle: require client certificates signed by it (mTLS)")
    p.add_argument("--grpc-transport", choices=("native", "grpcio"), default="native",
                   help="the gRPC server: meshbridge's own HTTP/2 server (default) or "
                        "grpc.aio's")
    defaults = Limits()
    p.add_argument("--max-streams-per-connection", type=int,
                   default=defaults.max_streams_per_connection)
    p.add_argument("--max-message-bytes", type=int, default=defaults.max_message_bytes)
    p.add_argument("--max-streams-per-client", type=int,
                   default=defaults.max_streams_per_client,
                   help="concurrent streams from one client address")
    p.add_argument("--max-resource-names", type=int, default=defaults.max_resource_names,
                   help="resource names in one xDS request")
    h2 = p.add_argument_group("HTTP/2 budgets and timeouts of the native gRPC server, per "
                              "connection (docs/reliability.md)")
    for name, flag, kind, default, help_text in knobs():
        if name not in _LIMITS_FLAGS:
            h2.add_argument(flag, dest=f"h2_{name}", type=kind, default=default,
                            metavar="N", help=f"{help_text} (default {default})")
    add_mesh_arguments(p)
    for mod in layers.layer_modules():
        add = getattr(mod, "add_arguments", None)
        if add is not None:
            add(p)
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    from bridge.sources import SourceSpecError, make_source
    from meshbridge.app import App, ServeOptions, TlsFiles

    try:
        source = make_source(args.source, **_kube_options(args))
    except (SourceSpecError, ValueError) as e:
        log.error("bad --source", reason=str(e))
        return 2
    if bool(args.tls_cert) != bool(args.tls_key) or (args.client_ca and not args.tls_cert):
        log.error("--tls-cert and --tls-key go together; --client-ca needs both")
        return 2
    tls = TlsFiles(args.tls_cert, args.tls_key, args.client_ca) if args.tls_cert else None
    try:
        h2 = h2_limits(args)
    except ValueError as e:
        log.error("bad HTTP/2 limit", reason=str(e))
        return 2
    limits = Limits(args.max_streams_per_connection, args.max_message_bytes,
                    args.max_streams_per_client, args.max_resource_names, h2=h2)
    try:
        layer_options = tuple(mod.options_from_args(args) for mod in layers.layer_modules()
                              if hasattr(mod, "options_from_args"))
    except ValueError as e:
        log.error("bad protocol-layer option", reason=str(e))
        return 2
    app = App(source, mesh_config(args),
              ServeOptions(args.listen, args.admin, vars(args), limits, tls,
                           args.grpc_transport, layer_options), layers.protocol_layers())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start(wait_synced=False)
    waiter = asyncio.create_task(app.wait_synced())
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done and waiter.exception() is None:
        app.log_summary()
        gctune.settle_heap()
        await stopper
    else:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await waiter
    log.info("shutting down", grace=args.shutdown_grace)
    await app.stop(args.shutdown_grace)
    return 0


def h2_limits(args: argparse.Namespace) -> H2Limits:
    """The --h2-* flags (and --max-connections-per-client) as H2Limits; ValueError names
    a flag whose value cannot be."""
    values: dict[str, Any] = {}
    for name, flag, _, _, _ in knobs():
        if name in _LIMITS_FLAGS:
            continue
        value = getattr(args, f"h2_{name}")
        if value < 0 or (value == 0 and name in _POSITIVE):
            raise ValueError(f"{flag} must be {'above' if name in _POSITIVE else 'at least'} 0")
        values[name] = value
    return H2Limits(**values)


def _kube_options(args: argparse.Namespace) -> dict[str, object]:
    if not args.source.startswith("kube"):
        return {}
    return {k: getattr(args, k) for k in ("kubeconfig", "context", "endpoints_api")
            if getattr(args, k, None) is not None}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (every subcommand is listed)."""
    parser = argparse.ArgumentParser(
        prog="meshbridge",
        description="One Kubernetes endpoint truth, served over Linkerd's destination API "
                    "and Envoy's xDS.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help=SERVE_HELP)
    if command == "serve":
        _add_serve(serve)
    for name, cmd in layers.COMMANDS.items():
        if importlib.util.find_spec(cmd.module.split(".")[0]) is None:
            continue  # that part of meshbridge is not installed
        p = sub.add_parser(name, help=cmd.help)
        if name != command:
            continue
        mod = layers.load_optional(cmd.module)
        if mod is None:
            continue
        add: Callable[[argparse.ArgumentParser], None] = mod.add_arguments
        add(p)
        p.set_defaults(func=mod.run)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    command = next((a for a in argv if not a.startswith("-")), None)
    return build_parser(command).parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
