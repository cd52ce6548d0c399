"""`meshbridge compare SCENARIO [--out DIR] [--envoy N]`: the two addressing models side
by side on the same churn.

meshbridge runs in this process on the `sim` source; measuring clients of each model
(Linkerd `Get` streams, xDS SotW, delta and LEDS ADS streams) run in a child process
per model, each decoding what it receives and keeping its own state. The run ends
with every client's state checked against the source's truth; `--isolate` then runs
each model alone on the same churn. See docs/compare.md.

Exit status: 0 when every check passes, 1 when one fails (a divergence, a byte count
that does not add up), 2 for a scenario or an option that cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from bridge.sources.sim import ScenarioError
from harness.compare.envoy_fleet import EnvoyError, EnvoyFleet
from harness.compare.run import RunError, RunOptions
from harness.compare.scenario import CompareScenario, load_compare_scenario
from harness.compare.views import LiveView, PlainView
from meshbridge.layers import load_optional
from meshbridge.log import configure_logging

# The server's own flags that a comparison may set: the xDS layer's (`--xds-*`,
# among them `--xds-endpoint-metadata`), parsed by the layer as `serve` does.
SERVER_LAYERS = ("xds_api.service",)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario YAML (see bench/scenarios/)")
    parser.add_argument("--out", default=None,
                        help="report folder (default: compare-out/<scenario name>)")
    parser.add_argument("--envoy", type=int, default=0, metavar="N",
                        help="also run N real Envoy processes as xDS clients")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of churn, instead of the scenario's")
    parser.add_argument("--settle-timeout", type=float, default=30.0,
                        help="seconds to wait for the clients to go quiet after the churn")
    parser.add_argument("--connect-timeout", type=float, default=60.0,
                        help="seconds to wait for every client's initial snapshot")
    parser.add_argument("--isolate", action="store_true",
                        help="also run each model alone, one after another, on the same "
                             "seeded churn (the report shows both)")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    parser.add_argument("--plain", action="store_true",
                        help="no live view: phase lines only (the default when not a TTY)")
    parser.add_argument("--log-level", default="warning",
                        help="the least severe level logged")
    for module in SERVER_LAYERS:
        mod = load_optional(module)
        add = getattr(mod, "add_arguments", None) if mod is not None else None
        if add is not None:
            add(parser)


def layer_options(args: argparse.Namespace) -> tuple[object, ...]:
    """The server layers' typed options from their flags; ValueError if one is bad."""
    out: list[object] = []
    for module in SERVER_LAYERS:
        mod = load_optional(module)
        parse = getattr(mod, "options_from_args", None) if mod is not None else None
        if parse is not None:
            out.append(parse(args))
    return tuple(out)


def run(args: argparse.Namespace) -> int:
    configure_logging("console", args.log_level)
    err = sys.stderr
    try:
        cs = load_compare_scenario(Path(args.scenario), args.duration)
    except ScenarioError as e:
        print(f"meshbridge compare: {e}", file=err)
        return EXIT_USAGE
    if args.envoy < 0:
        print(f"meshbridge compare: --envoy: must be >= 0, got {args.envoy}", file=err)
        return EXIT_USAGE
    for name in ("settle_timeout", "connect_timeout"):
        if getattr(args, name) <= 0:
            print(f"meshbridge compare: --{name.replace('_', '-')}: must be > 0", file=err)
            return EXIT_USAGE
    out = Path(args.out) if args.out else Path("compare-out") / cs.scenario.name
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"meshbridge compare: --out {out}: {e.strerror or e}", file=err)
        return EXIT_USAGE
    if cs.scenario.routes:
        return run_routes(cs, out, args)
    envoy = None
    if args.envoy:
        from harness.compare.envoy_fleet import EnvoyFleet

        try:
            envoy = EnvoyFleet.check(args.envoy, cs, out)
        except EnvoyError as e:
            print(f"meshbridge compare: --envoy: {e}", file=err)
            return EXIT_USAGE
    try:
        server_options = layer_options(args)
    except ValueError as e:
        print(f"meshbridge compare: {e}", file=err)
        return EXIT_USAGE
    live = not args.plain and sys.stderr.isatty()
    options = RunOptions(connect_timeout=args.connect_timeout,
                         settle_timeout=args.settle_timeout, isolate=args.isolate,
                         layer_options=server_options)
    return asyncio.run(compare(cs, out, options, live, envoy, not args.no_charts))


def run_routes(cs: CompareScenario, out: Path, args: argparse.Namespace) -> int:
    """A scenario with a `routes` section: the route-edit run (docs/compare.md)."""
    from harness.compare.route_edit import check_route_scenario, route_table, run_route_edit

    err = sys.stderr
    try:
        plan = check_route_scenario(cs)
    except ScenarioError as e:
        print(f"meshbridge compare: {e}", file=err)
        return EXIT_USAGE
    for flag, used in (("--envoy", args.envoy), ("--isolate", args.isolate),
                       ("--duration", args.duration is not None)):
        if used:
            print(f"meshbridge compare: {flag}: not for a route-edit scenario", file=err)
            return EXIT_USAGE
    try:
        fig = asyncio.run(run_route_edit(cs, plan, out, args.connect_timeout,
                                         args.settle_timeout))
    except (ScenarioError, RuntimeError, TimeoutError) as e:
        print(f"meshbridge compare: {e!r}", file=err)
        return EXIT_FAILED
    print(route_table(fig))
    print(f"report in {out / 'route-edit.md'}")
    return EXIT_OK if fig["ok"] else EXIT_FAILED


async def compare(cs: CompareScenario, out: Path, options: RunOptions, live: bool,
                  envoy: EnvoyFleet | None = None, with_charts: bool = True) -> int:
    from harness.compare import report
    from harness.compare.run import run as run_compare
    from harness.compare.run import run_isolated

    view = LiveView(cs) if live else PlainView()
    try:
        with view:
            r = await run_compare(cs, out, options, view, envoy)
            if envoy is not None:
                await envoy.stop()
                envoy = None
            if options.isolate:
                r.isolated = await run_isolated(cs, out, options, view, r.models)
    except (RunError, EnvoyError) as e:
        print(f"meshbridge compare: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if envoy is not None:
            await envoy.stop()
    fig = report.write(r, out, with_charts)
    print(summary(fig, out))
    return EXIT_OK if fig["ok"] else EXIT_FAILED


def summary(fig: dict[str, Any], out: Path) -> str:
    from harness.compare.markdown import isolated_table, kube_table, model_table

    lines = [model_table(fig), "", kube_table(fig), ""]
    if "isolated" in fig:
        lines += [isolated_table(fig), ""]
    for c in fig["checks"]:
        if not c["ok"]:
            lines.append(f"FAILED: {c['name']} — {c['detail']}")
    for f in fig["failures"][:20]:
        lines.append(f"DIVERGENCE: {f['client']} {f['target']}: {f['detail']}")
    lines.append(f"{'PASS' if fig['ok'] else 'FAIL'}: report in {out / 'report.md'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshbridge compare")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
