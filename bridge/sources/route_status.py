"""`--route-status`: the kube source writes each route's `status.parents` entries for
meshbridge (Routes §6), beside those of any other controller (Linkerd's
`linkerd.io/policy-controller` among them), which it leaves as they are.

The entries are computed from the same route tables the clients are served
(bridge.routes.status) and written only when they differ from what the object already
says, so that the watch event a write causes settles at once. Every route is checked
once at start; after that only the routes the route index says a change concerns
(the routes that changed, and those attached to a Service whose ports were redone),
so an event never costs a pass over every route, nor a read of each from the API.

A write is a JSON merge patch of the `/status` subresource carrying the
`resourceVersion` it was computed from: a conflict is retried with fresh data (the
conflicting edit's watch event concerns the route again, and a route whose read or
write failed is retried with the next change that concerns any route), and no other
controller's entry is ever overwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any

import structlog

from bridge.cluster import Cluster
from bridge.routes.index import RouteKey, route_index
from bridge.routes.objects import Route
from bridge.routes.status import CONTROLLER_NAME, route_status, same_status, status_json

log = structlog.get_logger("meshbridge.routes.status")


class RouteStatusWriter:
    def __init__(self, client: Any, cluster: Cluster, paths: dict[str, str]) -> None:
        """`client`: the kube source's ApiClient; `paths`: each route store kind's
        collection path (`/apis/<group>/<version>/<plural>`)."""
        self.client = client
        self.cluster = cluster
        self.paths = paths
        self.index = route_index(cluster)
        # Routes to check: every one at start, then those a change concerns; a route
        # whose read or write failed is checked again with the next change.
        self._pending: set[RouteKey] = set(self.index.route_keys())
        self._retry: set[RouteKey] = set()
        self._dirty = asyncio.Event()
        self._dirty.set()
        self.writes = 0
        self.failures = 0
        self._logged: set[tuple[str, str]] = set()
        self.index.add_routes_listener(self._concerned)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.index.remove_routes_listener(self._concerned)

    def _concerned(self, routes: frozenset[RouteKey]) -> None:
        self._pending |= routes | self._retry
        self._retry.clear()
        self._dirty.set()

    async def run(self) -> None:
        """Until cancelled: after each change, write what differs."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            keys, self._pending = sorted(self._pending), set()
            for key in keys:
                route = self.index.route(key)  # as it is now; None once it went
                if route is not None and not await self._reconcile(key[0], route):
                    self._retry.add(key)

    def desired(self, route: Route) -> list[dict[str, Any]]:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        statuses = route_status(route, self.cluster.services.get, self.index.port)
        return status_json(statuses, route.generation, now)

    async def _reconcile(self, kind: str, route: Route) -> bool:
        """Bring the route's entries to what they should be; False if that could not
        be done now (read or write failed)."""
        want = self.desired(route)
        path = (f"{self.paths[kind].rsplit('/', 1)[0]}/namespaces/{route.meta.namespace}/"
                f"{self.paths[kind].rsplit('/', 1)[1]}/{route.meta.name}")
        try:
            current = await asyncio.to_thread(self.client.get_json, path, {})
        except Exception as e:  # the route went, or the API is away: next round
            log.debug("route status not read", route=route.label, error=str(e))
            return False
        parents = (current.get("status") or {}).get("parents") or []
        ours = [p for p in parents if p.get("controllerName") == CONTROLLER_NAME]
        if same_status(ours, want):
            return True
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
            return False
        self.writes += 1
        return True
