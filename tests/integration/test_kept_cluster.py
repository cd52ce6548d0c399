"""A benchmark cluster kept between runs (bench.big_cluster --data-dir), against a
real etcd and kube-apiserver: what one API server fills into a kept etcd data dir, a
second one started on that dir serves, and the shape check finds it there exactly,
and tells a cluster of another shape, or one missing a pod, apart. Behaviour, not
timing."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from pathlib import Path

from bench.meshed_cluster import Etcd, Rest, Shape, fill, place_of, pod_name, shape_mismatches
from testkit.kubeapi import KubeAPIServer

SHAPE = Shape(pods=45, pods_per_service=20, nodes=4, namespaces=2)


def pods_listed(api: KubeAPIServer, namespace: str) -> int:
    req = urllib.request.Request(f"{api.url}/api/v1/namespaces/{namespace}/pods",
                                 headers={"Authorization": f"Bearer {api.token}"})
    context = ssl.create_default_context(cafile=str(api.ca_path))
    with urllib.request.urlopen(req, timeout=30, context=context) as resp:
        return len(json.load(resp)["items"])


def test_a_filled_cluster_is_found_again_by_a_second_api_server(tmp_path: Path) -> None:
    data = tmp_path / "etcd"
    with KubeAPIServer(etcd_data_dir=data) as first:
        etcd = Etcd(first.etcd_url)
        assert shape_mismatches(etcd, SHAPE)  # nothing there yet
        fill(Rest(first.url, first.token, str(first.ca_path), threads=2), etcd, SHAPE, 2)
        assert shape_mismatches(etcd, SHAPE) == []

    with KubeAPIServer(etcd_data_dir=data) as second:
        etcd = Etcd(second.etcd_url)
        assert shape_mismatches(etcd, SHAPE) == []
        assert pods_listed(second, "mesh-0") == 25 and pods_listed(second, "mesh-1") == 20

        # Eight nodes: the counts differ (Nodes) and so do the pods read back.
        other = shape_mismatches(etcd, Shape(pods=45, pods_per_service=20, nodes=8,
                                             namespaces=2))
        assert any(p.startswith("/registry/minions/") for p in other)
        assert any(p.startswith("pod ") and "node" in p for p in other)

        # A pod gone (a fill that stopped short; not one of those read back): its
        # namespace's count says so.
        key = f"/registry/pods/mesh-0/{pod_name(place_of(SHAPE, 40))}"
        etcd.pool.request("POST", etcd.url + "/v3/kv/deleterange", body=json.dumps(
            {"key": base64.b64encode(key.encode()).decode()}).encode())
        assert shape_mismatches(etcd, SHAPE) == [
            "/registry/pods/mesh-0/: 24 keys, expected 25"]
    assert (data / "member").is_dir()  # kept, not removed with the API server
