"""EDS: a ClusterLoadAssignment per service-port name, from the shared Views.

* Naming: the service port's authority `<svc>.<ns>.svc.<domain>:<port>`, or
  `<hostname>.<svc>...` for one StatefulSet pod; spelled canonically, so that each
  View has one name. The client's node (node metadata NODE_NAME) picks the View of
  that name, as a Linkerd context token's nodeName does.
* Wildcard: none (§1.5).
* Unknown name: for a SotW client a name that is a service-port authority always has
  a CLA — empty while the service has no endpoints, does not exist (yet) or cannot be
  watched (ExternalName) — so a client is never left waiting on an EDS name (§1.10).
  A delta client is told the truth (§2.1): a service that exists without endpoints
  has an empty CLA, one that does not exist (deleted, not yet created, ExternalName)
  has none, and its name goes in `removed_resources`; when it is (re)created, its CLA
  is sent again. A name that is no service-port authority never exists: nothing is
  sent for it.
* LEDS (§7): a delta client that asks for it (node metadata `meshbridge.io/leds:
  "always"`), or whose View has at least `leds_threshold` endpoints (unless it says
  `"never"`), gets the CLA whose localities name LEDS collections instead
  (`caches/leds.py` serves their members, from the same CLA assembly).

Each watched View carries one `ClaState` (a value the View derives and advances
itself with every version, `bridge.views.derived`): its CLA kept assembled
(`xds_api/assembly.py`), moved by each version's delta, and the CLA encoded at most
once per version for every stream. A watched name is an `EndpointWatch`: the View's
subscriber on the stream's behalf, parsed once when first watched, and handed the
View's `ClaState` on every version, from which its stream's next reply takes the
encoded CLA (no lookup of the View, no check of whether it is current).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from bridge.authority import view_authority
from bridge.model import EndpointId, FilterKey, ServiceKey, ViewKey
from bridge.views import (
    Derivation,
    InvalidService,
    View,
    ViewChange,
    ViewRegistry,
    ViewSubscriber,
)
from xds_api import resource_types as rt
from xds_api.assembly import ClaAssembly
from xds_api.caches.type_cache import Version, Watcher
from xds_api.metrics import XdsMetrics
from xds_api.names import leds_collection, parse_resource_name
from xds_api.resources import (
    ISTIO_METADATA,
    LINKERD_ENCODER,
    EncodedResource,
    MetadataEncoder,
    encode_leds_cla_body,
    encode_resource,
)
from xds_api.subscription import LEDS_ALWAYS, LEDS_NEVER, Subscription

# Endpoints in a View from which a delta client gets LEDS without asking (0: never).
DEFAULT_LEDS_THRESHOLD = 1000


class ViewWatch(ViewSubscriber, Protocol):
    """A stream's watch of one name through a View (EDS names, LEDS collections)."""

    key: ViewKey
    view: View | None
    watcher: Watcher

    @property
    def name(self) -> str:
        """The resource name watched (an EDS name, a LEDS collection)."""

    def joined(self, view: View) -> None:
        """The watch joined `view` (its subscription succeeded): take what it is due."""


W = TypeVar("W", bound=ViewWatch)


class SubWatches(Generic[W]):
    """Each subscription's watches by name. A subscription watching one name (nearly
    every EDS stream) is mapped to its watch itself, not to a dict of one: a dict per
    idle stream was ~0.2 KiB of it."""

    __slots__ = ("_by_sub",)

    def __init__(self) -> None:
        self._by_sub: dict[Subscription, W | dict[str, W]] = {}

    def get(self, sub: Subscription, name: str) -> W | None:
        found = self._by_sub.get(sub)
        if found is None or isinstance(found, dict):
            return None if found is None else found.get(name)
        return found if found.name == name else None

    def of(self, sub: Subscription) -> list[W]:
        found = self._by_sub.get(sub)
        if found is None or isinstance(found, dict):
            return [] if found is None else list(found.values())
        return [found]

    def add(self, sub: Subscription, watch: W) -> None:
        """Add `watch` (of a name `sub` does not watch yet)."""
        found = self._by_sub.get(sub)
        if found is None:
            self._by_sub[sub] = watch
        elif isinstance(found, dict):
            found[watch.name] = watch
        else:
            self._by_sub[sub] = {found.name: found, watch.name: watch}

    def pop(self, sub: Subscription, name: str) -> W | None:
        found = self._by_sub.get(sub)
        if found is None:
            return None
        if not isinstance(found, dict):
            if found.name != name:
                return None
            del self._by_sub[sub]
            return found
        watch = found.pop(name, None)
        if len(found) == 1:
            self._by_sub[sub] = next(iter(found.values()))
        elif not found:
            del self._by_sub[sub]
        return watch


def drop_watches(views: ViewRegistry, watches: SubWatches[W],
                 blocked: dict[ServiceKey, set[W]], sub: Subscription,
                 names: Iterable[str]) -> None:
    """End `sub`'s watches of `names`: leave the View each joined, or the set of
    watches waiting for their service to become watchable."""
    for name in names:
        watch = watches.pop(sub, name)
        if watch is None:
            continue
        if watch.view is not None:
            views.unsubscribe(watch.key, watch)
            continue
        waiting = blocked.get(watch.key.service)
        if waiting is not None:
            waiting.discard(watch)
            if not waiting:
                del blocked[watch.key.service]


def retry_blocked(views: ViewRegistry, blocked: dict[ServiceKey, set[W]],
                  services: Iterable[ServiceKey], type_url: str) -> None:
    """Subscribe the waiting watches of `services` whose service can be watched now,
    and tell each one's stream that its name changed (in name order)."""
    for svc in services:
        waiting = blocked.get(svc)
        if not waiting:
            continue
        for watch in sorted(waiting, key=lambda w: w.name):
            try:
                watch.joined(views.subscribe(watch.key, watch, watch.watcher.protocol))
            except InvalidService:
                continue
            waiting.discard(watch)
            watch.watcher.resource_changed(type_url, watch.name)
        if not waiting:
            del blocked[svc]


class EndpointWatch:
    """One EDS name watched by one stream: the View's subscriber on its behalf."""

    __slots__ = ("cache", "key", "name", "state", "sub", "view", "watcher")

    def __init__(self, cache: EndpointCache, sub: Subscription, name: str, key: ViewKey,
                 watcher: Watcher) -> None:
        self.cache = cache
        self.sub = sub
        self.name = name
        self.key = key
        self.watcher = watcher
        # None while the service cannot be watched (ExternalName): retried when a
        # cluster change touches it.
        self.view: View | None = None
        self.state: ClaState | None = None  # the View's CLA, at the View's version

    def joined(self, view: View) -> None:
        self.view = view
        self.state = view.derived(self.cache.clas)

    @property
    def weight(self) -> int:
        """How many client streams this watch stands for (a worker's feed: many)."""
        return getattr(self.watcher, "weight", 1)

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.joined(view)
        self.watcher.endpoints_changed(self.name, view)

    def resource(self) -> EncodedResource | None:
        """What the stream is due for this name now: the View's CLA as its variant
        gets it, encoded at most once per version for every watch (§2.1, §7)."""
        view, state, sub = self.view, self.state, self.sub
        if view is None or state is None:
            # ExternalName: no endpoints, and no EDS cluster either.
            return None if sub.delta else self.cache.empty_cla(self.name)
        if sub.delta and not view.exists:
            return None  # §2.1: deleted (or not created yet) is not "no endpoints"
        # SotW never gets LEDS (§7): not asked, per stream.
        return state.leds_cla() if sub.delta and self.cache.uses_leds(sub, view) \
            else state.cla()


class ClaState:
    """One View's ClusterLoadAssignment under one EndpointCache: its assembly, moved
    by each version's delta alone (O(change)), and the CLA, plain and for LEDS
    clients, each encoded at most once per version whatever the number of streams."""

    __slots__ = ("__weakref__", "_cache", "_cla", "_leds_cla", "assembly", "name")

    def __init__(self, cache: EndpointCache, view: View) -> None:
        self._cache = cache
        self.name = view_authority(view.key, cache.cluster_domain)
        self.assembly = ClaAssembly(cache.draining, cache.metadata)
        self.assembly.rebuild(view.snapshot.values(), view.version)
        self._cla: EncodedResource | None = None
        self._leds_cla: EncodedResource | None = None

    def advance(self, change: ViewChange) -> None:
        self.assembly.apply(change.added, change.removed, change.current, change.version)
        self._cla = self._leds_cla = None

    def cla(self) -> EncodedResource:
        if self._cla is None:
            self._cla = self._cache.counted(self.assembly.resource(self.name))
        return self._cla

    def leds_cla(self) -> EncodedResource:
        """The CLA for LEDS clients: one collection per locality (§7.2)."""
        if self._leds_cla is None:
            name = self.name
            body = encode_leds_cla_body(name, sorted(self.assembly.runs),
                                        lambda locality: leds_collection(name, locality))
            self._leds_cla = self._cache.counted(encode_resource(rt.ENDPOINT, name, body))
        return self._leds_cla


class EndpointCache:
    type_url = rt.ENDPOINT
    full_state = False

    def __init__(self, views: ViewRegistry, cluster_domain: str, prefix: str, *,
                 draining: bool, metrics: XdsMetrics,
                 metadata: MetadataEncoder = LINKERD_ENCODER,
                 leds_threshold: int = DEFAULT_LEDS_THRESHOLD) -> None:
        self.views = views
        self.cluster_domain = cluster_domain
        self.draining = draining
        self.metrics = metrics
        self.metadata = metadata
        self.leds_threshold = leds_threshold
        self._version = Version(prefix)
        # The names each subscription watches, and the View each is watched through.
        self._watches: SubWatches[EndpointWatch] = SubWatches()
        # Watches whose service cannot be subscribed to now (ExternalName).
        self._blocked: dict[ServiceKey, set[EndpointWatch]] = {}
        # Each watched View's CLA, kept by the View (`ClaState`); the set lets a pod
        # change reach the assemblies without holding a View alive.
        self.clas = Derivation("xds-cla", self._new_state)
        self._states: weakref.WeakSet[ClaState] = weakref.WeakSet()

    def version(self) -> str:
        return str(self._version)

    # ------------------------------------------------------------------ reading

    def get(self, name: str, node_name: str = "", *, delta: bool = False
            ) -> EncodedResource | None:
        """The CLA of `name` as a client on `node_name` would get it, watched or not;
        for a delta client, None when the service does not exist (§2.1)."""
        key = self._view_key(name, node_name)
        if key is None:
            return None
        view = self.views.view(key)
        if view is None:
            # Not subscribable (ExternalName) or not watched: no endpoints.
            if delta and not self._exists(key):
                return None
            return self.empty_cla(name)
        if delta and not view.exists:
            return None
        return self.cla_of(view)

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        watch = self._watches.get(sub, name)
        if watch is None:
            return self.get(name, sub.node_name, delta=sub.delta)
        return watch.resource()

    def views_of(self, sub: Subscription) -> list[View]:
        """The Views `sub`'s names are watched through."""
        return [w.view for w in self._watches.of(sub) if w.view is not None]

    def uses_leds(self, sub: Subscription, view: View) -> bool:
        """Whether this subscription gets the View's CLA as LEDS collections (§7)."""
        if not sub.delta or sub.leds == LEDS_NEVER:
            return False
        if sub.leds == LEDS_ALWAYS:
            return True
        return 0 < self.leds_threshold <= len(view.snapshot)

    def cla_of(self, view: View) -> EncodedResource:
        """The View's CLA (named as the View is), encoded at most once per View
        version for every stream."""
        return view.derived(self.clas).cla()

    def wildcard_names(self) -> Iterable[str]:
        return ()

    def covers(self, name: str) -> bool:
        return False

    def preview(self, view: View) -> EncodedResource:
        """The View's CLA encoded afresh and kept nowhere, for debug pages: reading
        it moves no version and no metric, and registers nothing on the View."""
        asm = ClaAssembly(self.draining, self.metadata)
        asm.rebuild(view.snapshot.values(), view.version)
        return asm.resource(view_authority(view.key, self.cluster_domain))

    def assembly_of(self, view: View) -> ClaAssembly:
        """The View's CLA assembly, at its current version."""
        return view.derived(self.clas).assembly

    def _new_state(self, view: View) -> ClaState:
        state = ClaState(self, view)
        self._states.add(state)
        return state

    def pods_changed(self, pods: Iterable[tuple[str, str]]) -> None:
        """Pods whose labels may have changed: the istio profile's metadata reads them
        even when the endpoint itself is unchanged, so look again at the next change."""
        if self.metadata.profile != ISTIO_METADATA:
            return
        for state in list(self._states):
            asm = state.assembly
            for ns, pod in pods:
                for family in ("IPv4", "IPv6", ""):
                    eid = EndpointId("pod", ns, pod, family)
                    if eid in asm.entries:
                        asm.rekey.add(eid)

    def empty_cla(self, name: str) -> EncodedResource:
        """The empty CLA of a name no View stands behind."""
        return self.counted(ClaAssembly(self.draining, self.metadata).resource(name))

    def counted(self, res: EncodedResource) -> EncodedResource:
        self._version.bump()
        self.metrics.serializations[rt.ENDPOINT].inc()
        return res

    def _exists(self, key: ViewKey) -> bool:
        # As the View would say: the Service is there and is not an ExternalName.
        svc = self.views.cluster.services.get(key.service)
        return svc is not None and svc.type != "ExternalName"

    def _view_key(self, name: str, node_name: str) -> ViewKey | None:
        key = parse_resource_name(name, self.cluster_domain)
        if key is None or not node_name:
            return key
        return ViewKey(key.service, key.port,
                       FilterKey(node_name=node_name, hostname=key.filter.hostname))

    # ------------------------------------------------------------------ watching

    def watch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        watches = self._watches
        for name in names:
            key = self._view_key(name, watcher.node_name)
            if key is None or watches.get(sub, name) is not None:
                continue  # names no service port: never exists, nothing to watch
            watch = EndpointWatch(self, sub, name, key, watcher)
            watches.add(sub, watch)
            try:
                watch.joined(self.views.subscribe(key, watch, watcher.protocol))
            except InvalidService:
                self._blocked.setdefault(key.service, set()).add(watch)

    def unwatch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        drop_watches(self.views, self._watches, self._blocked, sub, names)

    def watch_wildcard(self, watcher: Watcher) -> None:
        pass  # no wildcard for EDS: a subscription never asks for one

    def unwatch_wildcard(self, watcher: Watcher) -> None:
        pass

    def services_changed(self, services: Iterable[ServiceKey]) -> None:
        """Retry the blocked watches of these services: one may be watchable now."""
        retry_blocked(self.views, self._blocked, services, rt.ENDPOINT)
