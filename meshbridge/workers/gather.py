"""What the watcher's admin port shows adds up over the workers (docs/workers.md,
"Metrics and debug pages add up over workers").

`/metrics`: every worker's registry is read (its metric families, as
prometheus_client collects them) and merged with the watcher's own, series by
series: counters, gauges and histogram buckets with one name and one label set are
added, so a dashboard sees one process (streams, pushes, bytes, `grpc_server_*`,
the HTTP/2 server's, resident memory and CPU summed over the processes). A few
series describe one process and are the watcher's alone (its start time, its fd
limit, the interpreter). `/debug/streams` and `/debug/syncz` list every worker's
streams beside the watcher's (each worker numbers its streams in a range of its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric

# Series that say something of one process, not a quantity: the watcher's are kept.
_FIRST_ONLY = frozenset({"process_start_time_seconds", "process_max_fds", "python_info"})


def merge_families(groups: Iterable[Iterable[Metric]]) -> list[Metric]:
    """The families of several registries as one: a series present in several is
    their sum (the first group's value for `_FIRST_ONLY` families and `_created`
    samples)."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], int]] = {}
    for families in groups:
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation,
                                                    family.type, family.unit)
                values[family.name] = {}
            index = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                at = index.get(key)
                if at is None:
                    index[key] = len(into.samples)
                    into.samples.append(sample)
                elif family.name not in _FIRST_ONLY and not sample.name.endswith("_created"):
                    old = into.samples[at]
                    into.samples[at] = old._replace(value=old.value + sample.value)
    return list(merged.values())


class Families:
    """Metric families as a registry is read (`collect`), for the exposition."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families
