"""Authorities and context tokens, as the destination API reads them (Linkerd §2.1-2.3).

Tables, because the rules are tables. The last tests pin three core fixes found
while building the Linkerd layer (non-ASCII digits in ports; logging bound to a
closed stream).
"""

from __future__ import annotations

import io
import sys

import pytest
import structlog

from bridge.authority import AuthorityError
from bridge.model import ServiceKey
from bridge.port_sets import PortSpecError, parse_port_set, port_of_listen_addr
from linkerd_api.authority import (
    MAX_NAME_LENGTH,
    ContextToken,
    HostPort,
    ServiceName,
    parse_context_token,
    parse_service_name,
    split_host_port,
)
from meshbridge.log import configure_logging

LONG_NAME = "a" * 60 + "." + "b" * 60 + "." + "c" * 60 + "." + "d" * 60 + ".svc.cluster.local"


@pytest.mark.parametrize(("path", "expected"), [
    ("web.emojivoto.svc.cluster.local", HostPort("web.emojivoto.svc.cluster.local", 80)),
    ("web.emojivoto.svc.cluster.local:8080",
     HostPort("web.emojivoto.svc.cluster.local", 8080)),
    ("web.emojivoto.svc.cluster.local:1", HostPort("web.emojivoto.svc.cluster.local", 1)),
    ("web.emojivoto.svc.cluster.local:65535",
     HostPort("web.emojivoto.svc.cluster.local", 65535)),
    ("10.0.0.1:80", HostPort("10.0.0.1", 80)),
    ("10.0.0.1", HostPort("10.0.0.1", 80)),
    ("[2001:db8::1]:8080", HostPort("2001:db8::1", 8080)),
])
def test_authorities_split_into_host_and_port(path: str, expected: HostPort) -> None:
    assert split_host_port(path) == expected


@pytest.mark.parametrize(("path", "reason"), [
    ("", "empty"),
    ("web.emojivoto.svc.cluster.local:0", "invalid port 0"),
    ("web.emojivoto.svc.cluster.local:65536", "invalid port 65536"),
    ("web.emojivoto.svc.cluster.local:-1", "invalid port"),
    ("web.emojivoto.svc.cluster.local:http", "invalid port 'http'"),
    ("web.emojivoto.svc.cluster.local:", "invalid port ''"),
    ("web.emojivoto.svc.cluster.local:8080:9", "too many colons"),
    ("2001:db8::1", "too many colons"),
    ("[2001:db8::1", "unclosed"),
    ("[2001:db8::1]x", "after ']'"),
    ("web.emojivoto.svc.cluster.local:²", "invalid port"),  # isdigit() but not int()
    ("web.emojivoto.svc.cluster.local:٨٠", "invalid port"),  # Arabic-Indic "80"
    ("x" * 300, "longer than"),
    (LONG_NAME[:254].rstrip(".") + "x:80", "at most 253"),
])
def test_bad_authorities_say_why(path: str, reason: str) -> None:
    with pytest.raises(AuthorityError, match=reason):
        split_host_port(path)


def test_a_name_of_exactly_253_characters_is_accepted() -> None:
    name = ("a" * 61 + ".") * 4
    name = name[:MAX_NAME_LENGTH]
    assert split_host_port(f"{name}:80").host == name


@pytest.mark.parametrize(("host", "expected"), [
    ("web.emojivoto.svc.cluster.local", ServiceName(ServiceKey("emojivoto", "web"))),
    ("db-0.db.data.svc.cluster.local", ServiceName(ServiceKey("data", "db"), "db-0")),
    ("a.b.svc.cluster.local", ServiceName(ServiceKey("b", "a"))),
])
def test_service_names(host: str, expected: ServiceName) -> None:
    assert parse_service_name(host, "cluster.local") == expected


@pytest.mark.parametrize(("host", "domain", "reason"), [
    ("web", "cluster.local", "not <service>.<namespace>"),  # short name
    ("web.emojivoto", "cluster.local", "not <service>.<namespace>"),  # no default ns either
    ("web.svc.cluster.local", "cluster.local", "not <service>.<namespace>"),
    ("web.emojivoto.svc.cluster.local.", "cluster.local", "trailing dot"),
    ("web.emojivoto.svc.example.org", "cluster.local", "not <service>.<namespace>"),
    ("web.emojivoto.svc.cluster.local", "example.org", "not <service>.<namespace>"),
    ("x.db-0.db.data.svc.cluster.local", "cluster.local", "not <service>.<namespace>"),
    ("web..svc.cluster.local", "cluster.local", "not a DNS label"),
    ("-web.emojivoto.svc.cluster.local", "cluster.local", "not a DNS label"),
    ("web_1.emojivoto.svc.cluster.local", "cluster.local", "not a DNS label"),
    ("", "cluster.local", "not <service>.<namespace>"),
])
def test_names_that_are_not_fully_qualified_services_are_refused(
        host: str, domain: str, reason: str) -> None:
    with pytest.raises(AuthorityError, match=reason):
        parse_service_name(host, domain)


def test_a_multi_label_cluster_domain_is_matched_whole() -> None:
    assert parse_service_name("web.emojivoto.svc.corp.example.org", "corp.example.org") == \
        ServiceName(ServiceKey("emojivoto", "web"))


@pytest.mark.parametrize(("host", "ip"), [
    ("10.0.0.1", "10.0.0.1"),
    ("2001:0db8:0000::0001", "2001:db8::1"),  # normalised, as the pod index keys it
    ("::ffff:1.2.3.4", "::ffff:102:304"),  # stays IPv6, as in Go; normalised text
    ("fe80::1%eth0", None),  # Go's ParseIP takes no zone
    ("010.0.0.1", None),  # nor leading zeros
    ("web.emojivoto.svc.cluster.local", None),
])
def test_hosts_that_are_ip_addresses(host: str, ip: str | None) -> None:
    assert HostPort(host, 80).ip == ip


@pytest.mark.parametrize(("token", "expected"), [
    ("", ContextToken()),
    ('{"ns":"shop","nodeName":"node-a","pod":"web-1"}',
     ContextToken("shop", "node-a", "web-1", "json")),
    # The proxy injector writes the token with a trailing newline.
    ('{"ns":"shop", "nodeName":"node-a", "pod":"web-1"}\n',
     ContextToken("shop", "node-a", "web-1", "json")),
    ('{"ns":"shop"}', ContextToken(ns="shop", form="json")),
    ('{"ns":"shop","extra":[1,2]}', ContextToken(ns="shop", form="json")),
    ('{"ns":null}', ContextToken(form="json")),
    ("null", ContextToken(form="json")),
    ("ns:shop", ContextToken(ns="shop", form="legacy")),
    ("ns:shop:x", ContextToken(form="invalid")),
    ("nodeName:node-a", ContextToken(form="invalid")),
    ('{"ns": 7}', ContextToken(form="invalid")),  # a wrong type fails the whole token
    ('{"ns": "shop"', ContextToken(form="invalid")),
    ("[1, 2]", ContextToken(form="invalid")),
    ("garbage", ContextToken(form="invalid")),
    ("[" * 5000, ContextToken(form="invalid")),  # too long, and too deep for json
    ("[" * 3000, ContextToken(form="invalid")),  # deep nesting: RecursionError, caught
    (" \n", ContextToken()),
])
def test_context_tokens(token: str, expected: ContextToken) -> None:
    assert parse_context_token(token) == expected


# ------------------------------------------------------------------ core fixes


@pytest.mark.parametrize("text", ["²", "٨٠", "1,²"])
def test_port_lists_refuse_non_ascii_digits_with_a_port_error(text: str) -> None:
    # str.isdigit() accepts these; int() then crashed (²) or read 80 (٨٠).
    with pytest.raises(PortSpecError):
        parse_port_set(text)


def test_listen_addresses_with_non_ascii_digits_have_no_port() -> None:
    assert port_of_listen_addr("0.0.0.0:²") is None
    assert port_of_listen_addr("0.0.0.0:٤١٤٣") is None
    assert port_of_listen_addr("0.0.0.0:4143") == 4143


def test_logging_follows_the_current_stderr_not_the_one_it_was_set_up_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    try:
        configure_logging("json", "info")
        first.close()  # as pytest closes a test's captured stream
        monkeypatch.setattr(sys, "stderr", second)
        structlog.get_logger("t").warning("still heard", n=1)
    finally:
        structlog.reset_defaults()
    assert '"event": "still heard"' in second.getvalue()
