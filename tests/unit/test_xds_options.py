"""The xDS layer's typed options, and the one write it calls on either server."""

from __future__ import annotations

import argparse

import pytest

from meshbridge.host import nowait_writer
from xds_api.service import DEFAULT_WRITE_TIMEOUT, XdsOptions, add_arguments, options_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flags_become_typed_options() -> None:
    assert options_from_args(parse()) == XdsOptions(False, DEFAULT_WRITE_TIMEOUT)
    assert options_from_args(parse("--xds-draining", "--xds-write-timeout", "0.5")) == \
        XdsOptions(draining=True, write_timeout=0.5)


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("inf"), float("nan")])
def test_a_write_timeout_must_be_a_positive_number_of_seconds(timeout: float) -> None:
    with pytest.raises(ValueError, match="write timeout"):
        XdsOptions(write_timeout=timeout)
    with pytest.raises(ValueError, match="write timeout"):
        options_from_args(parse("--xds-write-timeout", str(timeout)))


def test_the_metadata_profile_defaults_to_istio_and_an_unknown_one_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert options_from_args(parse()).endpoint_metadata == "istio"
    assert options_from_args(parse("--xds-endpoint-metadata", "linkerd")).endpoint_metadata \
        == "linkerd"
    with pytest.raises(SystemExit):
        parse("--xds-endpoint-metadata", "consul")
    err = capsys.readouterr().err
    assert "invalid choice: 'consul'" in err and "'none', 'istio', 'linkerd'" in err
    with pytest.raises(ValueError, match="none, istio, linkerd"):
        XdsOptions(endpoint_metadata="consul")


def test_the_leds_threshold_is_a_whole_number_zero_or_more(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert options_from_args(parse()).leds_threshold == 1000
    assert options_from_args(parse("--xds-leds-threshold", "0")).leds_threshold == 0
    with pytest.raises(SystemExit):
        parse("--xds-leds-threshold", "-1")
    assert "must be 0 or more" in capsys.readouterr().err
    with pytest.raises(ValueError, match="LEDS threshold"):
        XdsOptions(leds_threshold=-3)


def test_draining_must_be_a_boolean() -> None:
    with pytest.raises(ValueError, match="draining"):
        XdsOptions(draining="yes")  # type: ignore[arg-type]


def test_a_server_without_a_synchronous_write_never_takes_a_message_at_once() -> None:
    class AioContext:
        pass

    class NativeContext:
        def __init__(self) -> None:
            self.queued: list[bytes] = []

        def write_nowait(self, message: bytes) -> bool:
            self.queued.append(message)
            return len(self.queued) < 2

    assert nowait_writer(AioContext())(b"x") is False
    native = NativeContext()
    write = nowait_writer(native)
    assert write(b"a") is True
    assert write(b"b") is False
    assert native.queued == [b"a", b"b"]
