"""The kube source: each kind's state and changes from a real Kubernetes API, the way
an informer does.

One thread per kind runs the blocking watch loop and hands decoded events to the
asyncio loop (`call_soon_threadsafe`), so the loop never blocks on the network.
Credentials and requests are bridge/sources/kube_api.py's; what the API sends (its
protobuf for the built-in kinds, JSON for the others) becomes the mappings
`decode_object` reads through bridge/sources/kube_wire.py, so every object reaches
the decoders in the shape a manifest file has.

A big cluster's state never sits in memory as one document: the watch asks the
server to send the state first, object by object, up to a bookmark that marks its
end (WatchList, `sendInitialEvents`; served from the server's cache), and the same
stream then carries the changes. A server that cannot (before 1.27, or with the
feature off) is listed in pages (`limit`/`continue`), then watched.

Watch correctness, as client-go's reflector does it:
  * the state's resourceVersion carries into the watch; bookmarks are requested and
    only move that resourceVersion forward;
  * a server-side watch timeout is renewed silently from the last resourceVersion;
  * `410 Gone` reads the state again, and applies it as the real difference only
    (`Cluster.replace`), so no spurious remove/add reaches any stream;
  * disconnects retry with capped exponential backoff and full jitter; meanwhile the
    last-known state keeps being served and `stale` is true (so /ready says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import prometheus_client
import structlog

from bridge.cluster import Cluster, Event, EventType
from bridge.objects import (
    REMOTE_KUBECONFIG_SECRET_TYPE,
    KubeObject,
    ObjectError,
    decode_object,
    tombstone,
)
from bridge.sources import kube_wire
from bridge.sources.kube_api import (
    WATCH_TIMEOUT_RANGE as WATCH_TIMEOUT_RANGE,
)
from bridge.sources.kube_api import (
    ApiClient,
    ApiError,
    Credentials,
    Gone,
    load_credentials,
    watch_params,
)
from bridge.sources.kube_kinds import KINDS as KINDS
from bridge.sources.kube_kinds import POLICY_KINDS as POLICY_KINDS
from bridge.sources.kube_kinds import START_ORDER
from bridge.sources.kube_kinds import KindSpec as KindSpec

if TYPE_CHECKING:
    from bridge.sources.kube_relay import RelayedWatch
    from bridge.sources.route_status import RouteStatusWriter

log = structlog.get_logger("meshbridge.sources.kube")

LIST_PAGE = 500
# The annotation on the bookmark that ends a watch's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
BACKOFF_BASE, BACKOFF_CAP = 0.5, 30.0
FORBIDDEN_RETRY = 60.0  # an RBAC denial is retried, slowly, in case it is fixed
MISSING_CRD_RETRY = 300.0  # a CRD that is not installed is re-checked rarely
LAG_BUCKETS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000)


def watched_kinds(endpoints_api: str, link_namespace: str = "") -> list[KindSpec]:
    """What `--source kube` lists and watches; deploy/'s ClusterRole grants exactly this
    (and its Role the linked clusters' Secrets in `link_namespace`, when given)."""
    endpoints = "Endpoints" if endpoints_api == "endpoints" else "EndpointSlice"
    order = ["Node", "ReplicaSet", "Job", "Pod", "Server", "Service", endpoints,
             "ServiceProfile", *POLICY_KINDS]
    specs = [KINDS[k] for k in order]
    if link_namespace:
        specs.append(link_secrets(link_namespace))
    return specs


def link_secrets(namespace: str) -> KindSpec:
    """The linked clusters' credentials: Secrets of Linkerd's remote-kubeconfig type in
    the controller namespace, selected by type on the server, so no other Secret is
    ever sent here (docs/multicluster.md)."""
    return KindSpec("Secret", f"/api/v1/namespaces/{namespace}/secrets", "secrets", "",
                    optional=True, params=(("fieldSelector",
                                            f"type={REMOTE_KUBECONFIG_SECRET_TYPE}"),),
                    denied_hint="linked clusters' Secrets are not readable here: no cluster "
                                "is linked by Secret (deploy/multicluster/ grants it)")


class LagObserver(Protocol):
    """Where a watcher records how late it saw an update (a histogram)."""

    def observe(self, amount: float) -> None: ...


def backoff_delay(attempt: int) -> float:
    """Capped exponential backoff with full jitter (client-go's reflector)."""
    return random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt))


class NotOffered(Exception):
    """The API server cannot stream a watch's initial state: list it instead."""


def newest_update_time(raw: dict[str, Any]) -> float | None:
    """The newest managedFields time of an Update operation (Linkerd's informer lag)."""
    newest = None
    md = raw.get("metadata")
    fields = md.get("managedFields") if isinstance(md, dict) else None
    for f in fields if isinstance(fields, list) else ():
        if not isinstance(f, dict) or f.get("operation") != "Update":
            continue
        t: float | None = None
        if isinstance(f.get("time"), str):
            with contextlib.suppress(ValueError):
                t = datetime.fromisoformat(f["time"].replace("Z", "+00:00")).timestamp()
        elif isinstance(f.get("time"), int):  # from the protobuf encoding (kube_wire)
            t = float(f["time"])
        if t is not None and (newest is None or t > newest):
            newest = t
    return newest


class KindWatcher:
    """The reflector of one kind: list, then watch from the list's resourceVersion."""

    def __init__(self, spec: KindSpec, client: ApiClient, emit: Callable[[Any], None],
                 lag: LagObserver | None,
                 report: Callable[[str, str], None] | None = None) -> None:
        self.spec = spec
        self.client = client
        self.emit = emit
        self.lag = lag
        # Told (category, detail) of each failure instead of logging it, by an owner that
        # logs once per cause (a linked cluster's watches); None: log here.
        self.report = report
        self.stopping = threading.Event()
        self.connected = False
        # Not readable at all (CRD missing, access denied): served as empty, not stale.
        self.unavailable = False
        self.synced = False
        self.resource_version = ""
        self.relists = 0
        self.started_at = time.monotonic()
        # The kind's whole state is wanted (at start, after 410 Gone).
        self.need_state = True
        # Whether the server streams a watch's initial state: unknown until it says.
        self.watch_list: bool | None = None
        self._response: Any = None
        # The kind's first watch, already opened by a relay process (kube_relay: the
        # Pods' at start), taken instead of opening one.
        self.relayed: RelayedWatch | None = None
        self._failed = False  # since the last time the API answered
        self._update_times: dict[tuple[str, str], float] = {}
        self.thread = threading.Thread(target=self._run, name=f"watch-{spec.kind}", daemon=True)

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        relayed, self.relayed = self.relayed, None
        if relayed is not None:  # never taken: the watch loop is not waiting on it
            relayed.release_conn()
        resp = self._response
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()
            with contextlib.suppress(Exception):
                resp.release_conn()

    # -- the loop

    def _run(self) -> None:
        attempt = 0
        reported: str | None = None
        while not self.stopping.is_set():
            try:
                if self.need_state and self.watch_list is False:
                    self._list()
                    reported = None
                self._watch()  # returns when the server ends the watch: renew silently
                attempt = 0
                if not self.need_state:
                    reported = None
            except NotOffered as e:
                log.info("the API server does not stream initial state; listing in pages",
                         kind=self.spec.kind, reason=str(e))
                self.watch_list = False
            except Gone:
                log.info("watch expired; relisting", kind=self.spec.kind,
                         resource_version=self.resource_version)
                self.need_state = True
            except ApiError as e:
                attempt = self._lost(attempt)
                self._failed = True
                if e.status == 404 and self.spec.optional:
                    if reported != "missing":
                        if self.report is not None:
                            self.report("missing", f"{self.spec.kind}: not installed")
                        else:
                            log.warning("CRD not installed; will check again later",
                                        kind=self.spec.kind, path=self.spec.path)
                        reported = "missing"
                    self._settle_empty()
                    self.stopping.wait(MISSING_CRD_RETRY)
                elif e.status in (401, 403):
                    if reported != "forbidden":
                        if self.report is not None:
                            self.report("access_denied", f"{self.spec.kind}: HTTP {e.status}: "
                                                         f"{e.reason}")
                        elif self.spec.denied_hint:
                            log.info(self.spec.denied_hint, kind=self.spec.kind,
                                     path=self.spec.path, status=e.status)
                        else:
                            log.error("access denied; other kinds keep working",
                                      kind=self.spec.kind, status=e.status, reason=e.reason)
                        reported = "forbidden"
                    self._settle_empty()
                    self.stopping.wait(FORBIDDEN_RETRY)
                else:
                    attempt = self._back_off(attempt, str(e))
                self.need_state = self.need_state or not self.resource_version
            except Exception as e:  # network errors, truncated streams: retry
                if self.stopping.is_set():
                    return
                attempt = self._lost(attempt)
                self._failed = True
                attempt = self._back_off(attempt, f"{type(e).__name__}: {e}")

    def _lost(self, attempt: int) -> int:
        """The API is out of reach. A watch that connected since the last failure
        starts the back-off afresh: a new outage must not wait out the last one's
        growing delays (up to BACKOFF_CAP) after the server is back."""
        had_connected, self.connected = self.connected, False
        return 0 if had_connected else attempt

    def _settle_empty(self) -> None:
        """A kind we cannot read counts as listed-empty so readiness is not held hostage."""
        self.unavailable = True
        if not self.synced:
            self.emit(("replace", self.spec.kind, []))
            self.synced = True

    def _back_off(self, attempt: int, reason: str) -> int:
        delay = backoff_delay(attempt)
        if self.report is not None:
            self.report("unreachable", f"{self.spec.kind}: {reason}")
        else:
            log.warning("watch disconnected; retrying", kind=self.spec.kind, reason=reason,
                        retry_in=round(delay, 2))
        self.stopping.wait(delay)
        return attempt + 1

    def _list(self) -> None:
        """The state in pages (`limit`/`continue`), for a server that cannot stream it:
        only one page is ever held undecoded."""
        objs: list[KubeObject] = []
        params: dict[str, Any] = {"limit": LIST_PAGE, **dict(self.spec.params)}
        while True:
            resp = self.client.open(self.spec.path, params, read_timeout=60.0,
                                    accept=kube_wire.accept(self.spec.kind))
            try:
                page = kube_wire.decode_list(self.spec.kind, resp.read(),
                                             resp.headers.get("Content-Type"))
            finally:
                resp.release_conn()
            for raw in page.items:
                obj = self._decode(raw)
                if obj is not None:
                    objs.append(obj)
                    self._note_update_time(raw, observe=False)
            if not page.continue_token:
                self.resource_version = page.resource_version
                break
            params = {"limit": LIST_PAGE, "continue": page.continue_token,
                      **dict(self.spec.params)}
        self._replace(objs)

    def _replace(self, objs: list[KubeObject]) -> None:
        log.debug("state received", kind=self.spec.kind, objects=len(objs),
                  streamed=bool(self.watch_list), relist=self.relists,
                  seconds=round(time.monotonic() - self.started_at, 3))
        self.relists += 1
        self.need_state = False
        self.emit(("replace", self.spec.kind, objs))
        self.synced = True
        self._answered()

    def _answered(self) -> None:
        """The API answered again after failures: an owner that logs once per cause
        hears that the cause is gone."""
        if self._failed:
            self._failed = False
            if self.report is not None:
                self.report("recovered", self.spec.kind)

    def _watch(self) -> None:
        """One watch, renewed by the caller when the server ends it. While the state is
        needed, and unless the server has said it cannot, the watch asks the server to
        send the state first (`sendInitialEvents`, served from its cache) as ADDED
        events up to a bookmark that says so: the state arrives one object at a time,
        and the same stream then carries the changes."""
        timeout = random.randint(*WATCH_TIMEOUT_RANGE)
        initial: list[KubeObject] | None = [] if self.need_state else None
        params = watch_params(timeout, None if self.need_state else self.resource_version,
                              self.spec.params)
        relayed, self.relayed = self.relayed, None
        if relayed is not None and initial is None:  # not what it asked for: unused
            relayed.release_conn()
            relayed = None
        try:
            resp = self._open(params, timeout, relayed)
        except ApiError as e:
            if initial is not None and e.status in (400, 422):  # it cannot (or is older)
                raise NotOffered(e.reason) from e
            raise
        self._response = resp
        self.connected, self.unavailable = True, False
        self._answered()
        try:
            events = kube_wire.watch_events(self.spec.kind, resp.stream(65536),
                                            resp.headers.get("Content-Type"))
            for etype, raw in events:
                if self.stopping.is_set():
                    return
                if initial is None:
                    self._handle(etype, raw)
                elif etype == "ADDED":
                    obj = self._decode(raw)
                    if obj is not None:
                        initial.append(obj)
                        self._note_update_time(raw, observe=False)
                elif etype == "BOOKMARK" and _initial_events_end(raw):
                    self._track(raw)
                    self.watch_list = True
                    self._replace(initial)
                    initial = None
                    if resp is relayed:
                        # The relay is for the start-up: the changes are watched from
                        # here on, from the state's resourceVersion (`_run` renews).
                        return
                else:
                    self._handle(etype, raw)
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                resp.release_conn()

    def _open(self, params: dict[str, str], timeout: int, relayed: RelayedWatch | None,
              ) -> Any:
        if relayed is None:
            return self.client.open(self.spec.path, params, read_timeout=timeout + 30,
                                    accept=kube_wire.accept(self.spec.kind))
        self._response = relayed  # `stop` ends it while its answer is awaited
        try:
            return relayed.response()
        finally:
            self._response = None

    def _track(self, raw: dict[str, Any]) -> dict[str, Any]:
        md = raw.get("metadata") or {}
        if md.get("resourceVersion"):
            self.resource_version = str(md["resourceVersion"])
        return md

    def _handle(self, etype: str, raw: dict[str, Any]) -> None:
        if etype == "ERROR":
            if raw.get("code") == 410:
                raise Gone(str(raw.get("message", "")))
            raise ApiError(int(raw.get("code") or 0), str(raw.get("message", "")))
        md = self._track(raw)
        if etype == "BOOKMARK":
            return
        if etype == "DELETED":
            self._update_times.pop((md.get("namespace", ""), md.get("name", "")), None)
            obj = self._decode(raw, quiet=True) or tombstone(
                self.spec.kind, str(md.get("namespace", "")), str(md.get("name", "")))
            if obj is not None:
                self.emit(("event", Event(EventType.DELETED, obj)))
            return
        if etype not in ("ADDED", "MODIFIED"):
            return
        if etype == "MODIFIED":
            self._note_update_time(raw, observe=True)
        obj = self._decode(raw)
        if obj is None:
            # An object that became unusable (a pod that lost its IP) leaves the cache.
            gone = tombstone(self.spec.kind, str(md.get("namespace", "")),
                             str(md.get("name", "")))
            if gone is not None:
                self.emit(("event", Event(EventType.DELETED, gone)))
            return
        self.emit(("event", Event(EventType.ADDED if etype == "ADDED" else EventType.MODIFIED,
                                  obj)))

    def _decode(self, raw: Any, quiet: bool = False) -> KubeObject | None:
        try:
            return decode_object(raw, kind=self.spec.kind)
        except ObjectError as e:
            if not quiet:
                log.warning("API object skipped", kind=self.spec.kind, object=e.name,
                            reason=e.reason)
            return None

    def _note_update_time(self, raw: dict[str, Any], observe: bool) -> None:
        t = newest_update_time(raw)
        if t is None:
            return
        md = raw.get("metadata") or {}
        key = (str(md.get("namespace", "")), str(md.get("name", "")))
        if observe and self.lag is not None and self._update_times.get(key) != t:
            self.lag.observe(max(0.0, time.time() - t))
        self._update_times[key] = t


def _initial_events_end(raw: dict[str, Any]) -> bool:
    """The bookmark that ends a watch's initial state (the API's watch-list)."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(INITIAL_EVENTS_END) == "true")


class KubeSource:
    def __init__(self, kubeconfig: str | None = None, context: str | None = None,
                 endpoints_api: str = "endpointslices",
                 credentials: Credentials | None = None, route_status: bool = True,
                 link_namespace: str = "", kinds: list[KindSpec] | None = None) -> None:
        if endpoints_api not in ("endpointslices", "endpoints"):
            raise ValueError(f"--endpoints-api {endpoints_api!r}: endpointslices or endpoints")
        self.name = "kube"
        self.kubeconfig = kubeconfig
        self.context = context
        self.endpoints_api = endpoints_api
        # Where linked clusters' Secrets are read from ("": none are).
        self.link_namespace = link_namespace
        # What to watch instead of what serving needs (a controller that reads less).
        self.kinds = kinds
        self._credentials = credentials
        # --route-status: write each route's status.parents entries (Routes §6).
        self.route_status = route_status
        self.status_writer: RouteStatusWriter | None = None
        self.watchers: list[KindWatcher] = []
        self._metrics: prometheus_client.CollectorRegistry | None = None
        self._client: ApiClient | None = None
        self._handoff: _Handoff | None = None

    def register_metrics(self, registry: prometheus_client.CollectorRegistry) -> None:
        self._metrics = registry

    def credentials(self) -> Credentials:
        """The credentials this source uses (blocking: it may read a kubeconfig)."""
        return self._credentials or load_credentials(self.kubeconfig, self.context)

    @property
    def stale(self) -> bool:
        return any(w.synced and not w.connected and not w.unavailable for w in self.watchers)

    def start_watches(self, relayed: Mapping[str, RelayedWatch] | None = None) -> None:
        """Open every kind's watch now, before the rest of the server is built (with the
        credentials given; no event loop needed): the API server streams the state
        while the process goes on importing and starting, and what arrives waits,
        decoded, until `run` hands it to the Cluster. A source never started this way
        starts its watches in `run`. `relayed`: first watches already opened by a relay
        process (kube_relay), by kind; one of a kind not watched is ended."""
        relayed = dict(relayed or {})
        try:
            if self._handoff is not None:
                return
            if self._credentials is None:
                raise RuntimeError("start_watches needs the credentials given")
            self._begin(self._credentials, relayed)
        finally:
            for unused in relayed.values():
                unused.release_conn()

    def _begin(self, creds: Credentials,
               relayed: dict[str, RelayedWatch] | None = None) -> None:
        client = ApiClient(creds)
        self._client = client
        self._handoff = _Handoff()
        specs = self.kinds or watched_kinds(self.endpoints_api, self.link_namespace)
        self.watchers = [KindWatcher(s, client, self._handoff.emit, None) for s in specs]
        for w in self.watchers:
            w.relayed = (relayed or {}).pop(w.spec.kind, None)
        # The biggest states first: a thread's start waits for the GIL, which the
        # threads already reading hold for a switch interval each.
        for w in sorted(self.watchers, key=lambda w: START_ORDER.get(w.spec.kind, 99)):
            w.start()

    def close(self) -> None:
        """Stop the watches (those `start_watches` opened for a `run` that never came)."""
        for w in self.watchers:
            w.stop()

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None:
        if self._handoff is None:
            creds = self._credentials
            if creds is None:
                creds = await asyncio.to_thread(load_credentials, self.kubeconfig,
                                                self.context)
            self._begin(creds)
        handoff, client = self._handoff, self._client
        assert handoff is not None and client is not None
        specs = [w.spec for w in self.watchers]
        log.info("watching the Kubernetes API", host=client.creds.host,
                 kinds=[s.kind for s in specs])
        self._cache_gauges(specs, cluster)
        for w in self.watchers:
            w.lag = self._lag_histogram(w.spec)
        failed = handoff.attach(cluster, synced, {s.kind for s in specs})
        # Imported here: the watches open before the routes' modules are needed.
        from bridge.routes.index import ROUTE_STORE_KINDS
        from bridge.sources.route_status import RouteStatusWriter

        writer_task: asyncio.Task[None] | None = None
        # Statuses are written only for routes this source watches (a source told to
        # watch other kinds, as a linked cluster's or the mirror's, writes none).
        if self.route_status and any(s.kind in ROUTE_STORE_KINDS for s in specs):
            self.status_writer = RouteStatusWriter(
                client, cluster, {k: KINDS[k].path for k in ROUTE_STORE_KINDS})

            async def write_after_sync(writer: RouteStatusWriter) -> None:
                await synced.wait()  # statuses from the whole initial list, not a part
                await writer.run()

            writer_task = asyncio.create_task(write_after_sync(self.status_writer))
        try:
            await failed  # runs until cancelled, or an apply raises
        finally:
            handoff.closed = True
            self.close()
            self._handoff = None  # a later run starts afresh
            if writer_task is not None:
                writer_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer_task
            if self.status_writer is not None:
                self.status_writer.close()

    def _lag_histogram(self, spec: KindSpec) -> prometheus_client.Histogram | None:
        return None if self._metrics is None else lag_histogram(self._metrics, spec)

    def _cache_gauges(self, specs: list[KindSpec], cluster: Cluster) -> None:
        """Cache sizes, counted when scraped: never on the path of an event."""
        if self._metrics is None:
            return
        for s in specs:
            gauge = cache_size_gauge(self._metrics, s)
            if gauge is not None:
                gauge.labels(cluster.name).set_function(functools.partial(_count, cluster, s.kind))


# Linkerd's informer metrics are one family per kind, shared by every cluster's watchers
# (the local one and each linked one, told apart by the `cluster` label of the cache
# sizes): made once per registry, whoever asks first.
_FAMILIES: weakref.WeakKeyDictionary[prometheus_client.CollectorRegistry,
                                     dict[str, Any]] = weakref.WeakKeyDictionary()


def lag_histogram(registry: prometheus_client.CollectorRegistry,
                  spec: KindSpec) -> prometheus_client.Histogram:
    """Linkerd's `<kind>_informer_lag_seconds` (no cluster label, as in Linkerd)."""
    name = f"{spec.lag_metric}_informer_lag_seconds"
    families = _FAMILIES.setdefault(registry, {})
    if name not in families:
        families[name] = prometheus_client.Histogram(
            name, f"Delay between a {spec.kind} update and this informer seeing it",
            buckets=LAG_BUCKETS, registry=registry)
    histogram: prometheus_client.Histogram = families[name]
    return histogram


def cache_size_gauge(registry: prometheus_client.CollectorRegistry,
                     spec: KindSpec) -> prometheus_client.Gauge | None:
    """Linkerd's `<kind>_cache_size{cluster}`; None for a kind Linkerd has none of."""
    if not spec.cache_metric:
        return None
    name = f"{spec.cache_metric}_cache_size"
    families = _FAMILIES.setdefault(registry, {})
    if name not in families:
        families[name] = prometheus_client.Gauge(
            name, f"Number of {spec.kind} objects in the cache", ["cluster"],
            registry=registry)
    gauge: prometheus_client.Gauge = families[name]
    return gauge


def _count(cluster: Cluster, kind: str) -> float:
    return len(cluster.objects(kind))


class _Handoff:
    """Watch threads -> the loop, with nothing in between: the first event of a burst
    schedules one drain callback (`call_soon_threadsafe`, which wakes the loop at once)
    and the events that arrive before it runs join that batch. The drain applies them
    to the Cluster itself, so an event costs one loop wake-up, not a queue hop into a
    task that must be scheduled again, and no timer ever holds one back."""

    def __init__(self) -> None:
        # Until `attach` gives the loop and the Cluster, what the watches send waits in
        # `_items` (the watches may open before the server is built: `start_watches`).
        self.loop: asyncio.AbstractEventLoop | None = None
        self.cluster: Cluster | None = None
        self.pending: set[str] = set()  # kinds whose first list is not applied yet
        self.synced: asyncio.Event | None = None
        self.closed = False
        # An apply that raises ends the source's task (its owner sees it), as it would
        # if the apply ran in that task.
        self.failed: asyncio.Future[None] | None = None
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._held: list[Any] = []  # what came before every kind's state was in
        self._scheduled = False

    def attach(self, cluster: Cluster, synced: asyncio.Event,
               pending: set[str]) -> asyncio.Future[None]:
        """From now on apply to `cluster` on the running loop, what waited first. The
        future is done when an apply raises."""
        loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        self.synced, self.pending = synced, pending
        with self._lock:
            self.loop, self.cluster = loop, cluster
            if self._scheduled or not self._items:
                return self.failed
            self._scheduled = True
        loop.call_soon(self._drain)
        return self.failed

    def emit(self, item: Any) -> None:
        """Called on a watch thread."""
        with self._lock:
            self._items.append(item)
            if self._scheduled or self.loop is None:
                return
            self._scheduled = True
            loop = self.loop
        with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batch, self._items, self._scheduled = self._items, [], False
        failed = self.failed
        if self.closed or failed is None or failed.done():
            return
        try:
            self._apply(batch)
        except Exception as e:  # the owner of the source's task sees it
            failed.set_exception(e)

    def _apply(self, batch: list[Any]) -> None:
        cluster = self.cluster
        assert cluster is not None  # drained only once attached
        if self.synced is not None and not self.synced.is_set():
            # Until every kind's state is in, nothing is served (not ready), and each
            # kind applied alone would have the listeners rebuild what the next kind
            # changes again: the states are applied together, as one change.
            self._held.extend(batch)
            self.pending.difference_update(i[1] for i in batch if i[0] == "replace")
            if self.pending:
                return
            batch, self._held = self._held, []
        events: list[Event] = []
        kinds: set[str] = set()  # of the events gathered
        for item in batch:
            if item[0] == "event":
                events.append(item[1])
                kinds.add(item[1].obj.kind)
                continue
            _, kind, objs = item
            if kind in kinds:  # its state is read against what the events before did
                cluster.apply(events)
                events, kinds = [], set()
            events.extend(cluster.replace_events(kind, objs))
            kinds.add(kind)
            self.pending.discard(kind)
        if events:
            cluster.apply(events)
        if not self.pending and self.synced is not None and not self.synced.is_set():
            log.info("initial list applied", **cluster.counts())
            self.synced.set()
