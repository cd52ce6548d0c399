"""`meshbridge shadow`: do two control planes answer every target alike?

    meshbridge shadow --api xds|linkerd --ours ADDR --theirs ADDR
                      (--targets FILE | --all) [--routes] [--duration S] [--json] ...

Subscribes to the same targets on both servers, as a proxy of that API would
(`harness.shadow.sides`), normalises both answers to the same endpoint form and compares
them continuously (`harness.shadow.model`), and reports a live table or one JSON object
per event, then a summary (`harness.shadow.report`); `harness.shadow.session` is one
run. Every field is compared (`harness.shadow.fields`; `--fields` leaves named ones out).
The exit status is 0 only if every target agrees at the end: same fields, or
differences that only the two documented Linkerd semantics explain ("semantics";
`--fail-on-semantics` counts those too); 1 otherwise; 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import TextIO

from harness.shadow.fields import listing, schema_for, unknown_patterns
from harness.shadow.report import make_report
from harness.shadow.session import Shadow, ignored_fields
from harness.shadow.targets import eds_name_template


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", choices=("linkerd", "xds"), required=True,
                   help="linkerd: destination Get per target; xds: ADS EDS")
    p.add_argument("--ours", required=True, metavar="ADDR", help="meshbridge's gRPC address")
    p.add_argument("--theirs", required=True, metavar="ADDR",
                   help="the other control plane (e.g. a port-forwarded linkerd-dst, istiod)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--targets", type=Path, metavar="FILE",
                       help="one authority per line (<svc>.<ns>.svc.<domain>:<port>, or "
                            "<svc>.<ns>:<port>); # starts a comment")
    which.add_argument("--all", action="store_true",
                       help="every service port --ours knows (its CDS), followed as it changes")
    p.add_argument("--duration", type=float, default=0.0,
                   help="seconds to run (default: until Ctrl-C)")
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    p.add_argument("--grace", type=float, default=2.0,
                   help="seconds a fresh disagreement may last before it counts (the other "
                        "side catching up)")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds of silence that are an answer: Linkerd 2.20's 'exists, no "
                        "endpoints', xDS SotW's 'does not exist'")
    p.add_argument("--retry-max", type=float, default=5.0,
                   help="longest delay between reconnects of an ended stream")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="--all: seconds to wait for ours' first CDS answer")
    p.add_argument("--fail-on-semantics", action="store_true",
                   help="exit 1 also for differences the Linkerd semantics explain")
    p.add_argument("--fields", "--ignore-fields", action="append", metavar="PATHS",
                   help="field paths or patterns to leave out of the comparison, comma "
                        "separated, repeatable (e.g. 'add.metric_labels.pod,profile.routes');"
                        " see docs/shadow.md")
    p.add_argument("--cluster-domain", default="cluster.local",
                   help="for expanding short names in --targets")
    p.add_argument("--routes", action="store_true",
                   help="compare each target's routes too: OutboundPolicies (linkerd) or "
                        "its RouteConfiguration's virtual host (xds), field by field")
    linkerd = p.add_argument_group("--api linkerd")
    linkerd.add_argument("--token", default="",
                         help='context token, e.g. {"ns":"shop","nodeName":"node-a"}')
    linkerd.add_argument("--workload", default="",
                         help='--routes: the client OutboundPolicies are asked for, e.g. '
                              '{"ns":"shop","pod":"web-0"} (default: a pod in the '
                              "--token's namespace)")
    xds = p.add_argument_group("--api xds")
    xds.add_argument("--node-id", default="meshbridge-shadow",
                     help="the xDS node id sent in every request")
    xds.add_argument("--node-zone", default="", help="the node's locality zone")
    xds.add_argument("--delta", action="store_true", help="incremental ADS (default SotW)")
    xds.add_argument("--theirs-eds-name", default="{authority}", metavar="TEMPLATE",
                     help="theirs' EDS name for a target: {authority}, {host}, {port}; "
                          "Istio: 'outbound|{port}||{host}'")
    xds.add_argument("--theirs-rds-name", default="{authority}", metavar="TEMPLATE",
                     help="--routes: theirs' RouteConfiguration name for a target, as "
                          "--theirs-eds-name; istiod for a sidecar: '{port}'")


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run_shadow(args))
    except KeyboardInterrupt:
        return 130


async def run_shadow(args: argparse.Namespace, out: TextIO | None = None,
                     stop: asyncio.Event | None = None) -> int:
    """The whole command; `stop` ends it early (Ctrl-C and SIGTERM set it)."""
    if args.targets is not None and not args.targets.is_file():
        sys.stderr.write(f"meshbridge shadow: --targets {args.targets}: no such file\n")
        return 2
    for flag, template in (("--theirs-eds-name", args.theirs_eds_name),
                           ("--theirs-rds-name", args.theirs_rds_name)):
        try:
            eds_name_template(template)
        except (KeyError, IndexError, ValueError) as e:
            sys.stderr.write(f"meshbridge shadow: {flag}: bad template: {e}\n")
            return 2
    unknown = list(unknown_patterns(args.api, ignored_fields(args)))
    if unknown:
        known = ", ".join(listing(schema_for(args.api)))
        sys.stderr.write(f"meshbridge shadow: --fields: unknown field "
                         f"{', '.join(map(repr, unknown))}; known fields: {known}\n")
        return 2
    report, note = make_report(args.json, out or sys.stdout)
    if note:
        sys.stderr.write(f"meshbridge shadow: {note}\n")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    if out is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
    try:
        return await Shadow(args, report).main(stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
