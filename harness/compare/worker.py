"""The measuring clients of one model of `meshbridge compare`, in a process of their own.

`python -m harness.compare.worker CONFIG.json` runs them so that the server's CPU
seconds and memory are the server's alone, and `compare` starts one such process per
model, so that one model's decoding never delays another's messages (a process
decodes one message at a time). It talks to its parent in JSON lines:

    stdin   {"cmd": "connect", "model": "linkerd"}   open that model's clients, wait
                                                     for every initial snapshot
            {"cmd": "await", "truth": {target: digest},   wait (up to timeout s) until
             "timeout": s}                           every client holds that truth
            {"cmd": "stop"}                          close everything, write results
    stdout  {"event": "connected", "model": ..., "pid": ..., "missing": [...], ...}
            {"event": "progress", "counts": {model: [messages, bytes]}}
            {"event": "at_truth", "ok": ..., "behind": [...]}
            {"event": "done"}

Each message a client decodes becomes one record (model, client, at_ns, size, kind,
[[target, address digest], ...]); the records and every client's final state are
written to the config's `results` path when told to stop. Times are
`time.monotonic_ns()`, which on Linux is one clock for every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from harness.clients import LinkerdClient, Received, XdsClient
from harness.compare.leds import OPT_IN_KEY as LEDS_OPT_KEY
from harness.compare.leds import LedsClient
from harness.normalize import NormalEndpoint, State, digest, from_cla
from meshbridge import gctune

PROGRESS_PERIOD = 0.1
LEDS_NEVER = "never"  # the server's opt-out: EDS with endpoints inline
CACHE_LIMIT = 4096


class ClaStates:
    """ClusterLoadAssignment -> state, shared by every xDS client of the process.

    Each client still receives and parses its own messages; this only spares the
    harness normalising the same resource once per client (a hundred clients of
    one service get identical bytes), so that the client process, not the server,
    is never what a latency measures. Keyed by the resource's bytes, so it cannot
    return another resource's state."""

    def __init__(self) -> None:
        self._states: dict[bytes, State] = {}

    def __call__(self, cla: Any) -> State:
        key = cla.SerializeToString(deterministic=True)
        state = self._states.get(key)
        if state is None:
            if len(self._states) >= CACHE_LIMIT:
                self._states.clear()
            state = self._states[key] = from_cla(cla)
        return state


class Digests:
    """Address digests of states, remembered for states seen again."""

    def __init__(self) -> None:
        self._digests: dict[State, str] = {}

    def __call__(self, state: State) -> str:
        d = self._digests.get(state)
        if d is None:
            if len(self._digests) >= CACHE_LIMIT:
                self._digests.clear()
            d = self._digests[state] = digest(state)
        return d


def channel_options() -> list[tuple[str, Any]]:
    # A private subchannel pool gives every client its own TCP connection, as separate
    # proxies would have; otherwise grpc shares one connection per target.
    # No BDP probes: grpc's C core answers a burst of received data with a PING to
    # estimate the bandwidth-delay product, which the server must read and ACK. That
    # is this client library's habit, not the protocols' (Envoy does not probe, nor do
    # the benchmarks' lean clients), and at one small message per change it cost the
    # server ~0.5 ms per change over five Get streams (docs/compare.md).
    return [("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.http2.bdp_probe", 0)]


def state_digest(state: State) -> str:
    return digest(state)


def full_digest(state: State) -> str:
    return digest(state, fields="all")


def endpoint_row(e: NormalEndpoint) -> list[Any]:
    return [e.address, e.port, e.weight, e.identity, e.hint, e.opaque_transport, e.zone,
            e.locality, e.health]


Client = LinkerdClient | XdsClient | LedsClient


@dataclass(slots=True)
class Tally:
    messages: int = 0
    bytes: int = 0


@dataclass(slots=True)
class Worker:
    server: str
    specs: list[dict[str, Any]]
    results: Path
    connect_timeout: float
    records: list[list[Any]] = field(default_factory=list)
    tallies: dict[str, Tally] = field(default_factory=dict)
    clients: list[Client] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    _last_progress: dict[str, list[int]] = field(default_factory=dict)
    cla_states: ClaStates = field(default_factory=ClaStates)
    digests: Digests = field(default_factory=Digests)

    def observe(self, r: Received) -> None:
        pairs = ([[t, d] for t, d in r.digests] if r.digests is not None
                 else [[t, self.digests(s)] for t, s in r.states])
        self.records.append([r.model, r.client, r.at_ns, r.size, r.kind, pairs])
        t = self.tallies.setdefault(r.model, Tally())
        t.messages += 1
        t.bytes += r.size

    async def connect(self, model: str) -> dict[str, Any]:
        started = time.monotonic_ns()
        mine: list[Client] = []
        for spec in self.specs:
            if spec["model"] != model:
                continue
            channel = grpc.aio.insecure_channel(self.server, options=channel_options())
            self.channels.append(channel)
            client: Client
            if model == "linkerd":
                client = LinkerdClient(channel, spec["targets"], spec["index"],
                                       observe=self.observe, snapshots=False)
            elif model == "leds":
                client = LedsClient(channel, spec["targets"], spec["index"],
                                    node_id=f"compare-{model}-{spec['index']}",
                                    observe=self.observe)
            else:
                client = XdsClient(channel, spec["targets"], spec["index"],
                                   delta=model == "delta",
                                   node_id=f"compare-{model}-{spec['index']}",
                                   observe=self.observe, normalize=self.cla_states)
                if model == "delta":
                    # The delta model measures EDS: whole CLAs whatever the service's
                    # size, not the LEDS a server may switch big services to.
                    client.node.metadata.update({LEDS_OPT_KEY: LEDS_NEVER})
            mine.append(client)
            self.tasks.append(asyncio.create_task(client.run(), name=f"{model}-{spec['index']}"))
        self.clients.extend(mine)
        deadline = time.monotonic() + self.connect_timeout
        for client in mine:
            events = (list(client.first_message.values()) if isinstance(client, LinkerdClient)
                      else [client.all_received])
            for ev in events:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ev.wait(), max(0.0, deadline - time.monotonic()))
        missing: list[str] = []
        errors: list[str] = []
        for client in mine:
            for target in client.targets:
                st = client.state[target]
                status = st.status if isinstance(client, LinkerdClient) else client.status
                if status:
                    errors.append(f"{model}-{client.client_id} {target}: stream ended "
                                  f"({status})")
                elif isinstance(client, LinkerdClient):
                    if not client.first_message[target].is_set():
                        missing.append(f"{model}-{client.client_id} {target}")
                elif isinstance(client, LedsClient):
                    if not client.complete(target):
                        missing.append(f"{model}-{client.client_id} {target}")
                elif target not in client.received:
                    missing.append(f"{model}-{client.client_id} {target}")
        return {"event": "connected", "model": model, "pid": os.getpid(),
                "missing": missing[:20],
                "missing_count": len(missing), "errors": errors[:20],
                "error_count": len(errors),
                "seconds": (time.monotonic_ns() - started) / 1e9}

    def behind(self, truth: dict[str, str]) -> list[str]:
        """Clients whose state for a target is not `truth`'s (address digests)."""
        out = []
        for client in self.clients:
            for target in client.targets:
                want = truth.get(target)
                st = client.state.get(target)
                have = st.digest() if st is not None else state_digest(frozenset())
                if want is not None and have != want:
                    out.append(f"{client.model}-{client.client_id} {target}")
        return out

    async def await_truth(self, truth: dict[str, str], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        behind = self.behind(truth)
        while behind and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # polling with a deadline, as the parent's settle
            behind = self.behind(truth)
        return {"event": "at_truth", "ok": not behind, "behind": behind[:20]}

    def progress(self) -> dict[str, Any] | None:
        counts = {m: [t.messages, t.bytes] for m, t in self.tallies.items()}
        if counts == self._last_progress:
            return None
        self._last_progress = counts
        return {"event": "progress", "counts": counts, "at_ns": time.monotonic_ns()}

    async def stop(self) -> None:
        for client in self.clients:
            if isinstance(client, XdsClient | LedsClient):
                await client.close()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for channel in self.channels:
            await channel.close(grace=None)
        self.write_results()

    def write_results(self) -> None:
        states: dict[str, list[list[Any]]] = {}
        finals: list[dict[str, Any]] = []
        for client in self.clients:
            model = client.model
            targets: dict[str, Any] = {}
            for target in client.targets:
                st = client.state.get(target)
                state: State = st.state() if st is not None else frozenset()
                full = full_digest(state)
                states.setdefault(full, [endpoint_row(e) for e in sorted(state)])
                status = (st.status if isinstance(client, LinkerdClient) and st is not None
                          else getattr(client, "status", ""))
                targets[target] = {"addr": state_digest(state), "full": full,
                                   "endpoints": len(state), "status": status}
            final = {"model": model, "index": client.client_id, "targets": targets,
                     "messages": client.messages, "bytes": client.bytes,
                     "nacks": getattr(client, "nacks", 0)}
            if isinstance(client, LedsClient):
                final["leds"] = {"collections": len(client.collections),
                                 "resources": client.leds_resources,
                                 "removed": client.leds_removed,
                                 "cla_updates": client.cla_updates}
            finals.append(final)
        cpu = time.process_time()
        body = {"records": self.records, "finals": finals, "states": states,
                "cpu_seconds": cpu, "pid": os.getpid()}
        tmp = self.results.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, separators=(",", ":")), encoding="utf-8")
        tmp.replace(self.results)


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def commands() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def report_progress(worker: Worker) -> None:
    while True:
        await asyncio.sleep(PROGRESS_PERIOD)  # a reporting period, not synchronisation
        msg = worker.progress()
        if msg is not None:
            emit(msg)


async def main_async(config_path: Path) -> int:
    config = json.loads(config_path.read_text(encoding="utf-8"))
    worker = Worker(config["server"], config["clients"], Path(config["results"]),
                    float(config.get("connect_timeout", 30.0)))
    reader = await commands()
    reporter = asyncio.create_task(report_progress(worker))
    try:
        while True:
            line = await reader.readline()
            if not line:  # the parent went away: stop without results
                return 1
            cmd = json.loads(line)
            if cmd["cmd"] == "connect":
                reply = await worker.connect(cmd["model"])
                # The clients just set up live until the end: keep the collector off
                # them, so that its pauses are not what the latencies measure.
                gctune.settle_heap()
                emit(reply)
            elif cmd["cmd"] == "await":
                emit(await worker.await_truth(cmd["truth"], float(cmd["timeout"])))
            elif cmd["cmd"] == "stop":
                reporter.cancel()
                final = worker.progress()
                if final is not None:
                    emit(final)
                await worker.stop()
                emit({"event": "done"})
                return 0
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.compare.worker CONFIG.json", file=sys.stderr)
        return 2
    return asyncio.run(main_async(Path(argv[0])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
