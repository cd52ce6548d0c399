"""`meshbridge shadow`: do two control planes answer every target alike?

    meshbridge shadow --api xds|linkerd --ours ADDR --theirs ADDR
                      (--targets FILE | --all) [--duration S] [--json] ...

Subscribes to the same targets on both servers, as a proxy of that API would
(`shadow_sides`), normalises both answers to the same endpoint form and compares them
continuously (`shadow_model`), and reports a live table or one JSON object per event,
then a summary (`shadow_report`). The exit status is 0 only if every target agrees at
the end: same endpoints, or differences that only the two documented Linkerd
semantics explain ("semantics"; `--fail-on-semantics` counts those too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import grpc

from harness.shadow_model import ALL_FIELDS, PENDING, Answer, Tracker
from harness.shadow_report import Report, make_report, summarize
from harness.shadow_sides import Backoff, ClusterWatch, LinkerdSide, XdsSide
from xds_api.names import expand_short_name

OURS, THEIRS = "ours", "theirs"


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
    p.add_argument("--cluster-domain", default="cluster.local",
                   help="for expanding short names in --targets")
    linkerd = p.add_argument_group("--api linkerd")
    linkerd.add_argument("--token", default="",
                         help='context token, e.g. {"ns":"shop","nodeName":"node-a"}')
    xds = p.add_argument_group("--api xds")
    xds.add_argument("--node-id", default="meshbridge-shadow")
    xds.add_argument("--node-zone", default="", help="the node's locality zone")
    xds.add_argument("--delta", action="store_true", help="incremental ADS (default SotW)")
    xds.add_argument("--theirs-eds-name", default="{authority}", metavar="TEMPLATE",
                     help="theirs' EDS name for a target: {authority}, {host}, {port}; "
                          "Istio: 'outbound|{port}||{host}'")


def read_targets(path: Path, cluster_domain: str) -> list[str]:
    out: list[str] = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(expand_short_name(line, cluster_domain))
    return list(dict.fromkeys(out))


def eds_name_template(template: str) -> Callable[[str], str]:
    def name(target: str) -> str:
        host, _, port = target.rpartition(":")
        return template.format(authority=target, host=host, port=port)

    name("web.emojivoto.svc.cluster.local:80")  # a bad template fails now, not later
    return name


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run_shadow(args))
    except KeyboardInterrupt:
        return 130


class Shadow:
    """One run: both sides, the tracker, the report; `main` is its whole life."""

    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args = args
        self.report = report
        self.tracker = Tracker(args.grace)
        self.loop = asyncio.get_running_loop()
        retry = Backoff(min(0.2, args.retry_max), args.retry_max)
        self.channels = [grpc.aio.insecure_channel(args.ours),
                         grpc.aio.insecure_channel(args.theirs)]
        self.sides: dict[str, LinkerdSide | XdsSide] = {}
        self.watches: list[ClusterWatch] = []
        self.ours_clusters: asyncio.Event = asyncio.Event()
        self.cds_status = ""
        self.notes: list[str] = []
        for side, channel in zip((OURS, THEIRS), self.channels, strict=True):
            if args.api == "linkerd":
                self.sides[side] = LinkerdSide(side, channel, self._sink(side), token=args.token,
                                               settle=args.settle, retry=retry)
            else:
                xside = XdsSide(
                    side, channel, self._sink(side), node_id=args.node_id, zone=args.node_zone,
                    delta=args.delta, settle=args.settle, retry=retry,
                    resource_name=eds_name_template(args.theirs_eds_name) if side == THEIRS
                    else str)
                self.sides[side] = xside
                self.watches.append(ClusterWatch(channel, self._clusters(side, xside),
                                                 node_id=args.node_id, zone=args.node_zone,
                                                 retry=retry))
        if args.all and args.api == "linkerd":
            # The targets come from ours' CDS even when comparing Linkerd answers:
            # meshbridge serves both APIs on one port.
            self.watches.append(ClusterWatch(self.channels[0], self._clusters(OURS, None),
                                             node_id=args.node_id, retry=retry))

    def _sink(self, side: str) -> Callable[[str, Answer], None]:
        def put(target: str, answer: Answer) -> None:
            now = self.loop.time()
            events = self.tracker.set_answer(target, side, answer, now)
            fields = set(ALL_FIELDS)
            for s in self.sides.values():
                fields &= set(s.fields())
                note = s.note()
                if note and note not in self.notes:
                    self.notes.append(note)
                    self.report.note(note)
            events += self.tracker.set_fields(fields, now)
            self.report.events(events)

        return put

    def _clusters(self, side: str,
                  xside: XdsSide | None) -> Callable[[frozenset[str] | None, str], None]:
        def changed(names: frozenset[str] | None, status: str) -> None:
            if xside is not None:
                xside.set_clusters(names)
            if side == OURS:
                self.cds_status = status
                if names is not None:
                    if self.args.all:
                        self.add_targets(sorted(names))
                    self.ours_clusters.set()

        return changed

    def add_targets(self, targets: list[str]) -> None:
        new = [t for t in targets if self.tracker.add(t)]
        for side in self.sides.values():
            side.add(new)

    async def main(self, stop: asyncio.Event) -> int:
        args = self.args
        tasks = [asyncio.create_task(w.run(), name="cds") for w in self.watches]
        try:
            if args.all:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.connect_timeout):
                        await self.ours_clusters.wait()
                if not self.ours_clusters.is_set():
                    sys.stderr.write(f"meshbridge shadow: --all: no CDS answer from --ours "
                                     f"{args.ours}: {self.cds_status or 'no response'}\n")
                    return 2
            else:
                self.add_targets(read_targets(args.targets, args.cluster_domain))
            self.report.start({"api": args.api, "ours": args.ours, "theirs": args.theirs,
                               "targets": len(self.tracker.records),
                               "xds": ("delta" if args.delta else "sotw")
                               if args.api == "xds" else None,
                               "grace_s": args.grace, "settle_s": args.settle})
            started = self.loop.time()
            tasks += [asyncio.create_task(s.run(), name=f"side {n}")
                      for n, s in self.sides.items()]
            tasks.append(asyncio.create_task(self._tick(), name="tick"))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(args.duration or None):
                    await stop.wait()
            await self._settle_down()
            duration = self.loop.time() - started
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            for ch in self.channels:
                await ch.close()
        summary = summarize(self.tracker, api=args.api, ours=args.ours, theirs=args.theirs,
                            duration=duration, notes=self.notes,
                            strict_semantics=args.fail_on_semantics)
        self.report.finish(summary)
        return summary.exit_code

    async def _tick(self) -> None:
        while True:
            self.report.events(self.tracker.tick(self.loop.time()))
            self.report.refresh(self.tracker)
            await asyncio.sleep(0.1)  # a refresh period, not synchronisation

    async def _settle_down(self) -> None:
        """At the end, let fresh disagreements and first answers run their course (at
        most grace + settle), so the summary does not count a side that is catching up."""
        deadline = self.loop.time() + self.args.grace + self.args.settle
        while self.loop.time() < deadline and (
                self.tracker.converging()
                or any(r.shown == PENDING for r in self.tracker.records.values())):
            await asyncio.sleep(0.05)  # polling the tracker's state, with a deadline
        self.report.events(self.tracker.tick(self.loop.time()))


async def run_shadow(args: argparse.Namespace, out: TextIO | None = None,
                     stop: asyncio.Event | None = None) -> int:
    """The whole command; `stop` ends it early (Ctrl-C and SIGTERM set it)."""
    if args.targets is not None and not args.targets.is_file():
        sys.stderr.write(f"meshbridge shadow: --targets {args.targets}: no such file\n")
        return 2
    try:
        eds_name_template(args.theirs_eds_name)
    except (KeyError, IndexError, ValueError) as e:
        sys.stderr.write(f"meshbridge shadow: --theirs-eds-name: bad template: {e}\n")
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
