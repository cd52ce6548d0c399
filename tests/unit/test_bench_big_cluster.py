"""The big-cluster benchmark's own logic (bench/big_cluster.py, bench/meshed_cluster.py):
how a kept cluster's shape is checked against what the fill makes, where each shape
is kept, and its arguments. The benchmark itself runs in bench/, not here."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.big_cluster import failure_summary, object_counts, parse_args, size_dir
from bench.meshed_cluster import (
    PodPlace,
    Shape,
    count_mismatches,
    expected_counts,
    place_of,
    pod_body,
    pod_mismatches,
    pod_name,
    pod_places,
    pod_status,
    registry_prefix,
    sample_places,
)

SMALL = Shape(pods=45, pods_per_service=20, nodes=4, namespaces=2)


def test_expected_counts_follow_the_services_round_robin_over_namespaces() -> None:
    # Services 0 and 2 (20 and the last 5 pods) in mesh-0, service 1 (20) in mesh-1.
    counts = expected_counts(SMALL)
    assert counts["/registry/pods/mesh-0/"] == 25
    assert counts["/registry/pods/mesh-1/"] == 20
    assert counts["/registry/replicasets/mesh-0/"] == 2
    assert counts[registry_prefix("services", "mesh-1")] == 1
    assert counts["/registry/endpointslices/mesh-0/"] == 2
    assert counts["/registry/minions/"] == 4
    assert counts["/registry/namespaces/mesh-1"] == 1
    assert "/registry/namespaces/mesh-2" not in counts


def test_registry_prefixes_are_where_the_api_server_stores_the_kinds() -> None:
    assert registry_prefix("pods", "mesh-3") == "/registry/pods/mesh-3/"
    assert registry_prefix("endpointslices", "a") == "/registry/endpointslices/a/"
    assert registry_prefix("services", "a").startswith("/registry/services/")
    assert registry_prefix("services", "a").endswith("/a/")


def test_a_service_of_more_pods_than_a_slice_holds_has_several_slices() -> None:
    counts = expected_counts(Shape(pods=250, pods_per_service=250, nodes=3, namespaces=1))
    assert counts["/registry/endpointslices/mesh-0/"] == 3
    assert counts["/registry/pods/mesh-0/"] == 250


def test_object_counts_add_up_per_kind() -> None:
    assert object_counts(SMALL) == {"Pod": 45, "ReplicaSet": 3, "Service": 3,
                                    "EndpointSlice": 3, "Node": 4, "Namespace": 2}
    big = object_counts(Shape(pods=50_000))
    assert big["Pod"] == 50_000 and big["Service"] == 2_500 and big["Node"] == 100


def test_count_mismatches_name_each_prefix_that_differs() -> None:
    expected = expected_counts(SMALL)
    assert count_mismatches(expected, dict(expected)) == []
    found = {**expected, "/registry/pods/mesh-1/": 19}
    del found["/registry/minions/"]
    problems = count_mismatches(expected, found)
    assert len(problems) == 2
    assert any("/registry/pods/mesh-1/: 19 keys, expected 20" in p for p in problems)
    assert any("/registry/minions/: 0 keys, expected 4" in p for p in problems)


def stored_pod(shape: Shape, place: PodPlace) -> dict[str, object]:
    return {**pod_body(shape, place, "uid"), **pod_status(place)}


def test_the_pods_read_back_are_the_middle_and_the_last_never_the_first() -> None:
    places = list(pod_places(SMALL))
    assert sample_places(SMALL) == [places[22], places[44]]
    assert sample_places(Shape(pods=2)) == [place_of(Shape(pods=2), 1)]
    assert sample_places(Shape(pods=1)) == []


def test_a_pod_read_back_tells_a_shape_with_the_same_counts_apart() -> None:
    last = place_of(SMALL, 44)
    assert last == list(pod_places(SMALL))[-1]
    assert pod_mismatches(SMALL, last, stored_pod(SMALL, last)) == []
    # Eight nodes instead of four: every count but the Nodes' is the same, and the
    # pod's node differs.
    other = Shape(pods=45, pods_per_service=20, nodes=8, namespaces=2)
    problems = pod_mismatches(SMALL, last, stored_pod(other, place_of(other, 44)))
    assert problems == [f"pod {pod_name(last)}: node 'node-004', expected 'node-000'"]
    assert pod_mismatches(SMALL, last, None) == [f"pod {pod_name(last)}: missing"]


def test_each_shape_is_kept_in_a_directory_of_its_own() -> None:
    root = Path("/data")
    dirs = {size_dir(root, s) for s in (SMALL, Shape(pods=45), Shape(pods=45, nodes=4),
                                        Shape(pods=46))}
    assert len(dirs) == 4
    assert all(d.parent == root for d in dirs)


def test_failure_summary_counts_reasons_whatever_their_numbers() -> None:
    summary = failure_summary([
        "HTTP 429 storage is (re)initializing",
        "HTTP 429 storage is (re)initializing",
        "ERROR event Too large resource version: 12, current: 9 after 1 events, 3.0 s",
        "ERROR event Too large resource version: 15, current: 11 after 1 events, 3.1 s",
    ])
    assert summary == {"HTTP N storage is (re)initializing": 2,
                       "ERROR event Too large resource version: N, current: N after N "
                       "events, N s": 2}


def test_arguments() -> None:
    args = parse_args(["--pods", "10000,50000", "--data-dir", "/d", "--fill-only"])
    assert args.pods == [10_000, 50_000] and args.data_dir == Path("/d") and args.fill_only
    assert parse_args([]).pods == [10_000, 50_000]
    assert parse_args(["--pods", "500"]).data_dir is None


@pytest.mark.parametrize("argv", [
    ["--fill-only"],  # a fill kept nowhere
    ["--pods", "10k"],
    ["--pods", "10000,0"],
    ["--runs", "0"],
])
def test_bad_arguments_are_refused_with_a_message(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err
