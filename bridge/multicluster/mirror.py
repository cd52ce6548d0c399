"""The service mirror: keeps the local `<svc>-<cluster>` and `<svc>-federated` Services
what Linkerd's rules (`mirror_rules`) make of the linked clusters' exported Services,
so that meshbridge works without Linkerd's multicluster extension.

Level-triggered: any change to a linked cluster's Services, the local Services or
Namespaces, or the set of links, schedules one pass that computes every Service the
rules call for and writes only the difference (create, patch, delete). It manages only
Services labelled `mirror.linkerd.io/mirrored-service: "true"`, and never deletes or
rewrites what a linked cluster that has not synced (or cannot be reached) last said:
an outage of a linked cluster is no reason to remove its mirrors. A cluster unlinked
(its Secret deleted) takes its mirrors and federated memberships with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
import urllib3

from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.model import ServiceKey
from bridge.multicluster.links import Link
from bridge.multicluster.mirror_rules import (
    CLUSTER_NAME_LABEL,
    FEDERATED_SUFFIX,
    MIRRORED_LABEL,
    FederatedMember,
    LinkRules,
    differs,
    federated_service,
    is_headless,
    mirror_service,
)
from bridge.multicluster.remote import Report
from bridge.multicluster.store import ClusterStore, LinkedCluster, LinkSource
from bridge.multicluster.targets import REMOTE_DISCOVERY, federation
from bridge.objects import Service
from bridge.sources.kube import KINDS, KindSpec, KubeSource, link_secrets
from bridge.sources.kube_api import ApiClient, ApiError, Credentials

log = structlog.get_logger("meshbridge.mirror")

RESYNC = 30.0  # seconds between passes when nothing says a pass is due


def exported_services_source(link: Link, credentials: Credentials,
                             report: Report) -> LinkSource:
    """A linked cluster as the mirror reads it: its Services, every namespace."""
    return KubeSource(credentials=credentials, kinds=[KINDS["Service"]])


@dataclass(slots=True)
class Plan:
    """One pass: what to create, patch and delete, and why nothing else."""

    create: list[dict[str, Any]] = field(default_factory=list)
    patch: list[tuple[Service, dict[str, Any]]] = field(default_factory=list)
    delete: list[Service] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # one line each, logged once


class MirrorController:
    """Runs the passes against the local API (`writer`) from the store's clusters."""

    def __init__(self, local: Cluster, store: ClusterStore, writer: Writer,
                 rules_for: Callable[[str], LinkRules], local_rules: LinkRules) -> None:
        self.local = local
        self.store = store
        self.writer = writer
        self.rules_for = rules_for
        self.local_rules = local_rules
        self.passes = 0
        self.writes = 0
        self._pending = asyncio.Event()
        self._watched: dict[str, Cluster] = {}
        self._refused_logged: set[str] = set()

    def start(self) -> None:
        self.local.add_listener(self._changed, ListenerStage.VIEWS)
        self.store.listeners.append(self._link_changed)
        for name, lc in self.store.linked.items():
            self._link_changed(name, lc)
        self._pending.set()

    def _changed(self, _change: ClusterChange | None = None) -> None:
        self._pending.set()

    def _link_changed(self, name: str, lc: LinkedCluster | None) -> None:
        old = self._watched.pop(name, None)
        if old is not None:
            with contextlib.suppress(ValueError):
                old.remove_listener(self._changed)
        if lc is not None:
            lc.cluster.add_listener(self._changed, ListenerStage.VIEWS)
            self._watched[name] = lc.cluster
        self._pending.set()

    async def run(self) -> None:
        """Pass after pass, one whenever something changed since the last began, and
        one every RESYNC seconds whatever happened (a Namespace created later, a
        write that failed)."""
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation
            # that arrives as the event is set, and the loop would run on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RESYNC):
                    await self._pending.wait()
            self._pending.clear()
            plan = self.plan()
            await asyncio.to_thread(self._apply, plan)
            self.passes += 1

    # ------------------------------------------------------------------ planning

    def plan(self) -> Plan:
        plan = Plan()
        namespaces = {o.meta.name for o in self.local.objects("Namespace")}
        desired: dict[ServiceKey, dict[str, Any]] = {}
        members: dict[ServiceKey, list[FederatedMember]] = {}
        synced = {name: lc for name, lc in self.store.linked.items()
                  if lc.synced_at is not None}
        for name, lc in sorted(synced.items()):
            rules = self.rules_for(name)
            for svc in lc.cluster.services.values():
                self._consider(svc, rules, namespaces, desired, members, plan)
        for svc in self.local.services.values():
            if svc.meta.labels.get(MIRRORED_LABEL) != "true":
                self._consider(svc, self.local_rules, namespaces, desired, members, plan)
        for key, ms in members.items():
            body = federated_service(key, ms)
            if body is not None:
                desired[ServiceKey(key.namespace, key.name + FEDERATED_SUFFIX)] = body
        for key, body in desired.items():
            actual = self.local.services.get(key)
            if actual is None:
                plan.create.append(body)
            elif actual.meta.labels.get(MIRRORED_LABEL) != "true":
                plan.refused.append(f"{key}: a Service of that name exists and is no mirror")
            elif self._frozen(actual, synced):
                continue
            elif differs(body, actual):
                plan.patch.append((actual, body))
        for key, actual in self.local.services.items():
            if (actual.meta.labels.get(MIRRORED_LABEL) == "true" and key not in desired
                    and not self._frozen(actual, synced)):
                plan.delete.append(actual)
        return plan

    def _consider(self, svc: Service, rules: LinkRules, namespaces: set[str],
                  desired: dict[ServiceKey, dict[str, Any]],
                  members: dict[ServiceKey, list[FederatedMember]], plan: Plan) -> None:
        ns = svc.meta.namespace
        if rules.cluster and rules.remote_discovery.matches(svc.meta.labels):
            if ns in namespaces:
                body = mirror_service(svc, rules)
                desired[ServiceKey(ns, body["metadata"]["name"])] = body
            else:
                plan.refused.append(f"{rules.cluster}: {ns}/{svc.meta.name}: namespace {ns} "
                                    "does not exist here")
        if rules.federated.matches(svc.meta.labels):
            if is_headless(svc):
                plan.refused.append(f"{rules.cluster or 'local'}: {ns}/{svc.meta.name}: "
                                    "headless service cannot join federated service")
            elif ns not in namespaces:
                plan.refused.append(f"{rules.cluster or 'local'}: {ns}/{svc.meta.name}: "
                                    f"namespace {ns} does not exist here")
            else:
                members.setdefault(ServiceKey(ns, svc.meta.name), []).append(
                    FederatedMember(rules, svc))

    def _frozen(self, actual: Service, synced: dict[str, LinkedCluster]) -> bool:
        """A mirror whose linked cluster is linked but not synced is left as it is, and
        so is a federated Service with such a member."""
        linked = self.store.linked
        clusters = set()
        owner = actual.meta.labels.get(CLUSTER_NAME_LABEL)
        if owner:
            clusters.add(owner)
        if REMOTE_DISCOVERY in actual.meta.annotations:
            clusters.update(m.cluster for m in federation(actual).remote)
        return any(c in linked and c not in synced for c in clusters)

    # ------------------------------------------------------------------ writing

    def _apply(self, plan: Plan) -> None:
        for line in plan.refused:
            if line not in self._refused_logged:
                self._refused_logged.add(line)
                log.warning("not mirrored", reason=line)
        self._refused_logged &= set(plan.refused)
        for body in plan.create:
            self._write("created", body["metadata"], self.writer.create, body)
        for actual, body in plan.patch:
            self._write("updated", body["metadata"], self.writer.patch, actual, body)
        for actual in plan.delete:
            self._write("deleted", {"namespace": actual.meta.namespace,
                                    "name": actual.meta.name}, self.writer.delete, actual)

    def _write(self, what: str, meta: dict[str, Any], call: Callable[..., None],
               *args: Any) -> None:
        try:
            call(*args)
        except ApiError as e:
            if e.status != 409:  # a conflict: the next pass sees the newer object
                log.error(f"mirror Service not {what}", namespace=meta["namespace"],
                          service=meta["name"], status=e.status, reason=e.reason)
            self._pending.set()
            return
        except Exception as e:  # the API server went away: the next pass retries
            log.error(f"mirror Service not {what}", namespace=meta["namespace"],
                      service=meta["name"], reason=f"{type(e).__name__}: {e}")
            self._pending.set()
            return
        self.writes += 1
        log.info(f"mirror Service {what}", namespace=meta["namespace"], service=meta["name"])


class Writer:
    """The local API's Service writes the mirror makes."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def create(self, body: dict[str, Any]) -> None:
        ns = body["metadata"]["namespace"]
        self._request("POST", f"/api/v1/namespaces/{ns}/services", body)

    def patch(self, actual: Service, body: dict[str, Any]) -> None:
        """Labels, annotations and ports replaced, only if the Service is still the one
        the pass read (a JSON Patch `test` of its resourceVersion)."""
        md = body["metadata"]
        ops = [{"op": "test", "path": "/metadata/resourceVersion",
                "value": actual.meta.resource_version},
               {"op": "add", "path": "/metadata/labels", "value": md["labels"]},
               {"op": "add", "path": "/metadata/annotations", "value": md["annotations"]},
               {"op": "replace", "path": "/spec/ports", "value": body["spec"]["ports"]}]
        self._request("PATCH", _path(actual), ops, "application/json-patch+json")

    def delete(self, actual: Service) -> None:
        self._request("DELETE", _path(actual), {
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"resourceVersion": actual.meta.resource_version}})

    def _request(self, method: str, path: str, body: Any,
                 content_type: str = "application/json") -> None:
        creds = self.client.creds
        resp = self.client.pool.request(
            method, creds.host + path, body=json.dumps(body).encode(),
            headers={**creds.headers, "Content-Type": content_type},
            timeout=urllib3.Timeout(connect=5.0, read=30.0))
        if resp.status == 404 and method == "DELETE":
            return  # gone already
        if resp.status >= 300:
            reason = resp.reason or ""
            with contextlib.suppress(ValueError, AttributeError):
                reason = json.loads(resp.data).get("message", reason)
            if resp.status == 422 and method == "PATCH" and "test" in reason:
                raise ApiError(409, reason)  # the resourceVersion moved: a conflict
            raise ApiError(resp.status, reason)


def _path(svc: Service) -> str:
    return f"/api/v1/namespaces/{svc.meta.namespace}/services/{svc.meta.name}"


NAMESPACES = KindSpec("Namespace", "/api/v1/namespaces", "namespaces", "")


def local_kinds(namespace: str) -> list[KindSpec]:
    """What the mirror watches locally: Services, Namespaces, the links' Secrets."""
    return [KINDS["Service"], NAMESPACES, link_secrets(namespace)]
