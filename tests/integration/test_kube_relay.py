"""The Pods' first watch read by a relay process (bridge/sources/kube_relay.py), against
a real kube-apiserver: the watcher takes the relayed answer as its own first watch, the
state arrives through it, the relay ends once the state is in and the changes are
watched in-process from the state's resourceVersion; a refusal reads as the client's
own; a relay that dies leaves the state to be read in-process; and the pipe's
messages: a body the server ended ends the stream, any other end is an error."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from bridge.sources import kube_relay
from bridge.sources.kube import KINDS, KindWatcher
from bridge.sources.kube_api import ApiClient, ApiError, Credentials, load_credentials
from bridge.sources.kube_relay import PIECE, RelayedWatch, RelayError
from testkit.kubeapi import KubeAPIServer
from testkit.polling import HANG, eventually_sync
from tests.integration import test_kube_sync as sync
from tests.integration.test_kube_sync import Api, mine

kube_apiserver = sync.kube_apiserver
api = sync.api


@pytest.fixture
def creds(kube_apiserver: KubeAPIServer) -> Credentials:
    return load_credentials(str(kube_apiserver.kubeconfig_path))


@pytest.fixture
def pod_watcher(creds: Credentials) -> Iterator[tuple[KindWatcher, list[Any]]]:
    seen: list[Any] = []
    w = KindWatcher(KINDS["Pod"], ApiClient(creds), seen.append, None)
    yield w, seen
    w.stop()


def synced_through_a_relay(api: Api, creds: Credentials, w: KindWatcher, seen: list[Any],
                           pods: int, kill: bool = False) -> RelayedWatch:
    """`pods` pods made, the watcher started with a relay (killed first if `kill`),
    and synced: its state is those pods, once, whole."""
    for i in range(pods):
        api.pod(f"web-{i}", f"10.4.{int(kill)}.{i + 1}")
    relay = w.relayed = RelayedWatch.initial(creds, KINDS["Pod"])
    if kill:
        relay.proc.kill()
    w.start()
    eventually_sync(lambda: w.synced, HANG)
    assert [item[0] for item in seen] == ["replace"]
    assert {p.meta.name for p in mine(seen[0][2], api.ns)} == {f"web-{i}" for i in range(pods)}
    return relay


def test_the_state_comes_through_the_relay_and_the_changes_follow_in_process(
        api: Api, creds: Credentials, pod_watcher: tuple[KindWatcher, list[Any]]) -> None:
    w, seen = pod_watcher
    relay = synced_through_a_relay(api, creds, w, seen, 5)
    assert w.watch_list is True and w.relists == 1
    # The relay is for the start-up: once the state is in, it has been ended...
    eventually_sync(lambda: relay.proc.poll() is not None, 30)
    # ...and the watch goes on in-process, from the state's resourceVersion.
    api.pod("web-5", "10.4.0.6")
    eventually_sync(lambda: any(i[0] == "event" and i[1].obj.meta.name == "web-5"
                                and i[1].obj.meta.namespace == api.ns and i[1].obj.pod_ips
                                for i in seen), 30)
    assert w.relists == 1  # resumed, not read again


def test_a_refused_relayed_watch_reads_as_the_clients_own_refusal(
        creds: Credentials) -> None:
    wrong = dataclasses.replace(creds, headers={**creds.headers,
                                                "Authorization": "Bearer not-a-token"})
    with pytest.raises(ApiError) as direct:
        ApiClient(wrong).open(KINDS["Pod"].path, {"limit": 1}, read_timeout=10)
    relay = RelayedWatch.initial(wrong, KINDS["Pod"])
    with pytest.raises(ApiError) as relayed:
        relay.response()
    assert relayed.value.status == direct.value.status == 401
    assert relayed.value.reason == direct.value.reason
    assert relay.proc.poll() is not None  # ended with its answer


def test_a_relay_that_dies_leaves_the_state_to_be_read_in_process(
        api: Api, creds: Credentials, pod_watcher: tuple[KindWatcher, list[Any]]) -> None:
    w, seen = pod_watcher
    synced_through_a_relay(api, creds, w, seen, 3, kill=True)


FORKED = """
import sys
from bridge.sources.kube_api import load_credentials
from bridge.sources.kube_kinds import KINDS
from bridge.sources.kube_relay import RelayedWatch, _Forked

relay = RelayedWatch.initial(load_credentials(sys.argv[1]), KINDS["Pod"])
assert isinstance(relay.proc, _Forked), relay.proc
seen = b""
for piece in relay.response().stream():
    seen = seen[-64:] + piece
    if b"k8s.io/initial-events-end" in seen:
        break
relay.release_conn()
assert relay.proc.poll() is not None
print("state relayed")
"""


def test_a_process_of_one_thread_forks_its_relay(kube_apiserver: KubeAPIServer) -> None:
    """As `serve` does at start: the fork path, to the end of the state and ended."""
    got = subprocess.run([sys.executable, "-c", FORKED, str(kube_apiserver.kubeconfig_path)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert got.returncode == 0 and got.stdout.strip() == "state relayed", got.stderr


def test_a_relay_never_taken_is_ended_with_its_watcher(
        creds: Credentials, pod_watcher: tuple[KindWatcher, list[Any]]) -> None:
    w, _ = pod_watcher
    relay = w.relayed = RelayedWatch.initial(creds, KINDS["Pod"])
    w.stop()
    assert relay.proc.poll() is not None


def relayed(written: bytes) -> RelayedWatch:
    """A process that writes `written` as a relay would, and ends."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.buffer.write("
                             f"{written!r})"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=PIECE)
    assert proc.stdout is not None and proc.stdin is not None
    return RelayedWatch(proc, proc.stdout, proc.stdin)


def message(tag: bytes, payload: bytes) -> bytes:
    return kube_relay._HEAD.pack(tag, len(payload)) + payload


HEAD = message(b"H", b'{"status": 200, "reason": "OK", "content_type": "x/y"}')


def test_a_body_the_server_ended_ends_the_stream() -> None:
    watch = relayed(HEAD + message(b"D", b"one") + message(b"D", b"two") + message(b"Z", b""))
    try:
        assert watch.response().headers == {"Content-Type": "x/y"}
        assert list(watch.stream()) == [b"one", b"two"]
    finally:
        watch.release_conn()


@pytest.mark.parametrize("tail", [
    b"",  # the relay died between messages
    message(b"D", b"three")[:-2],  # ...or in the middle of one
    message(b"X", b"ReadTimeoutError: read timed out"),  # its read failed
])
def test_a_body_that_ends_otherwise_is_an_error(tail: bytes) -> None:
    watch = relayed(HEAD + message(b"D", b"one") + tail)
    try:
        stream = watch.response().stream()
        assert next(stream) == b"one"
        with pytest.raises(RelayError):
            next(stream)
    finally:
        watch.release_conn()


def test_a_relay_that_dies_before_answering_is_an_error() -> None:
    with pytest.raises(RelayError):
        relayed(b"").response()
