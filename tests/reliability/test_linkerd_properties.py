"""Property-based tests for what a Linkerd proxy sends: context tokens and Get
requests. Random input is served or refused with a reason; it never raises anything
else, and well-formed input always reads back."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.authority import AuthorityError
from linkerd_api.authority import parse_context_token, parse_service_name, split_host_port
from linkerd_api.errors import BadRequest
from linkerd_api.proto import destination_pb2
from linkerd_api.writer import decode_request as _decode

WORD = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30)


@given(st.text(max_size=400))
def test_any_token_reads_as_some_form_and_never_raises(token: str) -> None:
    t = parse_context_token(token)
    assert t.form in ("empty", "json", "legacy", "invalid")
    if t.form != "json" and t.form != "legacy":
        assert (t.ns, t.node_name, t.pod) == ("", "", "")


@given(WORD, WORD, WORD, st.booleans())
def test_json_tokens_read_back_what_the_injector_wrote(ns: str, node: str, pod: str,
                                                       newline: bool) -> None:
    raw = json.dumps({"ns": ns, "nodeName": node, "pod": pod}) + ("\n" if newline else "")
    t = parse_context_token(raw)
    assert (t.ns, t.node_name, t.pod, t.form) == (ns, node, pod, "json")


@given(st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True))
def test_legacy_tokens_name_the_namespace(ns: str) -> None:
    t = parse_context_token(f"ns:{ns}")
    assert (t.ns, t.form) == (ns, "legacy")


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_get_requests_decode_or_are_refused_with_invalid_argument(raw: bytes) -> None:
    try:
        request = _decode(raw)
    except BadRequest:
        return
    parse_context_token(request.context_token)
    try:
        hp = split_host_port(request.path)
        assert 1 <= hp.port <= 65535
        if hp.ip is None:
            parse_service_name(hp.host, "cluster.local")
    except AuthorityError as e:
        assert str(e)


@given(st.text(max_size=300), st.text(max_size=300))
def test_any_path_and_token_in_a_well_formed_request_is_served_or_refused(
    path: str, token: str,
) -> None:
    raw = destination_pb2.GetDestination(scheme="k8s", path=path,
                                         context_token=token).SerializeToString()
    request = _decode(raw)
    assert request.path == path
    try:
        split_host_port(path)
    except AuthorityError as e:
        assert str(e)
