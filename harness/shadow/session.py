"""One `meshbridge shadow` run: both sides subscribed, their answers fed to the tracker,
the tracker's events to the report, and the summary at the end."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable

import grpc

from harness.shadow.fields import FieldFilter
from harness.shadow.model import PENDING, Answer, Tracker
from harness.shadow.report import Report, summarize
from harness.shadow.routes import RouteWatch, authority_reader
from harness.shadow.sides import Backoff, ClusterWatch, HostnameWatch, LinkerdSide, XdsSide
from harness.shadow.targets import eds_name_template, read_targets

OURS, THEIRS = "ours", "theirs"


def policy_workload(args: argparse.Namespace) -> str:
    """--routes with --api linkerd: the client OutboundPolicies are asked for (its
    namespace picks consumer routes and ServiceProfiles): --workload, else a pod in
    the --token's namespace."""
    if args.workload:
        return str(args.workload)
    try:
        ns = json.loads(args.token).get("ns", "") if args.token else ""
    except (ValueError, AttributeError):
        ns = ""
    return json.dumps({"ns": ns or "default", "pod": "meshbridge-shadow"})


def ignored_fields(args: argparse.Namespace) -> list[str]:
    """--fields: repeated, each a comma-separated list of field paths or patterns."""
    return [p.strip() for arg in (args.fields or ()) for p in arg.split(",") if p.strip()]


class Shadow:
    """One run: both sides, the tracker, the report; `main` is its whole life."""

    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args = args
        self.report = report
        self.tracker = Tracker(args.grace, FieldFilter(ignored_fields(args)))
        self.loop = asyncio.get_running_loop()
        retry = Backoff(min(0.2, args.retry_max), args.retry_max)
        self.channels = [grpc.aio.insecure_channel(args.ours),
                         grpc.aio.insecure_channel(args.theirs)]
        self.sides: dict[str, LinkerdSide | XdsSide] = {}
        self.watches: list[ClusterWatch] = []
        self.ours_clusters: asyncio.Event = asyncio.Event()
        self.cds_status = ""
        self.notes: list[str] = []
        self.route_watches: list[RouteWatch] = []
        for side, channel in zip((OURS, THEIRS), self.channels, strict=True):
            if args.api == "linkerd":
                self.sides[side] = LinkerdSide(
                    side, channel, self._sink(side), token=args.token, settle=args.settle,
                    retry=retry, workload=policy_workload(args) if args.routes else None)
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
                if args.routes:
                    xside.compare_routes()
                    theirs = side == THEIRS
                    self.route_watches.append(RouteWatch(
                        channel, xside.set_routes,
                        rds_name=eds_name_template(args.theirs_rds_name) if theirs else str,
                        cluster_authority=authority_reader(args.theirs_eds_name) if theirs
                        else str,
                        node_id=args.node_id, zone=args.node_zone, settle=args.settle,
                        retry=Backoff(retry.low, retry.high)))
        if args.all and args.api == "linkerd":
            # The targets come from ours' CDS even when comparing Linkerd answers:
            # meshbridge serves both APIs on one port.
            self.watches.append(ClusterWatch(self.channels[0], self._clusters(OURS, None),
                                             node_id=args.node_id, retry=retry))
        # --all: the StatefulSet pod authorities behind ours' services, from its EDS.
        self.hostnames = HostnameWatch(self.channels[0], self.add_targets,
                                       node_id=args.node_id, retry=retry) if args.all else None

    def _sink(self, side: str) -> Callable[[str, Answer], None]:
        def put(target: str, answer: Answer) -> None:
            now = self.loop.time()
            events = self.tracker.set_answer(target, side, answer, now)
            ignored: list[str] = []
            for s in self.sides.values():
                ignored.extend(s.ignored())
                for note in s.notes():
                    if note not in self.notes:
                        self.notes.append(note)
                        self.report.note(note)
            events += self.tracker.set_ignored(ignored, now)
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
                    if self.hostnames is not None:
                        self.hostnames.set_names(names)
                    self.ours_clusters.set()

        return changed

    def add_targets(self, targets: list[str]) -> None:
        new = [t for t in targets if self.tracker.add(t)]
        for side in self.sides.values():
            side.add(new)
        for watch in self.route_watches:
            watch.add(new)

    async def main(self, stop: asyncio.Event) -> int:
        args = self.args
        tasks = [asyncio.create_task(w.run(), name="cds") for w in self.watches]
        if self.hostnames is not None:
            tasks.append(asyncio.create_task(self.hostnames.run(), name="hostnames"))
        try:
            if args.all:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.connect_timeout):
                        await self.ours_clusters.wait()
                if not self.ours_clusters.is_set():
                    sys.stderr.write(f"meshbridge shadow: --all: no CDS answer from --ours "
                                     f"{args.ours}: {self.cds_status or 'no response'}\n")
                    return 2
                assert self.hostnames is not None
                # The pod authorities are part of the start's count; they follow ours'
                # EDS, which answers at once (a missing answer holds nothing up long).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.connect_timeout):
                        await self.hostnames.answered.wait()
            else:
                self.add_targets(read_targets(args.targets, args.cluster_domain))
            self.report.start({"api": args.api, "ours": args.ours, "theirs": args.theirs,
                               "targets": len(self.tracker.records),
                               "routes": bool(args.routes),
                               "xds": ("delta" if args.delta else "sotw")
                               if args.api == "xds" else None,
                               "grace_s": args.grace, "settle_s": args.settle})
            started = self.loop.time()
            tasks += [asyncio.create_task(s.run(), name=f"side {n}")
                      for n, s in self.sides.items()]
            tasks += [asyncio.create_task(w.run(), name="rds") for w in self.route_watches]
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
