"""The destination service's wiring: its flags, its options, the one table that maps
refusals to statuses, and GetProfile streams that fall behind."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from bridge.model import ServiceKey
from bridge.sources import DEMO_DIR
from bridge.sources.files import FilesSource
from linkerd_api import errors
from linkerd_api.profile_streams import EndpointProfileKey, ProfileStream, ServiceProfileKey
from linkerd_api.service import STATUS_OF, DestinationService
from meshbridge.app import App, ServeOptions
from meshbridge.cli import parse_args
from tests.unit.builders import load, pod, service


def app_with(**extra: Any) -> App:
    return App(FilesSource(DEMO_DIR), None, ServeOptions("127.0.0.1:0", "127.0.0.1:0", extra))


def test_serve_takes_the_semantics_and_queue_capacity_flags() -> None:
    args = parse_args(["serve", "--destination-semantics", "linkerd-2.20",
                                      "--stream-queue-capacity", "7"])
    assert (args.destination_semantics, args.stream_queue_capacity) == ("linkerd-2.20", 7)
    defaults = parse_args(["serve"])
    assert (defaults.destination_semantics, defaults.stream_queue_capacity) == ("proto", 100)


@pytest.mark.parametrize("argv", [
    ["--destination-semantics", "linkerd-2.19"],
    ["--stream-queue-capacity", "0"],
    ["--stream-queue-capacity", "many"],
])
def test_bad_flag_values_are_refused_by_the_parser(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["serve", *argv])


@pytest.mark.parametrize(("extra", "reason"), [
    ({"destination_semantics": "istio"}, "destination semantics"),
    ({"destination_semantics": ""}, "destination semantics"),
    ({"stream_queue_capacity": -1}, "at least 1"),
    ({"stream_queue_capacity": 0}, "at least 1"),  # not quietly the default
    ({"stream_queue_capacity": True}, "at least 1"),
    ({"stream_queue_capacity": "9"}, "at least 1"),
])
def test_bad_options_stop_the_layer_from_starting(extra: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        DestinationService(app_with(**extra))


def test_every_refusal_has_exactly_one_status() -> None:
    kinds = {c for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, errors.DestinationError)
             and c is not errors.DestinationError}
    assert set(STATUS_OF) == kinds
    assert STATUS_OF[errors.UnknownService] == grpc.StatusCode.NOT_FOUND
    assert STATUS_OF[errors.AmbiguousAddress] == grpc.StatusCode.FAILED_PRECONDITION


def test_a_profile_stream_that_falls_behind_is_ended_counted_and_dropped() -> None:
    app = app_with(stream_queue_capacity=1)
    svc = DestinationService(app)
    load(app.cluster, service("web"))
    key = ServiceProfileKey(ServiceKey("app", "web"), "web.app.svc.cluster.local", 80, "")
    stream = ProfileStream(svc.capacity, key, "ipv4:127.0.0.1:1", svc._profile_overflow)
    svc.profiles.subscribe(stream)
    assert len(stream) == 1  # the first profile fills the queue
    annotated = service("web")
    annotated["metadata"]["annotations"] = {"config.linkerd.io/opaque-ports": "80"}
    load(app.cluster, annotated)  # a new profile that no longer fits
    assert stream.ended and stream.overflowed and len(stream) == 0
    assert app.metrics.get_sample_value("profile_updates_queue_overflow_total",
                                        {"fqn": "web.app.svc.cluster.local", "port": "80"}) == 1
    assert not svc.profiles.publications


def test_an_endpoint_profile_stream_that_falls_behind_is_counted_without_labels() -> None:
    app = app_with(stream_queue_capacity=1)
    svc = DestinationService(app)
    stream = ProfileStream(1, EndpointProfileKey("10.0.0.1", 8080), "peer",
                           svc._profile_overflow)
    svc.profiles.subscribe(stream)
    load(app.cluster, pod("web-a", "10.0.0.1"))
    assert stream.overflowed
    assert app.metrics.get_sample_value("endpoint_profile_updates_queue_overflow_total") == 1
