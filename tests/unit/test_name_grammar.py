"""bridge.authority.parse_target: the one grammar of the names people type."""

from __future__ import annotations

import pytest

from bridge.authority import AuthorityError, parse_target


@pytest.mark.parametrize(("text", "canonical"), [
    ("web.emojivoto", "web.emojivoto.svc.cluster.local:80"),
    ("web.emojivoto:8080", "web.emojivoto.svc.cluster.local:8080"),
    ("web.emojivoto.svc", "web.emojivoto.svc.cluster.local:80"),
    ("web.emojivoto.svc.cluster.local:80", "web.emojivoto.svc.cluster.local:80"),
    ("web.emojivoto.svc.example.org:443", "web.emojivoto.svc.example.org:443"),
    ("web-0.web.emojivoto.svc.cluster.local:80", "web-0.web.emojivoto.svc.cluster.local:80"),
    ("web-0.web.emojivoto.svc:80", "web-0.web.emojivoto.svc.cluster.local:80"),
    ("outbound|80||web.emojivoto.svc.cluster.local", "web.emojivoto.svc.cluster.local:80"),
    ("outbound|9090||web.emojivoto", "web.emojivoto.svc.cluster.local:9090"),
    ("10.0.0.1:80", "10.0.0.1:80"),
    ("[fd00::1]:80", "[fd00::1]:80"),
])
def test_every_spelling_of_a_name_becomes_the_canonical_authority(
        text: str, canonical: str) -> None:
    assert parse_target(text) == canonical


def test_short_names_are_completed_with_the_cluster_domain() -> None:
    assert parse_target("web.emojivoto:80", "corp.example") == \
        "web.emojivoto.svc.corp.example:80"


@pytest.mark.parametrize(("text", "says"), [
    ("web", "expected <svc>.<ns>[:port]"),
    ("a.b.c", "expected <svc>.<ns>[:port]"),
    ("web.emojivoto.", "empty DNS label"),
    ("Web.emojivoto", "'Web' is not a DNS label"),
    ("web.emojivoto:0", "invalid port 0"),
    ("web.emojivoto:http", "invalid port 'http'"),
    ("outbound|80|v1|web.emojivoto", "subset 'v1'"),
    ("inbound|80||web.emojivoto", "use outbound"),
    ("outbound||web.emojivoto", "outbound|<port>|<subset>|<host>"),
    ("outbound|||web.emojivoto", "missing port"),
    ("", "empty authority"),
])
def test_a_bad_name_is_refused_quoting_it_and_saying_why(text: str, says: str) -> None:
    with pytest.raises(AuthorityError) as e:
        parse_target(text)
    assert str(e.value).startswith(f"name {text!r}: ") and says in str(e.value)
