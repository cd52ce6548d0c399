"""A real istiod (`pilot-discovery`) on a test kube-apiserver: the xDS side's
reference control plane, as Linkerd's destination controller is the Linkerd side's.

``scripts/istiod.sh`` builds pilot-discovery from the Go module ``istio.io/istio``
through the Go module proxy (once, then cached) and puts Istio's CRDs from the same
module next to it. :class:`Istiod` applies those CRDs to a :class:`KubeAPIServer`
and runs istiod against it on 127.0.0.1, with only its discovery part: no CA (its
certificates and the secure xDS port need one), no webhooks (no HTTPS port, no
webhook configurations to patch), no injector (its ConfigMap does not exist), no
Gateway API controller (its CRDs are not installed). The plaintext xDS port
(``grpc_port``, istiod's 15010) answers an ADS client with no credentials.

Usage::

    with Istiod(kube_apiserver) as istiod:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{istiod.grpc_port}")
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

import yaml
from envoy.config.endpoint.v3 import endpoint_components_pb2
from google.protobuf import json_format
from kubernetes import client, config

from testkit.kubeapi import KubeAPIServer
from testkit.net import free_ports
from testkit.polling import eventually_sync

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
ISTIOD_SCRIPT: Final = REPO_ROOT / "scripts" / "istiod.sh"
NAMESPACE: Final = "istio-system"
CLUSTER_ID: Final = "Kubernetes"
# Enough for the discovery server; every other mesh setting keeps istiod's default.
MESH_CONFIG: Final = """\
defaultConfig:
  discoveryAddress: istiod.istio-system.svc:15012
rootNamespace: istio-system
trustDomain: cluster.local
"""


class IstiodError(RuntimeError):
    """istiod could not be built, started or reached."""


def istiod_dir(timeout: float = 3600.0) -> Path:
    """Run ``scripts/istiod.sh`` (building on first use) and return its directory."""
    try:
        proc = subprocess.run(["bash", str(ISTIOD_SCRIPT)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise IstiodError(f"{ISTIOD_SCRIPT} took longer than {timeout:.0f}s") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.splitlines()[-40:])
        raise IstiodError(f"{ISTIOD_SCRIPT} failed with exit code {proc.returncode}:\n{tail}")
    found = Path(lines[-1])
    if not os.access(found / "pilot-discovery", os.X_OK) or not (
            found / "crd-all.gen.yaml").is_file():
        raise IstiodError(f"{ISTIOD_SCRIPT} printed {found}, which lacks pilot-discovery or "
                          "crd-all.gen.yaml")
    return found


def apply_crds(kube: KubeAPIServer, path: Path) -> list[str]:
    """Create every CustomResourceDefinition in `path` (an existing one is kept) and
    wait until each is Established; returns their names."""
    api = config.new_client_from_config(str(kube.kubeconfig_path))
    ext = client.ApiextensionsV1Api(api)
    names = []
    try:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            names.append(doc["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(doc)
            except client.ApiException as e:
                if e.status != 409:
                    raise

        def established() -> bool:
            for name in names:
                crd = ext.read_custom_resource_definition(name)
                conds = (crd.status.conditions or []) if crd.status else []
                if not any(c.type == "Established" and c.status == "True" for c in conds):
                    return False
            return True

        eventually_sync(established, timeout=60)
    finally:
        api.close()
    return names


class Istiod:
    """pilot-discovery against one kube-apiserver, on 127.0.0.1 only."""

    def __init__(self, kube: KubeAPIServer, startup_timeout: float = 120.0,
                 gateway_api: bool = False) -> None:
        self.kube = kube
        self.startup_timeout = startup_timeout
        # Install the Gateway API's CRDs and let istiod read routes (mesh routes only:
        # no status writing, no gateway deployments).
        self.gateway_api = gateway_api
        self.grpc_port = self.http_port = self.monitoring_port = 0
        self.workdir: Path | None = None
        self.log_path = Path()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> Istiod:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        found = istiod_dir()
        apply_crds(self.kube, found / "crd-all.gen.yaml")
        if self.gateway_api:
            apply_crds(self.kube, found / "gateway-api-crds.yaml")
        api = config.new_client_from_config(str(self.kube.kubeconfig_path))
        try:
            with contextlib.suppress(client.ApiException):  # 409: it exists already
                client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        finally:
            api.close()
        self.workdir = Path(tempfile.mkdtemp(prefix="meshbridge-istiod-"))
        mesh = self.workdir / "mesh.yaml"
        mesh.write_text(MESH_CONFIG)
        self.grpc_port, self.http_port, self.monitoring_port = free_ports(3)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            "POD_NAMESPACE": NAMESPACE,
            "POD_NAME": "istiod-test",
            "REVISION": "default",
            "CLUSTER_ID": CLUSTER_ID,
            # No CA: it would need its own certificates and signs nothing we use.
            "ENABLE_CA_SERVER": "false",
            "PILOT_CERT_PROVIDER": "none",
            # No webhooks to patch, no Gateway API controller (its CRDs are absent).
            "INJECTION_WEBHOOK_CONFIG_NAME": "",
            "VALIDATION_WEBHOOK_CONFIG_NAME": "",
            "PILOT_ENABLE_GATEWAY_API": "true" if self.gateway_api else "false",
            "PILOT_ENABLE_GATEWAY_API_STATUS": "false",
            "PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER": "false",
            "PILOT_ENABLE_ALPHA_GATEWAY_API": "false",
        }
        argv = [str(found / "pilot-discovery"), "discovery",
                "--kubeconfig", str(self.kube.kubeconfig_path),
                "--meshConfig", str(mesh),
                "--networksConfig", str(self.workdir / "no-mesh-networks.yaml"),
                "--grpcAddr", f"127.0.0.1:{self.grpc_port}",
                "--httpAddr", f"127.0.0.1:{self.http_port}",
                "--monitoringAddr", f"127.0.0.1:{self.monitoring_port}",
                "--httpsAddr", "", "--secureGRPCAddr", "",
                "--domain", "cluster.local", "--clusterID", CLUSTER_ID,
                "--keepaliveMaxServerConnectionAge", "24h"]
        self.log_path = self.workdir / "istiod.log"
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, env=env, cwd=self.workdir,
                                      start_new_session=True)
        try:
            eventually_sync(self._ready, timeout=self.startup_timeout)
        except BaseException as exc:
            self.stop()
            raise IstiodError(f"istiod did not become ready: {exc}\n{self.log_tail()}") from exc

    def _ready(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise IstiodError(f"istiod exited with {self._proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/ready",
                                        timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"<no istiod log: {e}>"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        if self._log is not None:
            self._log.close()
            self._log = None


# ------------------------------------------------------------------ comparing answers


@dataclass(frozen=True, slots=True)
class XdsEndpoint:
    """What a proxy acts on in one LbEndpoint of a ClusterLoadAssignment."""

    address: str
    port: int
    region: str
    zone: str
    sub_zone: str
    priority: int
    locality_weight: int  # the LocalityLbEndpoints' load_balancing_weight (0: unset)
    weight: int  # the LbEndpoint's load_balancing_weight (0: unset)
    health: str  # UNKNOWN | HEALTHY | UNHEALTHY | DRAINING | ...
    # Its filter_metadata, every namespace (istiod: `istio` workload and
    # `envoy.transport_socket_match` tlsMode), as sorted JSON: one comparable value.
    metadata: str


def endpoint_metadata(lb: Any) -> str:
    return json.dumps(json_format.MessageToDict(lb.metadata).get("filterMetadata", {}),
                      sort_keys=True, separators=(",", ":"))


def cla_endpoints(cla: Any) -> dict[tuple[str, int], XdsEndpoint]:
    health = endpoint_components_pb2.LbEndpoint.DESCRIPTOR.fields_by_name[
        "health_status"].enum_type.values_by_number
    out = {}
    for loc in cla.endpoints:
        lw = loc.load_balancing_weight.value if loc.HasField("load_balancing_weight") else 0
        for lb in loc.lb_endpoints:
            sa = lb.endpoint.address.socket_address
            w = lb.load_balancing_weight.value if lb.HasField("load_balancing_weight") else 0
            ep = XdsEndpoint(sa.address, int(sa.port_value), loc.locality.region,
                             loc.locality.zone, loc.locality.sub_zone, int(loc.priority),
                             int(lw), int(w), health[lb.health_status].name,
                             endpoint_metadata(lb))
            out[(ep.address, ep.port)] = ep
    return out


def differences(ours: Any, theirs: Any) -> set[str]:
    """Every way two CLAs for one cluster differ, one line each: an address only one
    side has (with its health), or `<field> ours=<v> theirs=<v>` (an endpoint field is
    named once, not per endpoint, so that the set says which kinds of difference)."""
    a, b = cla_endpoints(ours), cla_endpoints(theirs)
    out = {f"only-ours {k[0]}:{k[1]} ({a[k].health})" for k in a.keys() - b.keys()}
    out |= {f"only-theirs {k[0]}:{k[1]} ({b[k].health})" for k in b.keys() - a.keys()}
    for key in a.keys() & b.keys():
        for name in XdsEndpoint.__slots__:
            va, vb = getattr(a[key], name), getattr(b[key], name)
            if va != vb:
                out.add(f"{name} ours={va!r} theirs={vb!r}")
    for name in ("overprovisioning_factor", "drop_overloads", "endpoint_stale_after"):
        va = getattr(ours.policy, name) if ours.HasField("policy") else None
        vb = getattr(theirs.policy, name) if theirs.HasField("policy") else None
        if str(va) != str(vb):
            out.add(f"policy.{name} ours={va!s} theirs={vb!s}".replace("\n", " "))
    return out
