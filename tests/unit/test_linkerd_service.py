"""The destination service's wiring: its flags, its options, how it plugs into the
host, the one table that maps refusals to statuses, GetProfile streams that fall
behind, and how often a retried refusal is logged."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from bridge.model import ServiceKey
from bridge.sources.catalog import DEMO_DIR
from bridge.sources.files import FilesSource
from linkerd_api import errors
from linkerd_api.profile_streams import EndpointProfileKey, ProfileStream, ServiceProfileKey
from linkerd_api.service import (
    LAYER,
    STATUS_OF,
    DestinationService,
    LinkerdOptions,
    RepeatLog,
    options_from_args,
    register,
)
from meshbridge.app import App, ServeOptions
from meshbridge.cli import parse_args
from meshbridge.host import Host
from testkit.builders import load, pod, service
from testkit.recorders import HandlerRecorder


def app_with(*layer_options: object) -> App:
    return App(FilesSource(DEMO_DIR), None,
               ServeOptions("127.0.0.1:0", "127.0.0.1:0", layer_options=layer_options))


def host(app: App) -> Host:
    """What the App gives the destination layer."""
    return app.host_for(LAYER)


def test_serve_takes_the_semantics_and_queue_capacity_flags() -> None:
    args = parse_args(["serve", "--destination-semantics", "linkerd-2.20",
                                      "--stream-queue-capacity", "7"])
    assert (args.destination_semantics, args.stream_queue_capacity) == ("linkerd-2.20", 7)
    defaults = parse_args(["serve"])
    assert (defaults.destination_semantics, defaults.stream_queue_capacity) == ("proto", 100)


def test_the_flags_become_the_layers_typed_options() -> None:
    args = parse_args(["serve", "--destination-semantics", "linkerd-2.20",
                                      "--stream-queue-capacity", "7"])
    assert options_from_args(args) == LinkerdOptions("linkerd-2.20", 7)
    assert options_from_args(parse_args(["serve"])) == LinkerdOptions()


@pytest.mark.parametrize("argv", [
    ["--destination-semantics", "linkerd-2.19"],
    ["--stream-queue-capacity", "0"],
    ["--stream-queue-capacity", "many"],
])
def test_bad_flag_values_are_refused_by_the_parser(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["serve", *argv])


@pytest.mark.parametrize(("options", "reason"), [
    ({"semantics": "istio"}, "destination semantics"),
    ({"semantics": ""}, "destination semantics"),
    ({"stream_queue_capacity": -1}, "at least 1"),
    ({"stream_queue_capacity": 0}, "at least 1"),  # not quietly the default
    ({"stream_queue_capacity": True}, "at least 1"),
    ({"stream_queue_capacity": "9"}, "at least 1"),
])
def test_bad_options_stop_the_layer_from_starting(options: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        LinkerdOptions(**options)


def test_the_layer_reads_its_options_from_the_host_and_keeps_its_service_there() -> None:
    app = app_with(LinkerdOptions("linkerd-2.20", 3))
    server = HandlerRecorder()
    register(host(app), server)
    svc = app.service("linkerd")
    assert isinstance(svc, DestinationService)
    assert (svc.semantics, svc.capacity) == ("linkerd-2.20", 3)
    assert len(server.handlers) == 1 and "linkerd" in app.renderers


def test_without_options_the_layer_serves_the_defaults() -> None:
    app = app_with()
    register(host(app), HandlerRecorder())
    svc = app.service("linkerd")
    assert (svc.semantics, svc.capacity) == ("proto", 100)


async def test_stopping_the_host_closes_the_profile_registry() -> None:
    app = app_with()
    register(host(app), HandlerRecorder())
    profiles = app.service("linkerd").profiles
    load(app.cluster, service("web"))
    key = ServiceProfileKey(ServiceKey("app", "web"), "web.app.svc.cluster.local", 80, "")
    stream = ProfileStream(10, key, "ipv4:127.0.0.1:1", lambda _: None)
    profiles.subscribe(stream)
    assert len(stream) == 1 and not profiles.closed
    await app.stop()
    assert profiles.closed
    annotated = service("web")
    annotated["metadata"]["annotations"] = {"config.linkerd.io/opaque-ports": "80"}
    load(app.cluster, annotated)  # no longer heard: nothing is rebuilt for a stopped app
    assert len(stream) == 1


def test_every_refusal_has_exactly_one_status() -> None:
    kinds = {c for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, errors.DestinationError)
             and c is not errors.DestinationError}
    assert set(STATUS_OF) == kinds
    assert STATUS_OF[errors.UnknownService] == grpc.StatusCode.NOT_FOUND
    assert STATUS_OF[errors.AmbiguousAddress] == grpc.StatusCode.FAILED_PRECONDITION


def test_a_profile_stream_that_falls_behind_is_ended_counted_and_dropped() -> None:
    app = app_with()
    svc = DestinationService(host(app), LinkerdOptions(stream_queue_capacity=1))
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
    app = app_with()
    svc = DestinationService(host(app), LinkerdOptions(stream_queue_capacity=1))
    stream = ProfileStream(1, EndpointProfileKey("10.0.0.1", 8080), "peer",
                           svc._profile_overflow)
    svc.profiles.subscribe(stream)
    load(app.cluster, pod("web-a", "10.0.0.1"))
    assert stream.overflowed
    assert app.metrics.get_sample_value("endpoint_profile_updates_queue_overflow_total") == 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_refusal_is_logged_once_per_window_with_its_unlogged_repeats() -> None:
    clock = Clock()
    repeats = RepeatLog(60.0, clock=clock)
    assert repeats.admit("a") == 0
    assert [repeats.admit("a") for _ in range(3)] == [None, None, None]
    assert repeats.admit("b") == 0  # another target has its own window
    clock.now += 59.9
    assert repeats.admit("a") is None
    clock.now += 0.1
    assert repeats.admit("a") == 4  # the window is over: log, saying 4 went unlogged
    assert repeats.admit("a") is None


def test_the_repeat_log_forgets_old_keys_and_never_grows_past_its_bound() -> None:
    clock = Clock()
    repeats = RepeatLog(60.0, max_keys=2, clock=clock)
    assert (repeats.admit("a"), repeats.admit("b")) == (0, 0)
    assert repeats.admit("c") == 0  # full of live keys: logged, not remembered
    assert repeats.admit("c") == 0 and len(repeats.seen) == 2
    clock.now += 60
    assert repeats.admit("c") == 0  # a and b have expired and are forgotten
    assert repeats.admit("c") is None and set(repeats.seen) <= {"a", "b", "c"}
    assert len(repeats.seen) <= 2
