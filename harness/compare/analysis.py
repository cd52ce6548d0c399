"""From what the clients received and what the truth was, the figures of each model.

Pure functions over plain data, so they are tested without a server.

Latency is truth-based: for every version of a target (recorded on the server with
the emission time of the change that caused it), the latency of one client is the
time from that emission to the first message after which the client's state for
the target equals that version's state. Matching walks each (client, target)
stream in order and takes, for each message, the latest version emitted before the
message was decoded whose state the client now holds, never going back (see
`match_stream`):

* a version the client passed over because a later one superseded it (the server
  coalesced them) is *superseded*, not late;
* a message whose state matches no version is *intermediate* (a Linkerd diff sent
  as `remove` then `add`) and is charged to the version it leads to;
* a version the client never reached, nor passed, is *missing*; one whose state
  equals the state the client already holds needs no message (*unchanged*).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.compare.truth import INITIAL, Emission, TruthVersion

# One decoded message, as the worker records it.
Record = Sequence[Any]  # [model, client, at_ns, size, kind, [[target, digest], ...]]


@dataclass(slots=True)
class StreamMatch:
    """The outcome of matching one (client, target) against the target's versions."""

    latencies_ns: list[int] = field(default_factory=list)
    latency_changes: list[int] = field(default_factory=list)  # the change of each latency
    delivered: int = 0
    superseded: int = 0
    missing: int = 0
    unchanged: int = 0
    intermediate: int = 0
    repeats: int = 0  # updates that left the client on the version it held
    # per update, the version index it reached (None: intermediate)
    reached: list[int | None] = field(default_factory=list)


def match_stream(versions: Sequence[TruthVersion],
                 updates: Sequence[tuple[int, str]]) -> StreamMatch:
    """Match one stream's updates (decode time, address digest), in order.

    Each update is assigned the *latest* version it can stand for: one emitted
    before it was decoded, with its state, and no later than what the updates
    after it are assigned (a backward pass). Taking the latest keeps a slow client
    from being charged from an older version whose state happened to recur (a pod
    flapping, a zone coming back); bounding by the next update keeps every update
    that can be explained explained."""
    out = StreamMatch()
    emitted = [v.at_ns for v in versions]
    by_digest: dict[str, list[int]] = defaultdict(list)
    for index, v in enumerate(versions):
        by_digest[v.digest].append(index)
    assigned: list[int | None] = [None] * len(updates)
    bound = len(versions) - 1
    for i in range(len(updates) - 1, -1, -1):
        at, d = updates[i]
        limit = min(bound, bisect.bisect_right(emitted, at) - 1)
        candidates = by_digest.get(d, ())
        pos = bisect.bisect_right(candidates, limit) - 1
        if pos >= 0:
            assigned[i] = candidates[pos]
            bound = candidates[pos]
    current = -1
    for (at, _), k in zip(updates, assigned, strict=True):
        out.reached.append(k)
        if k is None:
            out.intermediate += 1
        elif k == current:
            out.repeats += 1
        else:
            for skipped in range(current + 1, k):
                if versions[skipped].change != INITIAL:
                    out.superseded += 1
            if versions[k].change != INITIAL:
                out.delivered += 1
                out.latencies_ns.append(max(0, at - versions[k].at_ns))
                out.latency_changes.append(versions[k].change)
            current = k
    held = versions[current].digest if current >= 0 else None
    for k in range(current + 1, len(versions)):
        if versions[k].change == INITIAL:
            continue
        if versions[k].digest == held:
            out.unchanged += 1
        else:
            out.missing += 1
    return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


# Below this many samples the 99th percentile is one of the last one or two values,
# i.e. the max by another name: the report says "max of N" instead.
MIN_P99_SAMPLES = 100


def latency_summary(latencies_ns: Iterable[int]) -> dict[str, float | int | bool]:
    """p50 / p95 / p99 / max / mean in ms. `p99_enough` says whether the p99 stands on
    at least MIN_P99_SAMPLES samples; the p99 is kept either way for the JSON's
    readers (bench/), and the tables follow `p99_enough` (figures.p99_text)."""
    ms = sorted(x / 1e6 for x in latencies_ns)
    if not ms:
        return {"count": 0, "p99_enough": False}
    return {"count": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95),
            "p99": percentile(ms, 99), "max": ms[-1], "mean": sum(ms) / len(ms),
            "p99_enough": len(ms) >= MIN_P99_SAMPLES}


@dataclass(slots=True)
class ModelFigures:
    model: str
    clients: int = 0
    subscriptions: int = 0  # (client, target) pairs
    messages: int = 0
    bytes: int = 0
    snapshot_messages: int = 0
    snapshot_bytes: int = 0
    churn_messages: int = 0
    churn_bytes: int = 0
    target_updates: int = 0  # (message, target) pairs: one xDS response may carry many
    latencies_ns: list[int] = field(default_factory=list)
    latencies_by_pattern: dict[str, list[int]] = field(default_factory=dict)
    delivered: int = 0
    superseded: int = 0
    missing: int = 0
    unchanged: int = 0
    intermediate: int = 0
    repeats: int = 0
    versions_due: int = 0  # churn versions of the targets each client follows, summed
    bytes_by_change: dict[int, float] = field(default_factory=dict)
    messages_by_change: dict[int, float] = field(default_factory=dict)
    timeline: list[tuple[int, int]] = field(default_factory=list)  # churn (at_ns, size)


def analyse(
    records: Sequence[Record],
    truth: Mapping[str, Sequence[TruthVersion]],
    emissions: Sequence[Emission],
    churn_start_ns: int,
    subscriptions: Mapping[tuple[str, int], Sequence[str]],
) -> dict[str, ModelFigures]:
    """Every model's figures. `subscriptions` maps (model, client) to its targets."""
    figures: dict[str, ModelFigures] = {}
    for (model, _client), targets in subscriptions.items():
        f = figures.setdefault(model, ModelFigures(model))
        f.clients += 1
        f.subscriptions += len(targets)
        for t in targets:
            f.versions_due += sum(1 for v in truth.get(t, ()) if v.change != INITIAL)

    # Each (model, client, target) stream's updates, in decode order.
    streams: dict[tuple[str, int, str], list[tuple[int, str, int]]] = defaultdict(list)
    for i, rec in enumerate(records):
        model, client, at, size = rec[0], rec[1], rec[2], rec[3]
        f = figures.setdefault(model, ModelFigures(model))
        f.messages += 1
        f.bytes += size
        if at < churn_start_ns:
            f.snapshot_messages += 1
            f.snapshot_bytes += size
        else:
            f.churn_messages += 1
            f.churn_bytes += size
            f.timeline.append((at, size))
        for target, d in rec[5]:
            f.target_updates += 1
            streams[(model, client, target)].append((at, d, i))

    # Which changes each message served: from the versions its targets reached.
    served: dict[int, set[int]] = defaultdict(set)
    pattern_of = {e.index: e.pattern for e in emissions}
    for (model, _client, target), ups in streams.items():
        versions = truth.get(target)
        if not versions:
            continue
        m = match_stream(versions, [(at, d) for at, d, _ in ups])
        f = figures[model]
        f.latencies_ns.extend(m.latencies_ns)
        for change, ns in zip(m.latency_changes, m.latencies_ns, strict=True):
            f.latencies_by_pattern.setdefault(pattern_of.get(change, "?"), []).append(ns)
        f.delivered += m.delivered
        f.superseded += m.superseded
        f.missing += m.missing
        f.unchanged += m.unchanged
        f.intermediate += m.intermediate
        f.repeats += m.repeats
        pending: list[int] = []
        for (_, _, idx), k in zip(ups, m.reached, strict=True):
            if k is None:
                pending.append(idx)
                continue
            change = versions[k].change
            for p in (*pending, idx):
                served[p].add(change)
            pending.clear()

    emit_times = [e.at_ns for e in emissions]
    for i, rec in enumerate(records):
        model, at, size = rec[0], rec[2], rec[3]
        if at < churn_start_ns:
            continue
        changes = {c for c in served.get(i, ()) if c != INITIAL}
        if not changes and INITIAL in served.get(i, ()):
            continue  # a late part of a snapshot
        if not changes:
            # Served nothing we can tell: charge the latest change emitted before it.
            j = bisect.bisect_right(emit_times, at) - 1
            if j < 0:
                continue
            changes = {emissions[j].index}
        f = figures[model]
        share = 1.0 / len(changes)
        for c in changes:
            f.bytes_by_change[c] = f.bytes_by_change.get(c, 0.0) + size * share
            f.messages_by_change[c] = f.messages_by_change.get(c, 0.0) + share
    for f in figures.values():
        f.timeline.sort()
    return figures


def by_pattern(values: Mapping[int, float], emissions: Sequence[Emission]) -> dict[str, float]:
    """Mean of a per-change figure over the changes of each pattern (0 for none)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for e in emissions:
        sums[e.pattern] += values.get(e.index, 0.0)
        counts[e.pattern] += 1
    return {p: sums[p] / counts[p] for p in sorted(counts)}
