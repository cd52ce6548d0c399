"""`meshbridge shadow`'s field paths: messages flattened by their descriptors, the path
grammar, `--fields` patterns, and an unknown field refused before anything connects."""

from __future__ import annotations

import argparse
import asyncio
import io

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2

from harness.shadow import flat
from harness.shadow.cli import add_arguments, run_shadow
from harness.shadow.fields import (
    FieldFilter,
    Segment,
    flatten,
    known,
    linkerd_schema,
    listing,
    parse,
    xds_schema,
)
from linkerd_api.proto import destination_pb2


def test_every_set_field_of_a_weighted_addr_is_a_path() -> None:
    wa = destination_pb2.WeightedAddr(weight=10000)
    wa.addr.ip.ipv4 = 0x0A000001
    wa.addr.port = 8080
    wa.metric_labels.update({"pod": "web-1", "odd.key": "x"})
    wa.tls_identity.dns_like_identity.name = "web.ns.serviceaccount.identity.linkerd.local"
    wa.tls_identity.server_name.name = "web.ns.serviceaccount.identity.linkerd.local"
    wa.protocol_hint.h2.SetInParent()
    wa.protocol_hint.opaque_transport.inbound_port = 4143
    wa.authority_override.authority_override = "web.east:80"
    wa.http2.keep_alive.interval.seconds = 10
    assert flat.weighted_addr_key(wa) == "10.0.0.1:8080"
    assert flat.weighted_addr(wa) == {
        "weight": "10000",
        "metric_labels.\"odd.key\"": "x",
        "metric_labels.pod": "web-1",
        "tls_identity.dns_like_identity.name": "web.ns.serviceaccount.identity.linkerd.local",
        "tls_identity.server_name.name": "web.ns.serviceaccount.identity.linkerd.local",
        "protocol_hint.h2": "{}",
        "protocol_hint.opaque_transport.inbound_port": "4143",
        "authority_override.authority_override": "web.east:80",
        "http2.keep_alive.interval.seconds": "10",
    }


def test_repeated_fields_are_indexed_and_a_profile_is_flattened_whole() -> None:
    p = destination_pb2.DestinationProfile(fully_qualified_name="web.ns.svc.cluster.local",
                                           opaque_protocol=True)
    p.routes.add().timeout.seconds = 1
    p.retry_budget.retry_ratio = 0.2
    p.dst_overrides.add(authority="web:80", weight=900)
    assert flat.profile(p) == {
        "profile.routes[0].timeout.seconds": "1",
        "profile.retry_budget.retry_ratio": "0.2",
        "profile.dst_overrides[0].authority": "web:80",
        "profile.dst_overrides[0].weight": "900",
        "profile.opaque_protocol": "true",
        "profile.fully_qualified_name": "web.ns.svc.cluster.local",
    }


def test_struct_metadata_and_enums_are_read_as_values() -> None:
    lb = endpoint_pb2.ClusterLoadAssignment().endpoints.add().lb_endpoints.add()
    lb.metadata.filter_metadata["io.linkerd.destination"].update(
        {"identity": "a", "weight": 10000, "labels": {"pod": "p"}})
    lb.health_status = 3  # DRAINING
    assert flatten(lb) == {
        'metadata.filter_metadata."io.linkerd.destination".identity': "a",
        'metadata.filter_metadata."io.linkerd.destination".labels.pod': "p",
        'metadata.filter_metadata."io.linkerd.destination".weight': "10000.0",
        "health_status": "DRAINING",
    }


def test_paths_parse_into_segments_with_keys() -> None:
    assert parse('add[10.0.0.1:80].metadata."io.linkerd".x') == (
        Segment("add", "10.0.0.1:80"), Segment("metadata"), Segment("io.linkerd"),
        Segment("x"))
    with pytest.raises(ValueError):
        parse("add..weight")


@pytest.mark.parametrize(("pattern", "path", "ignored"), [
    ("add.metric_labels.pod", "add[10.0.0.1:80].metric_labels.pod", True),
    ("add.metric_labels", "add[10.0.0.1:80].metric_labels.zone", True),
    ("add.metric_labels.pod", "add[10.0.0.1:80].metric_labels.zone", False),
    ("add[10.0.0.2:80].weight", "add[10.0.0.1:80].weight", False),
    ("add[10.0.0.*].weight", "add[10.0.0.1:80].weight", True),
    ("profile.routes.timeout", "profile.routes[1].timeout.seconds", True),
    ("set.metric_labels.target_*", "set.metric_labels.target_cluster", True),
    ('endpoint.metadata.filter_metadata."io.linkerd.destination"',
     'endpoint[1.2.3.4:80].metadata.filter_metadata."io.linkerd.destination".identity', True),
])
def test_a_pattern_ignores_every_path_below_it(pattern: str, path: str, ignored: bool) -> None:
    assert FieldFilter([pattern]).ignores(path) is ignored


def test_the_schema_knows_every_field_and_nothing_else() -> None:
    linkerd, xds = linkerd_schema(), xds_schema()
    for pattern in ("add.weight", "add.metric_labels.anything", "add.tls_identity.server_name",
                    "add.http2.keep_alive.interval", "add.resource_ref", "set.metric_labels",
                    "profile.routes.condition.all.matches.path.regex", "profile.endpoint",
                    "profile.dst_overrides", "profile.status", "messages.redundant",
                    "add.*", "add[10.0.0.1:80].weight"):
        assert known(linkerd, pattern), pattern
    for pattern in ("add.nosuch", "weight", "profile.route", "endpoint.health_status"):
        assert not known(linkerd, pattern), pattern
    for pattern in ("endpoint.health_status", "endpoint.locality.zone", "endpoint.priority",
                    "endpoint.locality_load_balancing_weight",
                    "endpoint.metadata.filter_metadata.x.y.z",
                    "cla.policy.overprovisioning_factor", "endpoint.endpoint.hostname"):
        assert known(xds, pattern), pattern
    assert not known(xds, "add.weight")
    assert "add.metric_labels.<key>" in listing(linkerd)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--ours", "127.0.0.1:1", "--theirs", "127.0.0.1:2", *argv])


@pytest.mark.parametrize("api", ["linkerd", "xds"])
def test_an_unknown_field_is_refused_with_the_known_ones(
        api: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("--api", api, "--all", "--fields", "add.weight,nosuch.field")
    rc = asyncio.run(run_shadow(args, io.StringIO()))
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1  # one line
    known_here = "add.weight" if api == "linkerd" else "endpoint.health_status"
    assert "--fields: unknown field" in err and "'nosuch.field'" in err
    assert "known fields: " in err and known_here in err
    # Only the unknown ones are named: add.weight is a Linkerd field, not an xDS one.
    assert ("'add.weight'" in err) is (api == "xds")
