"""`--route-status`: the kube source writes each route's `status.parents` entries for
meshbridge (Routes §6), beside those of any other controller (Linkerd's
`linkerd.io/policy-controller` among them), which it leaves as they are.

The entries are computed from the same route tables the clients are served
(bridge.routes.status) whenever a route or a Service changes, and written only when
they differ from what the object already says, so that the watch event a write causes
settles at once. A write is a JSON merge patch of the `/status` subresource carrying
the `resourceVersion` it was computed from: a conflict is retried on the next round
with fresh data, and no other controller's entry is ever overwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any

import structlog

from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.routes.index import ROUTE_STORE_KINDS, route_index
from bridge.routes.objects import Route
from bridge.routes.status import CONTROLLER_NAME, route_status, same_status, status_json

log = structlog.get_logger("meshbridge.routes.status")

RouteKey = tuple[str, str, str]  # (store kind, namespace, name)


class RouteStatusWriter:
    def __init__(self, client: Any, cluster: Cluster, paths: dict[str, str]) -> None:
        """`client`: the kube source's ApiClient; `paths`: each route store kind's
        collection path (`/apis/<group>/<version>/<plural>`)."""
        self.client = client
        self.cluster = cluster
        self.paths = paths
        self.index = route_index(cluster)
        self._dirty = asyncio.Event()
        self._dirty.set()  # every route once, at start
        self.writes = 0
        self.failures = 0
        self._logged: set[tuple[str, str]] = set()
        cluster.add_listener(self._on_change, ListenerStage.RESOURCES)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.cluster.remove_listener(self._on_change)

    def _on_change(self, change: ClusterChange) -> None:
        if change.service_objects or change.kinds & set(ROUTE_STORE_KINDS) \
                or change.profiles or change.all_services or change.namespaces:
            self._dirty.set()

    async def run(self) -> None:
        """Until cancelled: after each change, write what differs."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            for kind in ROUTE_STORE_KINDS:
                for obj in self.cluster.objects(kind):
                    if isinstance(obj, Route):
                        await self._reconcile(kind, obj)

    def desired(self, route: Route) -> list[dict[str, Any]]:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        statuses = route_status(route, self.cluster.services.get, self.index.port)
        return status_json(statuses, route.generation, now)

    async def _reconcile(self, kind: str, route: Route) -> None:
        want = self.desired(route)
        path = (f"{self.paths[kind].rsplit('/', 1)[0]}/namespaces/{route.meta.namespace}/"
                f"{self.paths[kind].rsplit('/', 1)[1]}/{route.meta.name}")
        try:
            current = await asyncio.to_thread(self.client.get_json, path, {})
        except Exception as e:  # the route went, or the API is away: next round
            log.debug("route status not read", route=route.label, error=str(e))
            return
        parents = (current.get("status") or {}).get("parents") or []
        ours = [p for p in parents if p.get("controllerName") == CONTROLLER_NAME]
        if same_status(ours, want):
            return
        others = [p for p in parents if p.get("controllerName") != CONTROLLER_NAME]
        body = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "status": {"parents": others + want}}
        try:
            await asyncio.to_thread(self.client.patch_json, path + "/status", body)
        except Exception as e:
            # A conflict means the object changed: its watch event starts a new round.
            self.failures += 1
            if (route.label, str(e)) not in self._logged:
                self._logged.add((route.label, str(e)))
                log.warning("route status not written; tried again on the next change",
                            route=route.label, error=str(e))
            return
        self.writes += 1
