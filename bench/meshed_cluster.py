"""A realistic meshed cluster on a real kube-apiserver: the shape `bench.big_cluster`
starts meshbridge on.

Per service: a Service, the ReplicaSet of its Deployment, its pods (Linkerd-injected:
the proxy's environment, ports, probes and volumes, an init container, the workload's
owner reference, a Running status with conditions and container statuses) and its
EndpointSlices (at most 100 endpoints each, every endpoint ready, naming its pod, node
and zone). Nodes carry a zone label; namespaces hold the services round-robin.
Namespaces, Nodes and Services are created through the API; so is the first pod (its
status through the status subresource, as the kubelet writes it, since a create
resets it), the first ReplicaSet and the first slice. The rest of those three kinds
is written straight into etcd in the image of the first: the same fields, the API's
defaults, the same field managers (managedFields, which make up nearly half of a
pod's JSON). Through the API alone, filling 50,000 pods took hours on this machine.

The bodies are ours, written to the Kubernetes API's schema, sized like what an
injected pod weighs in a real cluster (about 9 KiB of JSON).
"""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import hashlib
import json
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3

ZONES = ("zone-a", "zone-b", "zone-c")
PROXY_IMAGE = "cr.l5d.io/linkerd/proxy:edge-26.11.4"
APP_IMAGE = "ghcr.io/example/app:1.42.0"
SLICE_SIZE = 100
TRUST_ANCHOR = (
    "-----BEGIN CERTIFICATE-----\n"
    + "\n".join("MIIBwDCCAWagAwIBAgIQMvd1QnGUJzXVUt3gNh7rWjAKBggqhkjOPQQDAjApMScw"
                for _ in range(10))
    + "\n-----END CERTIFICATE-----\n"
)


@dataclass(frozen=True, slots=True)
class Shape:
    pods: int = 10_000
    pods_per_service: int = 20
    nodes: int = 100
    namespaces: int = 10

    @property
    def services(self) -> int:
        return -(-self.pods // self.pods_per_service)


def namespace_of(shape: Shape, service: int) -> str:
    return f"mesh-{service % shape.namespaces}"


def service_name(service: int) -> str:
    return f"svc-{service:05d}"


def pod_ip(index: int) -> str:
    return f"10.{64 + (index >> 16)}.{(index >> 8) & 255}.{index & 255}"


def node_ip(index: int) -> str:
    return f"172.20.{index >> 8}.{index & 255}"


def node_body(index: int) -> dict[str, Any]:
    zone = ZONES[index % len(ZONES)]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f"node-{index:03d}", "labels": {
            "kubernetes.io/hostname": f"node-{index:03d}", "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m6i.2xlarge",
            "topology.kubernetes.io/region": "region-1", "topology.kubernetes.io/zone": zone}},
        "spec": {"podCIDR": f"10.{64 + index // 4}.0.0/24", "providerID": f"cloud://node-{index}"},
    }


def service_body(shape: Shape, service: int) -> dict[str, Any]:
    name = service_name(service)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace_of(shape, service),
                     "labels": {"app": name, "app.kubernetes.io/part-of": "bench"}},
        "spec": {"selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                            "protocol": "TCP"},
                           {"name": "grpc", "port": 9090, "targetPort": 9090,
                            "protocol": "TCP"}]},
    }


def _template_hash(service: int) -> str:
    return f"{(service * 2654435761) % (36 ** 10):010x}"[:10]


def replicaset_body(shape: Shape, service: int) -> dict[str, Any]:
    name = service_name(service)
    labels = _pod_labels(name, service, namespace_of(shape, service))
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": f"{name}-{_template_hash(service)}",
                     "namespace": namespace_of(shape, service), "labels": labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": name, "uid": _uid("deploy", service),
                                          "controller": True,
                                          "blockOwnerDeletion": True}]},
        "spec": {"replicas": shape.pods_per_service,
                 "selector": {"matchLabels": {"app": name,
                                              "pod-template-hash": _template_hash(service)}},
                 "template": {"metadata": {"labels": labels,
                                           "annotations": _pod_annotations()},
                              "spec": _pod_spec(name, namespace_of(shape, service))}},
    }


def _uid(kind: str, index: int) -> str:
    h = hashlib.sha256(f"{kind}/{index}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:32]}"


def _pod_labels(name: str, service: int, ns: str) -> dict[str, str]:
    return {"app": name, "pod-template-hash": _template_hash(service),
            "linkerd.io/control-plane-ns": "linkerd", "linkerd.io/proxy-deployment": name,
            "linkerd.io/workload-ns": ns, "app.kubernetes.io/part-of": "bench",
            "version": "v1"}


def _pod_annotations() -> dict[str, str]:
    return {"linkerd.io/created-by": "linkerd/proxy-injector edge-26.11.4",
            "linkerd.io/inject": "enabled",
            "linkerd.io/proxy-version": "edge-26.11.4",
            "linkerd.io/trust-root-sha256":
                "0d2b2a3f0c3b4e9d8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b",
            "viz.linkerd.io/tap-enabled": "true",
            "kubectl.kubernetes.io/default-container": "app",
            "config.linkerd.io/opaque-ports": "9090",
            "prometheus.io/scrape": "true", "prometheus.io/port": "9102"}


def _env(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def _proxy_env() -> list[dict[str, Any]]:
    suffixes = "svc.cluster.local."
    return [
        _field_env("_pod_name", "metadata.name"),
        _field_env("_pod_ns", "metadata.namespace"),
        _field_env("_pod_nodeName", "spec.nodeName"),
        _env("LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED", "false"),
        _env("LINKERD2_PROXY_LOG", "warn,linkerd=info,hickory=error,linkerd_proxy_http=warn"),
        _env("LINKERD2_PROXY_LOG_FORMAT", "plain"),
        _env("LINKERD2_PROXY_DESTINATION_SVC_ADDR",
             "linkerd-dst-headless.linkerd.svc.cluster.local.:8086"),
        _env("LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS",
             "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8"),
        _env("LINKERD2_PROXY_POLICY_SVC_ADDR",
             "linkerd-policy.linkerd.svc.cluster.local.:8090"),
        _env("LINKERD2_PROXY_POLICY_WORKLOAD",
             json.dumps({"ns": "$(_pod_ns)", "pod": "$(_pod_name)"})),
        _env("LINKERD2_PROXY_INBOUND_DEFAULT_POLICY", "all-unauthenticated"),
        _env("LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS",
             "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8"),
        _env("LINKERD2_PROXY_CONTROL_STREAM_INITIAL_TIMEOUT", "3s"),
        _env("LINKERD2_PROXY_CONTROL_STREAM_IDLE_TIMEOUT", "5m"),
        _env("LINKERD2_PROXY_CONTROL_STREAM_LIFETIME", "1h"),
        _env("LINKERD2_PROXY_INBOUND_CONNECT_TIMEOUT", "100ms"),
        _env("LINKERD2_PROXY_OUTBOUND_CONNECT_TIMEOUT", "1000ms"),
        _env("LINKERD2_PROXY_OUTBOUND_DISCOVERY_IDLE_TIMEOUT", "5s"),
        _env("LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT", "90s"),
        _env("LINKERD2_PROXY_CONTROL_LISTEN_ADDR", "[::]:4190"),
        _env("LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "[::]:4191"),
        _env("LINKERD2_PROXY_OUTBOUND_LISTEN_ADDR", "127.0.0.1:4140"),
        _env("LINKERD2_PROXY_OUTBOUND_LISTEN_ADDRS", "127.0.0.1:4140,[::1]:4140"),
        _env("LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "[::]:4143"),
        _field_env("LINKERD2_PROXY_INBOUND_IPS", "status.podIPs"),
        _env("LINKERD2_PROXY_INBOUND_PORTS", "8080,9090,9102"),
        _env("LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES", suffixes),
        _env("LINKERD2_PROXY_INBOUND_ACCEPT_KEEPALIVE", "10000ms"),
        _env("LINKERD2_PROXY_OUTBOUND_CONNECT_KEEPALIVE", "10000ms"),
        _env("LINKERD2_PROXY_INBOUND_ACCEPT_USER_TIMEOUT", "30s"),
        _env("LINKERD2_PROXY_OUTBOUND_CONNECT_USER_TIMEOUT", "30s"),
        _env("LINKERD2_PROXY_INBOUND_SERVER_HTTP2_KEEP_ALIVE_INTERVAL", "10s"),
        _env("LINKERD2_PROXY_INBOUND_SERVER_HTTP2_KEEP_ALIVE_TIMEOUT", "3s"),
        _env("LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_KEEP_ALIVE_INTERVAL", "10s"),
        _env("LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_KEEP_ALIVE_TIMEOUT", "3s"),
        _env("LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION",
             "25,587,3306,4444,5432,6379,9300,11211"),
        _env("LINKERD2_PROXY_DESTINATION_CONTEXT", json.dumps(
            {"ns": "$(_pod_ns)", "nodeName": "$(_pod_nodeName)", "pod": "$(_pod_name)"})),
        _field_env("_pod_sa", "spec.serviceAccountName"),
        _env("_l5d_ns", "linkerd"),
        _env("_l5d_trustdomain", "cluster.local"),
        _env("LINKERD2_PROXY_IDENTITY_DIR", "/var/run/linkerd/identity/end-entity"),
        _env("LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS", TRUST_ANCHOR),
        _env("LINKERD2_PROXY_IDENTITY_TOKEN_FILE",
             "/var/run/secrets/tokens/linkerd-identity-token"),
        _env("LINKERD2_PROXY_IDENTITY_SVC_ADDR",
             "linkerd-identity-headless.linkerd.svc.cluster.local.:8080"),
        _env("LINKERD2_PROXY_IDENTITY_LOCAL_NAME",
             "$(_pod_sa).$(_pod_ns).serviceaccount.identity.linkerd.cluster.local"),
        _env("LINKERD2_PROXY_IDENTITY_SVC_NAME",
             "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"),
        _env("LINKERD2_PROXY_DESTINATION_SVC_NAME",
             "linkerd-destination.linkerd.serviceaccount.identity.linkerd.cluster.local"),
        _env("LINKERD2_PROXY_POLICY_SVC_NAME",
             "linkerd-destination.linkerd.serviceaccount.identity.linkerd.cluster.local"),
        _env("LINKERD2_PROXY_TAP_SVC_NAME",
             "tap.linkerd-viz.serviceaccount.identity.linkerd.cluster.local"),
    ]


def _probe(port: int | str, path: str) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port, "scheme": "HTTP"},
            "initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 1,
            "successThreshold": 1, "failureThreshold": 3}


def _pod_spec(name: str, ns: str) -> dict[str, Any]:
    mounts = [{"name": "kube-api-access", "mountPath":
               "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}]
    return {
        "serviceAccountName": name,
        "initContainers": [{
            "name": "linkerd-init", "image": "cr.l5d.io/linkerd/proxy-init:v2.4.3",
            "args": ["--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140",
                     "--proxy-uid", "2102", "--inbound-ports-to-ignore", "4190,4191,4567,4568",
                     "--outbound-ports-to-ignore", "4567,4568"],
            "resources": {"limits": {"cpu": "100m", "memory": "20Mi"},
                          "requests": {"cpu": "100m", "memory": "20Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {
                "add": ["NET_ADMIN", "NET_RAW"]}, "privileged": False,
                "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "volumeMounts": [{"name": "linkerd-proxy-init-xtables-lock",
                              "mountPath": "/run"}, *mounts],
        }],
        "containers": [
            {"name": "linkerd-proxy", "image": PROXY_IMAGE, "imagePullPolicy": "IfNotPresent",
             "env": _proxy_env(),
             "ports": [{"name": "linkerd-proxy", "containerPort": 4143, "protocol": "TCP"},
                       {"name": "linkerd-admin", "containerPort": 4191, "protocol": "TCP"}],
             "livenessProbe": _probe(4191, "/live"), "readinessProbe": _probe(4191, "/ready"),
             "lifecycle": {"postStart": {"exec": {"command": [
                 "/usr/lib/linkerd/linkerd-await", "--timeout=2m", "--port=4191"]}}},
             "resources": {"requests": {"cpu": "100m", "memory": "20Mi"}},
             "securityContext": {"allowPrivilegeEscalation": False,
                                 "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                 "runAsUser": 2102, "seccompProfile": {"type": "RuntimeDefault"}},
             "volumeMounts": [{"name": "linkerd-identity-end-entity",
                               "mountPath": "/var/run/linkerd/identity/end-entity"},
                              {"name": "linkerd-identity-token",
                               "mountPath": "/var/run/secrets/tokens"}, *mounts]},
            {"name": "app", "image": APP_IMAGE, "imagePullPolicy": "IfNotPresent",
             "args": ["--listen=:8080", "--grpc=:9090", "--metrics=:9102"],
             "env": [_env("LOG_LEVEL", "info"), _field_env("POD_IP", "status.podIP")],
             "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                       {"name": "grpc", "containerPort": 9090, "protocol": "TCP"},
                       {"name": "metrics", "containerPort": 9102, "protocol": "TCP"}],
             "livenessProbe": _probe("http", "/healthz"),
             "readinessProbe": _probe("http", "/readyz"),
             "resources": {"limits": {"memory": "256Mi"},
                           "requests": {"cpu": "50m", "memory": "64Mi"}},
             "volumeMounts": mounts},
        ],
        "volumes": [
            {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}},
            {"name": "linkerd-proxy-init-xtables-lock", "emptyDir": {}},
            {"name": "linkerd-identity-end-entity", "emptyDir": {"medium": "Memory"}},
            {"name": "linkerd-identity-token", "projected": {"sources": [
                {"serviceAccountToken": {"audience": "identity.l5d.io",
                                         "expirationSeconds": 86400,
                                         "path": "linkerd-identity-token"}}]}},
        ],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300}],
    }


@dataclass(frozen=True, slots=True)
class PodPlace:
    index: int  # the pod's number in the whole cluster
    service: int
    replica: int
    node: int


def pod_places(shape: Shape) -> Iterator[PodPlace]:
    for index in range(shape.pods):
        service = index // shape.pods_per_service
        yield PodPlace(index, service, index % shape.pods_per_service, index % shape.nodes)


def pod_name(place: PodPlace) -> str:
    return f"{service_name(place.service)}-{_template_hash(place.service)}-{place.replica:05d}"


def pod_body(shape: Shape, place: PodPlace, rs_uid: str) -> dict[str, Any]:
    name = service_name(place.service)
    ns = namespace_of(shape, place.service)
    spec = _pod_spec(name, ns)
    spec["nodeName"] = f"node-{place.node:03d}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(place), "namespace": ns,
                     "generateName": f"{name}-{_template_hash(place.service)}-",
                     "labels": _pod_labels(name, place.service, ns),
                     "annotations": _pod_annotations(),
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": f"{name}-{_template_hash(place.service)}",
                                          "uid": rs_uid, "controller": True,
                                          "blockOwnerDeletion": True}]},
        "spec": spec,
    }


def pod_status(place: PodPlace) -> dict[str, Any]:
    started = "2026-11-30T08:00:00Z"
    ip = pod_ip(place.index)

    def running(name: str, image: str, cid: int) -> dict[str, Any]:
        return {"name": name, "image": image, "imageID": f"{image}@sha256:{cid:064x}",
                "containerID": f"containerd://{place.index:032x}{cid:032x}", "ready": True,
                "restartCount": 0, "started": True,
                "state": {"running": {"startedAt": started}}}

    conditions = [{"type": t, "status": "True", "lastProbeTime": None,
                   "lastTransitionTime": started}
                  for t in ("PodReadyToStartContainers", "Initialized", "Ready",
                            "ContainersReady", "PodScheduled")]
    return {"status": {
        "phase": "Running", "conditions": conditions, "hostIP": node_ip(place.node),
        "hostIPs": [{"ip": node_ip(place.node)}], "podIP": ip, "podIPs": [{"ip": ip}],
        "startTime": started, "qosClass": "Burstable",
        "initContainerStatuses": [{
            "name": "linkerd-init", "image": "cr.l5d.io/linkerd/proxy-init:v2.4.3",
            "imageID": f"cr.l5d.io/linkerd/proxy-init@sha256:{7:064x}",
            "containerID": f"containerd://{place.index:032x}{3:032x}", "ready": True,
            "restartCount": 0, "started": False,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                     "startedAt": started, "finishedAt": started}}}],
        "containerStatuses": [running("app", APP_IMAGE, 1),
                              running("linkerd-proxy", PROXY_IMAGE, 2)],
    }}


def slice_bodies(shape: Shape, service: int, first_index: int) -> list[dict[str, Any]]:
    name = service_name(service)
    ns = namespace_of(shape, service)
    places = [PodPlace(first_index + r, service, r, (first_index + r) % shape.nodes)
              for r in range(min(shape.pods_per_service, shape.pods - first_index))]
    out = []
    for k in range(0, len(places), SLICE_SIZE):
        out.append({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-{k // SLICE_SIZE:05x}", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": name,
                                    "endpointslice.kubernetes.io/managed-by":
                                        "endpointslice-controller.k8s.io"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service",
                                              "name": name, "uid": _uid("svc", service),
                                              "controller": True,
                                              "blockOwnerDeletion": True}]},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                      {"name": "grpc", "port": 9090, "protocol": "TCP"}],
            "endpoints": [{
                "addresses": [pod_ip(p.index)],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": f"node-{p.node:03d}",
                "zone": ZONES[p.node % len(ZONES)],
                "targetRef": {"kind": "Pod", "namespace": ns, "name": pod_name(p)},
            } for p in places[k:k + SLICE_SIZE]],
        })
    return out


class Rest:
    """POST and PATCH against the API server from many threads, one kept-alive
    connection per thread."""

    def __init__(self, url: str, token: str, ca_file: str, threads: int) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}",
                        "Content-Type": "application/json", "Accept": "application/json"}
        ctx = ssl.create_default_context(cafile=ca_file)
        self.pool = urllib3.PoolManager(maxsize=threads, ssl_context=ctx, retries=False)

    def call(self, method: str, path: str, body: dict[str, Any],
             content_type: str = "application/json") -> dict[str, Any]:
        resp = self.pool.request(method, self.url + path, body=json.dumps(body).encode(),
                                 headers={**self.headers, "Content-Type": content_type},
                                 timeout=urllib3.Timeout(connect=10, read=120))
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {resp.data[:300]!r}")
        data: dict[str, Any] = json.loads(resp.data)
        return data


class Etcd:
    """Puts straight into the API server's etcd, many objects per transaction: the
    bulk of a big cluster (pods, their ReplicaSets and slices) written in seconds
    instead of the tens of minutes the API's own writes take on two busy cores. The
    API server's watch cache sees them as it sees its own writes (it watches etcd),
    and it reads JSON from storage whatever it writes itself."""

    BATCH_BYTES = 1_000_000  # etcd refuses requests over 1.5 MiB by default

    def __init__(self, url: str) -> None:
        self.url = url
        self.pool = urllib3.PoolManager(maxsize=16, retries=False)

    def put_all(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        ops: list[dict[str, Any]] = []
        size = 0
        for key, obj in items:
            value = base64.b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode()
            if ops and (size + len(value) > self.BATCH_BYTES or len(ops) >= 100):
                self._txn(ops)
                ops, size = [], 0
            ops.append({"requestPut": {"key": base64.b64encode(key.encode()).decode(),
                                       "value": value}})
            size += len(value)
        if ops:
            self._txn(ops)

    def _txn(self, ops: list[dict[str, Any]]) -> None:
        # Unconditional puts of the same values: repeated after etcd's "request timed
        # out" (503, which a loaded 2-core machine gets mid-fill at 50,000 pods), a
        # few times with a growing pause, before giving up.
        for attempt in range(6):
            resp = self.pool.request("POST", self.url + "/v3/kv/txn",
                                     body=json.dumps({"success": ops}).encode(),
                                     headers={"Content-Type": "application/json"},
                                     timeout=urllib3.Timeout(connect=10, read=120))
            if resp.status != 503 or attempt == 5:
                break
            time.sleep(0.5 * 2 ** attempt)
        if resp.status >= 300 or not json.loads(resp.data).get("succeeded"):
            raise RuntimeError(f"etcd txn: HTTP {resp.status}: {resp.data[:300]!r}")


    def _range(self, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.pool.request("POST", self.url + "/v3/kv/range",
                                 body=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"},
                                 timeout=urllib3.Timeout(connect=10, read=120))
        if resp.status >= 300:
            raise RuntimeError(f"etcd range: HTTP {resp.status}: {resp.data[:300]!r}")
        reply: dict[str, Any] = json.loads(resp.data)
        return reply

    def count(self, prefix: str) -> int:
        """How many keys start with `prefix` if it ends with a slash, else whether the
        key `prefix` itself is there (1 or 0); counted by etcd, no value is sent."""
        body = {"key": base64.b64encode(prefix.encode()).decode(), "count_only": True}
        if prefix.endswith("/"):
            end = prefix[:-1] + chr(ord("/") + 1)
            body["range_end"] = base64.b64encode(end.encode()).decode()
        return int(self._range(body).get("count", 0))

    def get(self, key: str) -> dict[str, Any] | None:
        """The JSON object stored at `key`, or None."""
        kvs = self._range({"key": base64.b64encode(key.encode()).decode()}).get("kvs")
        if not kvs:
            return None
        value: dict[str, Any] = json.loads(base64.b64decode(kvs[0]["value"]))
        return value


def expected_counts(shape: Shape) -> dict[str, int]:
    """How many keys `fill` leaves under each etcd prefix it writes to (a prefix ends
    with a slash; a key without one is a single key, 1 if there): per namespace,
    the pods, ReplicaSets, Services and EndpointSlices of its services; the Nodes; the
    namespaces themselves. A kept cluster is of `shape` when etcd holds exactly these
    (the API server's own objects, e.g. default/kubernetes, live elsewhere)."""
    out: dict[str, int] = {"/registry/minions/": shape.nodes}
    for i in range(shape.namespaces):
        out[f"/registry/namespaces/mesh-{i}"] = 1
        for kind in STORED_UNDER:
            out[registry_prefix(kind, f"mesh-{i}")] = 0
    for s in range(shape.services):
        ns = namespace_of(shape, s)
        pods = min(shape.pods_per_service, shape.pods - s * shape.pods_per_service)
        out[registry_prefix("pods", ns)] += pods
        out[registry_prefix("replicasets", ns)] += 1
        out[registry_prefix("services", ns)] += 1
        out[registry_prefix("endpointslices", ns)] += -(-pods // SLICE_SIZE)
    return out


# Where the API server keeps each namespaced kind the fill writes, under /registry/
# (a Service's object sits one level deeper, beside what were its Endpoints).
STORED_UNDER = {"pods": ("pods",), "replicasets": ("replicasets",),
                "services": ("services", "specs"), "endpointslices": ("endpointslices",)}


def registry_prefix(kind: str, namespace: str) -> str:
    return "/".join(("", "registry", *STORED_UNDER[kind], namespace, ""))


def count_mismatches(expected: dict[str, int], found: dict[str, int]) -> list[str]:
    """One line per prefix whose count differs (an empty list: the counts agree)."""
    return [f"{prefix}: {found.get(prefix, 0):,} keys, expected {n:,}"
            for prefix, n in expected.items() if found.get(prefix, 0) != n]


def pod_mismatches(shape: Shape, place: PodPlace, stored: dict[str, Any] | None) -> list[str]:
    """What of the pod `fill` writes at `place` differs in `stored` (its node, address
    and owner follow from the shape, so a cluster of another shape with the same counts
    differs here)."""
    if stored is None:
        return [f"pod {pod_name(place)}: missing"]
    want = {"node": f"node-{place.node:03d}", "ip": pod_ip(place.index),
            "owner": f"{service_name(place.service)}-{_template_hash(place.service)}"}
    owners = stored.get("metadata", {}).get("ownerReferences") or [{}]
    got = {"node": stored.get("spec", {}).get("nodeName"),
           "ip": stored.get("status", {}).get("podIP"), "owner": owners[0].get("name")}
    return [f"pod {pod_name(place)}: {k} {got[k]!r}, expected {v!r}"
            for k, v in want.items() if got[k] != v]


def shape_mismatches(etcd: Etcd, shape: Shape) -> list[str]:
    """How the cluster kept in `etcd` differs from what `fill` makes of `shape`: every
    prefix's key count, and the middle and the last pod read back (written straight to
    etcd as JSON; the first went through the API, which stores protobuf). Empty: the
    same."""
    expected = expected_counts(shape)
    found = {prefix: etcd.count(prefix) for prefix in expected}
    problems = count_mismatches(expected, found)
    for place in sample_places(shape):
        key = f"/registry/pods/{namespace_of(shape, place.service)}/{pod_name(place)}"
        problems += pod_mismatches(shape, place, etcd.get(key))
    return problems


def place_of(shape: Shape, index: int) -> PodPlace:
    return PodPlace(index, index // shape.pods_per_service,
                    index % shape.pods_per_service, index % shape.nodes)


def sample_places(shape: Shape) -> list[PodPlace]:
    """The pods a shape check reads back: the middle one and the last one, never the
    first (`fill` makes that one through the API, which stores it in protobuf)."""
    return [place_of(shape, i) for i in sorted({shape.pods // 2, shape.pods - 1} - {0})]


def _stored(made: dict[str, Any], body: dict[str, Any], uid: str) -> dict[str, Any]:
    """`body` as the API server would have stored it: the server-set metadata of an
    object it made (`made`: its field managers, creation time) with a uid of its own."""
    md = made["metadata"]
    out = dict(body)
    out["metadata"] = {**body["metadata"], "uid": uid,
                       "creationTimestamp": md["creationTimestamp"],
                       "managedFields": md.get("managedFields", [])}
    if "generation" in md:
        out["metadata"]["generation"] = md["generation"]
    return out


def fill(rest: Rest, etcd: Etcd, shape: Shape, threads: int = 16,
         progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """Create the whole cluster; returns how many objects of each kind. Namespaces,
    Nodes and Services go through the API (it allocates cluster IPs); of pods,
    ReplicaSets and EndpointSlices the first goes through the API and the rest are
    written to etcd in its image: the same fields, field managers and status."""
    counts: dict[str, int] = {}
    post = functools.partial(rest.call, "POST")

    def note(kind: str, n: int) -> None:
        counts[kind] = counts.get(kind, 0) + n
        if progress is not None:
            progress(f"{kind}: {n}")

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        def run(kind: str, jobs: list[Callable[[], dict[str, Any]]]) -> list[dict[str, Any]]:
            results = list(pool.map(lambda job: job(), jobs))
            note(kind, len(jobs))
            return results

        def bulk(kind: str, items: list[tuple[str, dict[str, Any]]]) -> None:
            chunks = [items[i:i + 500] for i in range(0, len(items), 500)]
            list(pool.map(etcd.put_all, chunks))
            note(kind, len(items))

        run("Namespace", [functools.partial(post, "/api/v1/namespaces",
                                            {"metadata": {"name": f"mesh-{i}"}})
                          for i in range(shape.namespaces)])
        run("Node", [functools.partial(post, "/api/v1/nodes", node_body(i))
                     for i in range(shape.nodes)])
        services = range(shape.services)
        run("Service", [functools.partial(
            post, f"/api/v1/namespaces/{namespace_of(shape, s)}/services",
            service_body(shape, s)) for s in services])

        def rs_path(s: int) -> str:
            return f"/apis/apps/v1/namespaces/{namespace_of(shape, s)}/replicasets"

        rs0 = post(rs_path(0), replicaset_body(shape, 0))
        rs_uids = [rs0["metadata"]["uid"]] + [_uid("rs", s) for s in services[1:]]
        bulk("ReplicaSet", [(f"/registry/replicasets/{namespace_of(shape, s)}/"
                             f"{replicaset_body(shape, s)['metadata']['name']}",
                             _stored(rs0, replicaset_body(shape, s), rs_uids[s]))
                            for s in services[1:]])
        note("ReplicaSet", 1)

        places = list(pod_places(shape))
        first = places[0]
        ns0 = namespace_of(shape, first.service)
        post(f"/api/v1/namespaces/{ns0}/pods", pod_body(shape, first, rs_uids[0]))
        pod0 = rest.call("PATCH", f"/api/v1/namespaces/{ns0}/pods/{pod_name(first)}/status",
                         pod_status(first), "application/merge-patch+json")
        template = {k: v for k, v in pod0.items() if k != "status"}

        def stored_pod(place: PodPlace) -> tuple[str, dict[str, Any]]:
            body = pod_body(shape, place, rs_uids[place.service])
            # The API's defaults on create (terminationMessagePath, securityContext, ...)
            # as the first pod got them, then this pod's own names, node and status.
            spec = json.loads(json.dumps(template["spec"]))
            spec["nodeName"] = body["spec"]["nodeName"]
            spec["serviceAccountName"] = spec["serviceAccount"] = \
                body["spec"]["serviceAccountName"]
            stored = _stored(pod0, {**body, "spec": spec, **pod_status(place)},
                             _uid("pod", place.index))
            ns = body["metadata"]["namespace"]
            return f"/registry/pods/{ns}/{body['metadata']['name']}", stored

        for start in range(1, len(places), 5000):  # bounded memory at 50,000 pods
            bulk("Pod", [stored_pod(p) for p in places[start:start + 5000]])
        note("Pod", 1)

        slices = [b for s in services for b in slice_bodies(shape, s, s * shape.pods_per_service)]
        slice0 = post(f"/apis/discovery.k8s.io/v1/namespaces/{slices[0]['metadata']['namespace']}"
                      "/endpointslices", slices[0])
        bulk("EndpointSlice", [(f"/registry/endpointslices/{b['metadata']['namespace']}/"
                                f"{b['metadata']['name']}", _stored(slice0, b, _uid("slice", i)))
                               for i, b in enumerate(slices[1:], 1)])
        note("EndpointSlice", 1)
    return counts
