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
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from bridge.authority import AuthorityError
from bridge.model import DEFAULT_MESHED_HTTP2_PARAMS, DEFAULT_OPAQUE_PORTS, MeshConfig
from bridge.multicluster import DEFAULT_SYNC_TIMEOUT
from bridge.port_sets import PortSpecError, parse_port_set
from h2grpc.limits import H2Limits, knobs
from meshbridge import eventloop, gctune, layers
from meshbridge.debug_access import ACCESS_MODES, DEFAULT_ACCESS, DebugAccess
from meshbridge.eventloop import EVENT_LOOPS
from meshbridge.limits import Limits
from meshbridge.log import LOG_LEVELS, configure_logging
from meshbridge.startup import StartupError
from meshbridge.workers.cores import workers_argument

log = structlog.get_logger("meshbridge.cli")

# H2Limits fields set by Limits' own flags, and those that cannot be 0.
_LIMITS_FLAGS = frozenset({"max_concurrent_streams", "max_message_bytes"})
_POSITIVE = frozenset({"stream_window", "connection_window", "max_header_list", "window",
                       "read_slice", "slice_requests", "write_high_water",
                       "max_header_fields"})


def add_mesh_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster-domain", default="cluster.local",
                   help="the cluster's DNS domain (service names end in it)")
    p.add_argument("--trust-domain", default=None,
                   help="identity trust domain (default: the cluster domain)")
    p.add_argument("--controller-namespace", default="linkerd",
                   help="namespace of the Linkerd control plane (identities name it)")
    p.add_argument("--default-opaque-ports", default=DEFAULT_OPAQUE_PORTS,
                   help="ports treated as opaque when a pod does not say (Linkerd's default)")
    p.add_argument("--disable-h2-upgrade", action="store_true",
                   help="do not hint h2 for meshed endpoints")
    p.add_argument("--outbound-transport-mode", choices=("transport-header", "transparent"),
                   default="transport-header",
                   help="transport-header: every meshed endpoint gets opaque transport")
    p.add_argument("--disable-ipv6", action="store_true",
                   help="serve no IPv6 endpoint addresses")
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


def _add_serve(p: argparse.ArgumentParser, with_layers: bool = True) -> None:
    p.add_argument("--source", default="demo", help="demo | files:DIR | sim:FILE | kube")
    p.add_argument("--listen", default="0.0.0.0:8086", help="gRPC address for both APIs")
    p.add_argument("--admin", default="0.0.0.0:9996", help="admin HTTP address")
    p.add_argument("--kubeconfig", default=None, help="kube source: kubeconfig file")
    p.add_argument("--context", default=None, help="kube source: kubeconfig context")
    p.add_argument("--link", action="append", default=[], metavar="NAME=KUBECONFIG[,...]",
                   help="link a cluster by flag (repeatable): NAME=KUBECONFIG"
                        "[,trust-domain=D][,cluster-domain=D]; KUBECONFIG may be files:DIR "
                        "or sim:FILE for development. Linkerd's cluster-credentials Secrets "
                        "in the controller namespace link clusters too (docs/multicluster.md)")
    p.add_argument("--link-sync-timeout", type=float, default=DEFAULT_SYNC_TIMEOUT,
                   help="seconds a cluster linked at start may hold /ready before it "
                        "has synced")
    p.add_argument("--route-status", action=argparse.BooleanOptionalAction, default=True,
                   help="kube source: write each route's status.parents (Accepted, "
                        "ResolvedRefs) under meshbridge's controllerName, beside other "
                        "controllers' (default: on; other sources never write)")
    p.add_argument("--endpoints-api", choices=("endpointslices", "endpoints"),
                   default="endpointslices",
                   help="kube source: watch EndpointSlices (default) or v1 Endpoints")
    p.add_argument("--log-format", choices=("json", "console"), default="console",
                   help="json: one object a line; console: key=value for a terminal")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="the least severe level logged")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="seconds to let streams end after SIGTERM")
    p.add_argument("--tls-cert", default=None, help="PEM certificate for the gRPC port")
    p.add_argument("--tls-key", default=None, help="PEM private key for --tls-cert")
    p.add_argument("--client-ca", default=None,
                   help="PEM CA bundle: require client certificates signed by it (mTLS)")
    p.add_argument("--debug-access", choices=ACCESS_MODES, default=DEFAULT_ACCESS,
                   help="who may read the admin port's debug pages and the gRPC port's "
                        "debug types (istioctl proxy-status): local (loopback clients), "
                        "any, or off; with --client-ca, gRPC clients need a certificate")
    p.add_argument("--grpc-transport", choices=("native", "grpcio"), default="native",
                   help="the gRPC server: meshbridge's own HTTP/2 server (default) or "
                        "grpc.aio's")
    p.add_argument("--workers", type=workers_argument, default=1, metavar="N|auto",
                   help="processes serving the gRPC port: 1 (default) is this process "
                        "alone; N keeps the watch, the cluster cache and the views here "
                        "and serves clients from N worker processes on the same port "
                        "(SO_REUSEPORT); auto: one per usable core (docs/workers.md)")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default="asyncio",
                   help="the asyncio event loop: the standard library's (default) or "
                        "uvloop (pip install 'meshbridge[uvloop]'; docs/performance.md "
                        "has both measured)")
    defaults = Limits()
    p.add_argument("--max-streams-per-connection", type=int,
                   default=defaults.max_streams_per_connection,
                   help="concurrent streams on one HTTP/2 connection")
    p.add_argument("--max-message-bytes", type=int, default=defaults.max_message_bytes,
                   help="largest gRPC message taken or sent")
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
                            metavar="N", help=f"{help_text} (default: %(default)s)")
    add_mesh_arguments(p)
    for mod in layers.layer_modules() if with_layers else ():
        add = getattr(mod, "add_arguments", None)
        if add is not None:
            add(p)
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    if args.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise SystemExit("--event-loop uvloop: uvloop is not installed "
                         "(pip install 'meshbridge[uvloop]')")
    return eventloop.run(_serve(args), args.event_loop)


async def _serve(args: argparse.Namespace) -> int:
    from meshbridge.startup import check_listen_address

    try:
        check_listen_address("--listen", args.listen)
        check_listen_address("--admin", args.admin)
        if getattr(args, "webhook_listen", ""):  # the admission layer's own listener
            check_listen_address("--webhook-listen", args.webhook_listen)
    except StartupError as e:
        log.error(str(e))
        if args.debug:
            raise
        return 2
    source = getattr(args, "early_source", None)  # its watches opened in `main`
    if source is None:
        source = await _make_source(args)
        if isinstance(source, int):
            return source
    try:
        return await _serve_source(args, source)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


async def _make_source(args: argparse.Namespace) -> Any:
    """The source `--source` names (the kube source's credentials and access checked
    first, its watches opened at once), or the exit status that says why not."""
    from bridge.sources.base import SourceSpecError
    from bridge.sources.catalog import make_source
    from meshbridge.startup import check_kube_access, load_kube_credentials

    options = _kube_options(args)
    if args.source == "kube":
        try:
            creds = await asyncio.to_thread(load_kube_credentials, args.kubeconfig,
                                            args.context)
            await asyncio.to_thread(check_kube_access, creds, args.endpoints_api)
        except StartupError as e:
            log.error(str(e))
            if args.debug:
                raise
            return 1
        options["credentials"] = creds
    try:
        source = make_source(args.source, **options)
    except (SourceSpecError, ValueError) as e:
        log.error("bad --source", reason=str(e))
        return 2
    # The API server streams the cluster's state while the rest of the server is
    # imported and built (docs/performance.md, "Start-up on a big cluster").
    start_watches = getattr(source, "start_watches", None)
    if start_watches is not None:
        start_watches()
    return source


async def _serve_source(args: argparse.Namespace, source: Any) -> int:
    from bridge.multicluster.links import LinkError, parse_link_flag
    from meshbridge.app import App, ServeOptions, TlsFiles
    from meshbridge.host import LayerError
    from meshbridge.startup import describe_os_error
    from meshbridge.workers.pool import WorkerFailed

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
        debug_access = DebugAccess(args.debug_access, bool(args.client_ca))
        layer_options = tuple(mod.options_from_args(args) for mod in layers.layer_modules()
                              if hasattr(mod, "options_from_args"))
    except ValueError as e:
        log.error("bad protocol-layer option", reason=str(e))
        return 2
    if args.workers > 1 and args.grpc_transport != "native":
        log.error("--workers above 1 needs --grpc-transport native")
        return 2
    try:
        links = tuple(parse_link_flag(text) for text in args.link)
    except LinkError as e:
        log.error("bad --link", reason=str(e))
        return 2
    if args.link_sync_timeout < 0:
        log.error("bad --link-sync-timeout", reason="must be 0 or more seconds")
        return 2
    app = App(source, mesh_config(args),
              ServeOptions(args.listen, args.admin, limits, tls, args.grpc_transport,
                           layer_options, debug_access, links, args.link_sync_timeout,
                           workers=args.workers),
              layers.protocol_layers())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gctune.before_sync()
    try:
        await app.start(wait_synced=False)
    except WorkerFailed as e:
        log.error(f"--workers {args.workers}: {e}")  # one line naming the worker
        await app.stop(0)
        return 1
    except LayerError as e:  # a layer that does not keep to meshbridge.host's interface
        log.error(str(e))
        return 2
    except OSError as e:
        # Which port: the gRPC one is bound first, so no admin port means the gRPC one.
        flag, addr = getattr(e, "listen_flag", None) or (
            ("--admin", args.admin) if app.grpc_port else ("--listen", args.listen))
        log.error(describe_os_error(flag, addr, e))
        await app.stop(0)
        return 1
    except ValueError as e:
        log.error(str(e))
        await app.stop(0)
        return 2
    waiter = asyncio.create_task(app.wait_synced())
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    failed: BaseException | None = None
    if waiter in done and waiter.exception() is None:
        app.log_summary()
        gctune.settle_heap()
        await stopper
    elif waiter in done:
        # The source could not start (it used to be swallowed here: "serving", then
        # exit 0 with no reason).
        failed = waiter.exception()
    else:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await waiter
    if failed is not None:
        log.error(f"source {args.source} failed before its initial sync: "
                  f"{_one_line(failed)}")
        await app.stop(0)
        if args.debug:
            raise failed
        return 1
    log.info("shutting down", grace=args.shutdown_grace)
    await app.stop(args.shutdown_grace)
    return 0


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


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
    options: dict[str, object] = {
        k: getattr(args, k) for k in ("kubeconfig", "context", "endpoints_api", "route_status")
        if getattr(args, k, None) is not None}
    # Linked clusters' Secrets are read where Linkerd's destination reads them.
    options["link_namespace"] = args.controller_namespace
    return options


ENV_PREFIX = "MESHBRIDGE_"
# The pyproject extra each tool needs beyond the server's own dependencies.
EXTRAS = {"compare": "compare", "shadow": "shadow"}
_TRUE, _FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's help ends with its default, unless its text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.default is argparse.SUPPRESS
                or "%(default)" in text or "(default" in text):
            return text
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            return f"{text} (default: {'on' if action.default else 'off'})"
        if action.default is None:
            return f"{text} (default: unset)"
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Every parser shows each flag's default, and a usage mistake is one line (the
    serve usage alone is forty lines, which buried the reason)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse's signature is NoReturn
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version() -> str:
    import importlib.metadata  # only for --version: a fair share of start-up's imports

    try:
        return importlib.metadata.version("meshbridge")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


class _Version(argparse.Action):
    """argparse's `version` action, finding the version only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"meshbridge {version()}")
        parser.exit()


def env_name(action: argparse.Action) -> str | None:
    """MESHBRIDGE_LOG_LEVEL for --log-level; None for what has no long flag."""
    longs = [o for o in action.option_strings if o.startswith("--")]
    if not longs or action.default == argparse.SUPPRESS:
        return None
    return ENV_PREFIX + longs[0][2:].replace("-", "_").upper()


def apply_environment(parser: argparse.ArgumentParser,
                      environ: dict[str, str] | os._Environ[str]) -> None:
    """Every flag's default from MESHBRIDGE_<FLAG> when that is set, so that the
    command line still wins (what a Deployment's env: uses). A value the flag would
    refuse is refused naming the variable."""
    for action in parser._actions:
        name = env_name(action)
        if name is None or name not in environ:
            continue
        text = environ[name]
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            word = text.strip().lower()
            if word not in _TRUE | _FALSE:
                parser.exit(2, f"{parser.prog}: error: {name}={text!r}: expected true or "
                               "false (1 or 0)\n")
            # store_true's const is True, store_false's False: "true" means "as if given".
            action.default = action.const if word in _TRUE else not action.const
            continue
        if not isinstance(action, argparse._StoreAction) or action.nargs not in (None, "?"):
            continue  # no such flag today; a list would need a grammar of its own
        try:
            value: Any = action.type(text) if callable(action.type) else text
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            parser.exit(2, f"{parser.prog}: error: {name}={text!r}: {e}\n")
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            parser.exit(2, f"{parser.prog}: error: {name}={text!r}: expected one of "
                           f"{choices}\n")
        action.default = value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true",
                   help="on a failure, print the traceback as well as the reason")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (every subcommand is listed)."""
    parser = Parser(
        prog="meshbridge",
        description="One Kubernetes endpoint truth, served over Linkerd's destination API "
                    "and Envoy's xDS. Every flag can also be set as MESHBRIDGE_<FLAG> "
                    "(e.g. MESHBRIDGE_LOG_LEVEL=debug); the command line wins.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help=SERVE_HELP, description=SERVE_HELP)
    _add_common(serve)
    if command == "serve":
        _add_serve(serve)
    for name, cmd in layers.COMMANDS.items():
        if importlib.util.find_spec(cmd.module.split(".")[0]) is None:
            continue  # that part of meshbridge is not installed
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        _add_common(p)
        if name != command:
            continue
        mod = layers.load_optional(cmd.module)
        if mod is None:
            continue
        add: Callable[[argparse.ArgumentParser], None] = mod.add_arguments
        add(p)
        p.set_defaults(func=mod.run)
    return parser


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse_args(argv: Sequence[str],
               environ: dict[str, str] | os._Environ[str] | None = None) -> argparse.Namespace:
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    environ = os.environ if environ is None else environ
    apply_environment(parser, environ)
    chosen = subparsers(parser).get(command or "")
    if chosen is not None:
        apply_environment(chosen, environ)
    return parser.parse_args(argv)


class _QuietParser(argparse.ArgumentParser):
    """A parser that says nothing: a mistake is the full parser's to report."""

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise ValueError(message)

    def error(self, message: str) -> Any:
        raise ValueError(message)


def early_kube_source(argv: Sequence[str]) -> Any:
    """For `serve --source kube`: the kube source with its watches already open, or
    None. Done before the full parser is built, since that imports every protocol
    layer (their flags): on a big cluster the API server streams the state meanwhile
    (docs/performance.md, "Start-up on a big cluster"). Read with the serve flags that
    are not any layer's; anything amiss (a bad flag, no credentials, access denied)
    leaves it to `serve` to find and report as ever."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command != "serve" or "-h" in argv or "--help" in argv:  # help reads no cluster
        return None
    parser = _QuietParser(add_help=False)
    _add_serve(parser, with_layers=False)
    try:
        apply_environment(parser, os.environ)
        args, _ = parser.parse_known_args(argv[list(argv).index("serve") + 1:])
    except ValueError:
        return None
    if args.source != "kube":
        return None
    configure_logging(args.log_format, args.log_level)  # the watches may log at once
    from meshbridge.startup import open_kube_watches

    source = open_kube_watches(args.kubeconfig, args.context, args.endpoints_api,
                               _kube_options(args))
    if source is not None:
        # The watch threads decode the cluster's state from now on, while the rest is
        # imported: with the collector's default thresholds that was ~220 collections
        # (0.2 s of CPU at 10,000 pods) traversing the imports and what was decoded.
        gctune.before_sync()
    return source


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    early = early_kube_source(argv)
    try:
        args = parse_args(argv)
    except BaseException:
        if early is not None:
            early.close()
        raise
    args.early_source = early
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`meshbridge get ... | head`): stop as Unix tools do on
        # SIGPIPE, silently and with 128 + 13; stdout goes to /dev/null first so the
        # interpreter's own flush at exit finds nothing left to fail on.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except StartupError as e:
        if args.debug:
            raise
        print(f"meshbridge {args.command}: error: {e}", file=sys.stderr)
        return 1
    except AuthorityError as e:  # the one name grammar's error, the same for every command
        if args.debug:
            raise
        print(f"meshbridge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        extra = EXTRAS.get(args.command)
        if args.debug or extra is None or e.name is None:
            raise
        print(f"meshbridge {args.command}: error: needs the Python package {e.name!r}, "
              f"which `serve` does not: pip install 'meshbridge[{extra}]'", file=sys.stderr)
        return 1
    except Exception as e:
        if args.debug:
            raise
        # An ordinary failure is one line; --debug shows where it came from.
        print(f"meshbridge {args.command}: error: {type(e).__name__}: {_one_line(e)} "
              "(--debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
