"""The admission webhook's decisions, without a socket: AdmissionReviews in, answers
out, one line per refusal naming the object, the field and the rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from admission.problems import from_reason
from admission.review import BadReview, answer, decide, parse
from admission.validators import Validators
from bridge.cluster import Cluster
from testkit.builders import load, service

NS = "shop"


def review(obj: dict[str, Any] | None, group: str, kind: str, version: str = "v1",
           operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": f"admission.k8s.io/{version}", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": group, "version": "v1", "kind": kind},
                        "namespace": NS, "operation": operation, "object": obj}}


def refused(obj: dict[str, Any], group: str, kind: str, cluster: Cluster | None = None) -> str:
    """The refusal's one line, or "" when admitted."""
    verdict = decide(review(obj, group, kind), Validators(cluster or Cluster()))
    assert verdict.allowed == (verdict.message == "")
    return verdict.message


def sp(spec: dict[str, Any], name: str = "web.shop.svc.cluster.local") -> dict[str, Any]:
    return {"apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


GOOD_ROUTE = {"name": "GET /books", "condition": {"method": "GET", "pathRegex": "/books"}}


@pytest.mark.parametrize(("spec", "line"), [
    ({"routes": []}, "spec.routes: a ServiceProfile needs at least one route"),
    ({"routes": [{"condition": {"method": "GET"}}]},
     "spec.routes[0].name: every route needs a name"),
    ({"routes": [{**GOOD_ROUTE, "timeout": "soon"}]},
     "spec.routes[0].timeout: invalid duration 'soon'"),
    ({"routes": [{"name": "r"}]}, "spec.routes[0].condition: is missing"),
    ({"routes": [{"name": "r", "condition": {}}]},
     "spec.routes[0].condition: must set at least one field"),
    ({"routes": [{"name": "r", "condition": {"all": [{"method": "GET"}, {}]}}]},
     "spec.routes[0].condition.all[1]: must set at least one field"),
    ({"routes": [{**GOOD_ROUTE, "responseClasses": [{"condition": {
        "status": {"min": 500, "max": 400}}}]}]},
     "spec.routes[0].responseClasses[0].condition.status: max 400 is below min 500"),
    ({"routes": [{**GOOD_ROUTE, "responseClasses": [{"condition": {
        "status": {"min": 700}}}]}]},
     "spec.routes[0].responseClasses[0].condition.status.min: 700 is not an HTTP status"),
    ({"routes": [GOOD_ROUTE], "retryBudget": {"retryRatio": 0.2}},
     "spec.retryBudget.ttl: a retry budget needs a TTL"),
    ({"routes": [GOOD_ROUTE], "retryBudget": {"retryRatio": -1, "ttl": "10s"}},
     "spec.retryBudget.retryRatio: must be a number >= 0"),
    ({"routes": [{**GOOD_ROUTE, "retries": 3}]},
     "spec.routes[0].retries: is not a ServiceProfile field"),
])
def test_a_service_profile_is_refused_with_the_rule_sp_validator_applies(
        spec: dict[str, Any], line: str) -> None:
    message = refused(sp(spec), "linkerd.io", "ServiceProfile")
    assert message.startswith(f"ServiceProfile {NS}/web.shop.svc.cluster.local: {line}"), \
        message
    assert "\n" not in message


def test_a_service_profile_name_must_be_a_dns_subdomain() -> None:
    message = refused(sp({"routes": [GOOD_ROUTE]}, name="Web_Profile"), "linkerd.io",
                      "ServiceProfile")
    assert "metadata.name: 'Web_Profile' is not a DNS-1123 subdomain" in message


def test_a_good_service_profile_is_admitted() -> None:
    assert refused(sp({"routes": [GOOD_ROUTE], "retryBudget": {
        "retryRatio": 0.2, "minRetriesPerSecond": 10, "ttl": "10s"}}),
        "linkerd.io", "ServiceProfile") == ""


def policy(kind: str, spec: dict[str, Any], name: str = "x",
           version: str = "policy.linkerd.io/v1beta3") -> dict[str, Any]:
    return {"apiVersion": version, "kind": kind, "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def test_a_server_with_a_bad_port_or_access_policy_is_refused() -> None:
    assert "spec.port: must be a port number or name" in refused(
        policy("Server", {"port": 0, "podSelector": {}}), "policy.linkerd.io", "Server")
    assert "spec.port: 'Http_Port' is not a port name" in refused(
        policy("Server", {"port": "Http_Port", "podSelector": {}}), "policy.linkerd.io",
        "Server")
    assert refused(policy("Server", {"port": "http-alt", "podSelector": {}}),
                   "policy.linkerd.io", "Server") == ""
    assert "spec.accessPolicy: 'open' is not one of" in refused(
        policy("Server", {"port": 80, "podSelector": {}, "accessPolicy": "open"}),
        "policy.linkerd.io", "Server")


def test_a_server_covering_another_server_s_pods_and_port_is_refused() -> None:
    cluster = Cluster()
    load(cluster, policy("Server", {"port": 8080, "podSelector": {"matchLabels": {
        "app": "web"}}}, name="first"))
    second = policy("Server", {"port": 8080, "podSelector": {"matchLabels": {"app": "web"}}},
                    name="second")
    assert f"spec.podSelector: Server {NS}/first already covers port 8080" in refused(
        second, "policy.linkerd.io", "Server", cluster)
    other_port = policy("Server", {"port": 9090, "podSelector": {"matchLabels": {
        "app": "web"}}}, name="second")
    assert refused(other_port, "policy.linkerd.io", "Server", cluster) == ""
    # The same Server updated is not in conflict with itself.
    itself = policy("Server", {"port": 8080, "podSelector": {"matchLabels": {"app": "web"}}},
                    name="first")
    assert refused(itself, "policy.linkerd.io", "Server", cluster) == ""


@pytest.mark.parametrize(("kind", "spec", "line"), [
    ("AuthorizationPolicy", {"targetRef": {"kind": "Pod", "name": "p"}},
     "spec.targetRef.kind: 'Pod': a policy targets"),
    ("AuthorizationPolicy", {"targetRef": {"kind": "Namespace", "name": "other"}},
     "spec.targetRef.name: cannot target another namespace (other)"),
    ("AuthorizationPolicy", {"targetRef": {"kind": "Server", "name": "s"},
                             "requiredAuthenticationRefs": [
                                 {"kind": "MeshTLSAuthentication", "name": "a"},
                                 {"kind": "MeshTLSAuthentication", "name": "b"}]},
     "spec.requiredAuthenticationRefs: only a single MeshTLSAuthentication may be set"),
    ("AuthorizationPolicy", {"targetRef": {"kind": "Server", "name": "s"},
                             "requiredAuthenticationRefs": [{"kind": "Secret", "name": "a"}]},
     "spec.requiredAuthenticationRefs: unsupported authentication kind(s): Secret"),
    ("MeshTLSAuthentication", {"identities": ["Not An Identity"]},
     "spec.identities[0]: 'Not An Identity' is not an identity"),
    ("MeshTLSAuthentication", {"identityRefs": [{"kind": "Namespace", "name": "a",
                                                 "namespace": "b"}]},
     "spec.identityRefs[0].namespace: a Namespace is cluster-scoped"),
    ("NetworkAuthentication", {"networks": []}, "spec.networks: is empty"),
    ("NetworkAuthentication", {"networks": [{"cidr": "10.0.0.0/8",
                                             "except": ["192.168.0.0/16"]}]},
     "spec.networks[0].except[0]: 192.168.0.0/16 is not inside 10.0.0.0/8"),
    ("NetworkAuthentication", {"networks": [{"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}]},
     "spec.networks[0].except[0]: 10.0.0.0/8 negates the whole of 10.0.0.0/8"),
    ("NetworkAuthentication", {"networks": [{"cidr": "ten"}]},
     "spec.networks[0].cidr: 'ten' is not a CIDR"),
])
def test_linkerd_policy_kinds_are_refused_by_the_policy_controller_s_rules(
        kind: str, spec: dict[str, Any], line: str) -> None:
    message = refused(policy(kind, spec), "policy.linkerd.io", kind)
    assert message.startswith(f"{kind} {NS}/x: {line}"), message


def gateway_route(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return policy(kind, spec, name="r", version="gateway.networking.k8s.io/v1")


def test_a_gateway_route_is_refused_for_a_bad_regex_or_a_port_its_service_lacks() -> None:
    cluster = Cluster()
    load(cluster, service("web", ns=NS, ports=[{"name": "http", "port": 80}]))
    parent = {"group": "core", "kind": "Service", "name": "web", "port": 80}
    bad_regex = gateway_route("HTTPRoute", {"parentRefs": [parent], "rules": [{"matches": [
        {"path": {"type": "RegularExpression", "value": "/books/(["}}]}]})
    # The route model's own problem (bridge.routes: RE2, as every client compiles it).
    assert "spec.rules[0].matches[0].path.value: RE2 cannot compile '/books/(['" \
        in refused(bad_regex, "gateway.networking.k8s.io", "HTTPRoute", cluster)
    perl_only = gateway_route("HTTPRoute", {"parentRefs": [parent], "rules": [{"matches": [
        {"path": {"type": "RegularExpression", "value": "/(?=books)"}}]}]})
    assert "RE2 cannot compile '/(?=books)'" in refused(
        perl_only, "gateway.networking.k8s.io", "HTTPRoute", cluster)
    wrong_port = gateway_route("GRPCRoute", {"parentRefs": [{**parent, "port": 81}]})
    assert f"spec.parentRefs[0].port: Service {NS}/web has no port 81 (its ports: 80)" in \
        refused(wrong_port, "gateway.networking.k8s.io", "GRPCRoute", cluster)
    # A route applied before its Service is admitted.
    assert refused(wrong_port, "gateway.networking.k8s.io", "GRPCRoute", Cluster()) == ""
    bad_weight = gateway_route("HTTPRoute", {"rules": [{"backendRefs": [
        {"name": "web", "port": 80, "weight": -1}]}]})
    assert "spec.rules[0].backendRefs[0].weight: must be a whole number >= 0" in refused(
        bad_weight, "gateway.networking.k8s.io", "HTTPRoute")


@pytest.mark.parametrize(("kind", "annotations", "line"), [
    ("Pod", {"config.linkerd.io/opaque-ports": "3306,70000"},
     "metadata.annotations[config.linkerd.io/opaque-ports]: '3306,70000': port 70000 out"),
    ("Pod", {"config.linkerd.io/skip-inbound-ports": "4190,admin"},
     "metadata.annotations[config.linkerd.io/skip-inbound-ports]: '4190,admin': not a port"),
    ("Service", {"config.linkerd.io/opaque-ports": "9000-8000"},
     "metadata.annotations[config.linkerd.io/opaque-ports]: '9000-8000': bad port range"),
])
def test_the_annotations_meshbridge_reads_must_parse(kind: str, annotations: dict[str, str],
                                                     line: str) -> None:
    obj = {"apiVersion": "v1", "kind": kind,
           "metadata": {"name": "x", "namespace": NS, "annotations": annotations}}
    assert refused(obj, "", kind).startswith(f"{kind} {NS}/x: {line}")


def test_port_names_in_opaque_ports_are_admitted() -> None:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "x", "namespace": NS,
        "annotations": {"config.linkerd.io/opaque-ports": "mysql,3306,4000-4010"}}}
    assert refused(obj, "", "Pod") == ""


def test_a_kind_not_ours_is_allowed_with_a_warning_and_a_delete_is_allowed() -> None:
    validators = Validators(Cluster())
    verdict = decide(review({"metadata": {"name": "c"}}, "", "ConfigMap"), validators)
    assert verdict.allowed and verdict.reason == "not_ours"
    out = answer(review({"metadata": {"name": "c"}}, "", "ConfigMap"), verdict)
    assert out["response"]["warnings"] == [
        "meshbridge does not validate core/ConfigMap; admitted unchecked"]
    assert decide(review(None, "linkerd.io", "ServiceProfile", operation="DELETE"),
                  validators).allowed


def test_the_answer_has_the_request_s_version_and_uid_and_a_status_when_refused() -> None:
    r = review(sp({"routes": []}), "linkerd.io", "ServiceProfile", version="v1beta1")
    out = answer(r, decide(r, Validators(Cluster())))
    assert out["apiVersion"] == "admission.k8s.io/v1beta1" and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "u-1" and response["allowed"] is False
    assert response["status"]["code"] == 400 and "spec.routes" in response["status"]["message"]


@pytest.mark.parametrize(("body", "why"), [
    (b"\xff\xfe not json", "the body is not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview",
                 "request": {"uid": "1", "kind": {}}}).encode(),
     "apiVersion 'admission.k8s.io/v2' is not one of"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}).encode(),
     "kind 'Pod' is not AdmissionReview"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"kind": {}}}).encode(), "the request has no uid"),
])
def test_garbage_is_a_bad_review_saying_why(body: bytes, why: str) -> None:
    with pytest.raises(BadReview, match=why.replace("(", r"\(").replace(".", r"\.")):
        parse(body)


def test_a_decoder_reason_splits_into_path_and_rule() -> None:
    p = from_reason("spec.routes[0].condition must set at least one field")
    assert (p.path, p.rule) == ("spec.routes[0].condition", "must set at least one field")
    p = from_reason("names no identities (spec.identities, spec.identityRefs)")
    assert (p.path, p.rule) == ("", "names no identities (spec.identities, spec.identityRefs)")
