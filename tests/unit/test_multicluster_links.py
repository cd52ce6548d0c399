"""Linked clusters' configuration: Linkerd's Secret contract, --link, and what a local
Service wants from linked clusters (nothing here reaches a network)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import structlog

from bridge.model import ServiceKey
from bridge.multicluster.demand import Demand
from bridge.multicluster.links import (
    Link,
    LinkError,
    link_credentials,
    link_from_secret,
    parse_link_flag,
)
from bridge.multicluster.remote import PodScope, pod_scope
from bridge.multicluster.targets import Member, federation, remote_target, wanted_from
from bridge.objects import Meta, Secret, Service, decode_object

KUBECONFIG = json.dumps({
    "apiVersion": "v1", "kind": "Config",
    "clusters": [{"name": "east", "cluster": {"server": "https://127.0.0.1:6443",
                                              "insecure-skip-tls-verify": True}}],
    "users": [{"name": "sa", "user": {"token": "t0ken"}}],
    "contexts": [{"name": "east", "context": {"cluster": "east", "user": "sa"}}],
    "current-context": "east",
}).encode()

GOOD_LABELS = {"multicluster.linkerd.io/cluster-name": "east"}
GOOD_ANNOTATIONS = {"multicluster.linkerd.io/cluster-domain": "cluster.local",
                    "multicluster.linkerd.io/trust-domain": "east.local"}


def secret(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
           data: dict[str, bytes] | None = None) -> Secret:
    return Secret(Meta("cluster-credentials-east", "linkerd",
                       labels=GOOD_LABELS if labels is None else labels,
                       annotations=GOOD_ANNOTATIONS if annotations is None else annotations),
                  {"kubeconfig": KUBECONFIG} if data is None else data)


def test_a_secret_as_linkerd_multicluster_link_writes_it_is_a_link() -> None:
    link = link_from_secret(secret())
    assert (link.name, link.cluster_domain, link.trust_domain) == ("east", "cluster.local",
                                                                    "east.local")
    assert link.kubeconfig == KUBECONFIG
    assert link.origin == "Secret linkerd/cluster-credentials-east"


@pytest.mark.parametrize(("broken", "reason", "says"), [
    (secret(labels={}), "missing_label", "no multicluster.linkerd.io/cluster-name label"),
    (secret(annotations={"multicluster.linkerd.io/cluster-domain": "cluster.local"}),
     "missing_annotation", "no multicluster.linkerd.io/trust-domain annotation"),
    (secret(annotations={}), "missing_annotation",
     "no multicluster.linkerd.io/cluster-domain or multicluster.linkerd.io/trust-domain"),
    (secret(data={}), "missing_kubeconfig", "no 'kubeconfig' data key"),
    (secret(labels={"multicluster.linkerd.io/cluster-name": "East_1"}), "bad_name",
     "is not a DNS label"),
])
def test_a_secret_missing_what_linkerd_requires_says_what(broken: Secret, reason: str,
                                                           says: str) -> None:
    with pytest.raises(LinkError) as err:
        link_from_secret(broken)
    assert err.value.reason == reason
    assert says in str(err.value)
    assert str(err.value).startswith("Secret linkerd/cluster-credentials-east: ")


def test_only_remote_kubeconfig_secrets_are_decoded() -> None:
    raw = {"kind": "Secret", "type": "mirror.linkerd.io/remote-kubeconfig",
           "metadata": {"name": "c", "namespace": "linkerd", "labels": GOOD_LABELS},
           "data": {"kubeconfig": base64.b64encode(KUBECONFIG).decode()}}
    decoded = decode_object(raw)
    assert isinstance(decoded, Secret) and decoded.data["kubeconfig"] == KUBECONFIG
    assert decode_object({**raw, "type": "Opaque"}) is None
    manifest = {**raw, "data": None, "stringData": {"kubeconfig": "x: 1"}}
    assert decode_object(manifest).data == {"kubeconfig": b"x: 1"}  # type: ignore[union-attr]


def test_link_flags(tmp_path: Path) -> None:
    path = tmp_path / "east.kubeconfig"
    path.write_bytes(KUBECONFIG)
    link = parse_link_flag(f"east={path},trust-domain=east.local")
    assert (link.name, link.trust_domain, link.cluster_domain) == ("east", "east.local",
                                                                    "cluster.local")
    assert link.kubeconfig == KUBECONFIG and link.origin == "--link east"
    assert parse_link_flag(f"west={path}").trust_domain == "cluster.local"
    dev = parse_link_flag("north=files:/some/dir,cluster-domain=north.example")
    assert dev.dev_source == "files:/some/dir" and dev.cluster_domain == "north.example"


@pytest.mark.parametrize(("flag", "says"), [
    ("east", "expected NAME=KUBECONFIG"),
    ("EAST=/x", "is not a DNS label"),
    ("east=/no/such/file", "kubeconfig /no/such/file: No such file or directory"),
    ("east=files:/d,colour=blue", "unknown option 'colour=blue'"),
])
def test_bad_link_flags_say_what(flag: str, says: str) -> None:
    with pytest.raises(LinkError, match=says):
        parse_link_flag(flag)


def test_credentials_come_from_the_kubeconfigs_current_context() -> None:
    creds = link_credentials(link_from_secret(secret()))
    assert creds.host == "https://127.0.0.1:6443"
    assert creds.headers["Authorization"] == "Bearer t0ken"


@pytest.mark.parametrize(("kubeconfig", "says"), [
    (b"{not yaml", "kubeconfig does not parse"),
    (b"- a list", "kubeconfig is not a mapping"),
    (json.dumps({**json.loads(KUBECONFIG), "current-context": "west"}).encode(),
     "kubeconfig: "),
])
def test_a_kubeconfig_that_cannot_be_used_is_a_link_error(kubeconfig: bytes,
                                                          says: str) -> None:
    with pytest.raises(LinkError, match=says) as err:
        link_credentials(link_from_secret(secret(data={"kubeconfig": kubeconfig})))
    assert err.value.reason == "bad_kubeconfig" and err.value.cluster == "east"


def test_a_secret_rewritten_with_the_same_content_is_the_same_link() -> None:
    a, b = link_from_secret(secret()), link_from_secret(secret())
    assert a.fingerprint == b.fingerprint
    other = link_from_secret(secret(annotations={**GOOD_ANNOTATIONS,
                                                 "multicluster.linkerd.io/trust-domain": "x"}))
    assert other.fingerprint != a.fingerprint
    assert Link("e", "d", "t", "o", b"k").fingerprint != Link("e", "d", "t", "o",
                                                              b"k2").fingerprint


def svc(name: str, ns: str = "ns", labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        selector: dict[str, str] | None = None) -> Service:
    return Service(Meta(name, ns, labels=labels or {}, annotations=annotations or {}),
                   selector=selector)


def test_federated_members_are_read_in_the_services_namespace() -> None:
    fed = federation(svc("foo-federated", annotations={
        "multicluster.linkerd.io/remote-discovery": "foo@east, bar@north,broken,@x,a@b@c",
        "multicluster.linkerd.io/local-discovery": "foo"}))
    assert fed.remote == (Member("east", ServiceKey("ns", "foo")),
                          Member("north", ServiceKey("ns", "bar")))
    assert fed.local == Member("", ServiceKey("ns", "foo"))
    assert fed.malformed == ("broken", "@x", "a@b@c")


def test_the_federated_annotation_wins_over_the_remote_discovery_label() -> None:
    both = svc("foo-east", labels={"multicluster.linkerd.io/remote-discovery": "east",
                                   "multicluster.linkerd.io/remote-service": "foo"},
               annotations={"multicluster.linkerd.io/remote-discovery": "foo@north"})
    assert wanted_from(both) == {Member("north", ServiceKey("ns", "foo"))}
    mirror = svc("foo-east", labels={"multicluster.linkerd.io/remote-discovery": "east",
                                     "multicluster.linkerd.io/remote-service": "foo"})
    assert wanted_from(mirror) == {Member("east", ServiceKey("ns", "foo"))}
    unlabelled = svc("foo-east", labels={"multicluster.linkerd.io/remote-discovery": "east"})
    target = remote_target(unlabelled)
    assert target is not None and target.service is None
    assert wanted_from(unlabelled) == frozenset()


def test_demand_follows_the_local_services_that_name_linked_clusters() -> None:
    demand = Demand()
    mirror = svc("foo-east", labels={"multicluster.linkerd.io/remote-discovery": "east",
                                     "multicluster.linkerd.io/remote-service": "foo"})
    fed = svc("bar-federated", annotations={
        "multicluster.linkerd.io/remote-discovery": "bar@east,bar@north"})
    services = {ServiceKey("ns", "foo-east"): mirror, ServiceKey("ns", "bar-federated"): fed}
    assert demand.rebuild(services.values()) == {"east", "north"}
    assert demand.of("east") == {ServiceKey("ns", "foo"), ServiceKey("ns", "bar")}
    assert demand.of("north") == {ServiceKey("ns", "bar")}
    # The federated Service drops north: only north's wanted set changes.
    services[ServiceKey("ns", "bar-federated")] = svc("bar-federated", annotations={
        "multicluster.linkerd.io/remote-discovery": "bar@east"})
    assert demand.update(services, [ServiceKey("ns", "bar-federated")]) == {"north"}
    assert demand.of("north") == frozenset()
    # A layer's interest and a Service's add up: removing one keeps the other.
    assert demand.add_extra("east", [ServiceKey("ns", "foo")]) is False
    del services[ServiceKey("ns", "foo-east")]
    assert demand.update(services, [ServiceKey("ns", "foo-east")]) == set()
    assert demand.of("east") == {ServiceKey("ns", "foo"), ServiceKey("ns", "bar")}
    assert demand.remove_extra("east", [ServiceKey("ns", "foo")]) is True
    assert demand.of("east") == {ServiceKey("ns", "bar")}


def test_a_malformed_federated_entry_is_logged_once_and_the_rest_wanted() -> None:
    demand = Demand()
    fed = svc("bar-federated", annotations={
        "multicluster.linkerd.io/remote-discovery": "bar@east,oops"})
    services = {ServiceKey("ns", "bar-federated"): fed}
    with structlog.testing.capture_logs() as logs:
        demand.rebuild(services.values())
        demand.update(services, [ServiceKey("ns", "bar-federated")])  # looked at again
    assert [e["entries"] for e in logs] == [["oops"]]
    assert demand.of("east") == {ServiceKey("ns", "bar")}


def test_pods_are_asked_for_by_a_label_every_wanted_selector_sets() -> None:
    scope = pod_scope([svc("a", selector={"app": "a", "tier": "x"}),
                       svc("b", selector={"app": "b"}), None])
    assert scope.server_selector == "app in (a,b)"
    assert scope.keeps({"app": "a", "tier": "x", "other": "1"})
    assert not scope.keeps({"app": "a"})  # the server's candidate, not a match
    assert pod_scope([svc("a", selector={"x": "1"}),
                      svc("b", selector={"y": "2"})]).server_selector == ""
    assert pod_scope([svc("a", selector=None)]) == PodScope(everything=True)
    assert pod_scope([None]).empty
