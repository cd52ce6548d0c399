"""/metrics writes Linkerd's and Istio's counters under the names those control planes
expose (no `_total`), so their dashboards and alerts find them; the list is taken from
Linkerd 2.20's destination controller and istiod's pilot sources (docs/metrics.md)."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from meshbridge import exposition
from testkit.polling import HANG

# Counters as the upstream sources name them (read from linkerd/linkerd2
# controller/api/destination and istio/istio pilot/pkg/xds, pilot/pkg/model).
LINKERD = {"endpoint_updates_queue_overflow", "profile_updates_queue_overflow",
           "endpoint_profile_updates_queue_overflow", "endpoints_updates"}
ISTIO = {"pilot_xds_pushes", "pilot_total_xds_rejects", "pilot_xds_expired_nonce",
         "pilot_xds_write_timeout"}
# Gauges and histograms keep their names in every client library.
LINKERD_OTHERS = {"endpoints_subscribers", "endpoints_pods", "endpoints_exists",
                  "cluster_store_size"}  # the last: linked clusters (docs/metrics.md)
ISTIO_OTHERS = {"pilot_xds"}
# The issuer-lifetime gauge of Linkerd's identity controller (docs/linkerd.md).
LINKERD_IDENTITY = {"issuer_cert_ttl_seconds"}
# Names no one but meshbridge has, shown here so a rename is a visible change.
OURS = {"meshbridge_destination_streams", "meshbridge_destination_requests_refused_total",
        "meshbridge_policy_streams", "meshbridge_policy_requests_refused_total"}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=HANG) as r:
        return str(r.read().decode())


def test_the_upstream_list_is_the_one_the_exposition_uses() -> None:
    assert exposition.LINKERD_COUNTERS == LINKERD
    assert exposition.ISTIO_COUNTERS == ISTIO


async def test_linkerd_and_istio_counters_have_their_upstream_names(
        make_app: Any, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    text = await asyncio.to_thread(scrape, app.admin_port)
    types = {line.split()[2]: line.split()[3] for line in text.splitlines()
             if line.startswith("# TYPE ")}
    for name in LINKERD | ISTIO:
        assert types.get(name) == "counter", name
        assert f"{name}_total" not in text and f"{name}_created" not in text, name
    for name in LINKERD_OTHERS | ISTIO_OTHERS:
        assert name in types, name
    # Every pilot_* family is one istiod has; meshbridge's own are meshbridge_*.
    assert {n for n in types if n.startswith("pilot_")} <= ISTIO | ISTIO_OTHERS
    # The series are written under the plain name, and a Prometheus text parser reads
    # them as counters (prometheus_client's parser files counter samples as `_total`).
    assert "\npilot_xds_write_timeout 0.0\n" in text  # a counter without labels
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["pilot_xds_write_timeout"].type == "counter"
    assert [s.value for s in families["pilot_xds_write_timeout"].samples] == [0.0]
    # Every other family is meshbridge's own, the gRPC server's, or the client
    # library's process_* / python_* series.
    assert set(types) >= OURS
    upstream = LINKERD | ISTIO | LINKERD_OTHERS | ISTIO_OTHERS | LINKERD_IDENTITY
    own = ("meshbridge_", "grpc_server_", "process_", "python_")
    strays = {n for n in types if n not in upstream and not n.startswith(own)}
    assert not strays, strays
    # The gRPC counters are go-grpc-prometheus', which do end in _total.
    assert types.get("grpc_server_started_total") == "counter"
