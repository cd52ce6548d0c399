"""`meshbridge get` and `meshbridge profile` as people run them: a separate process
following a stream from a served demo cluster."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from linkerd_api.endpoint_streams import Semantics
from linkerd_api.service import LinkerdOptions
from testkit.linkerd import DEADLINE, edit

AppFactory = Any
WEB = "web.emojivoto.svc.cluster.local:80"


class Cli:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, app: Any, *args: str) -> Cli:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "meshbridge.cli", *args, "--server",
            f"127.0.0.1:{app.grpc_port}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        return cls(proc)

    async def line(self) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), DEADLINE)
        assert raw, "the client ended"
        return raw.decode().rstrip("\n")

    async def finish(self) -> tuple[int, str, str]:
        out, err = await asyncio.wait_for(self.proc.communicate(), DEADLINE)
        assert self.proc.returncode is not None
        return self.proc.returncode, out.decode(), err.decode()


def not_ready(doc: dict[str, Any]) -> dict[str, Any]:
    """One web endpoint (10.244.1.10) turns not ready."""
    for ep in doc.get("endpoints") or [] if doc.get("kind") == "EndpointSlice" else []:
        if "10.244.1.10" in ep.get("addresses", []):
            ep["conditions"] = {"ready": False}
    return doc


async def run(app: Any, *args: str) -> tuple[int, str, str]:
    return await (await Cli.start(app, *args)).finish()


async def test_get_prints_one_readable_line_per_endpoint(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    rc, out, _ = await run(app, "get", WEB, "--token", '{"nodeName":"node-b"}', "--count", "1")
    assert rc == 0
    head, *eps = out.splitlines()
    assert head == "add 2 endpoints  namespace=emojivoto service=web"
    assert len(eps) == 2
    line = next(e for e in eps if e.lstrip().startswith("10.244.2.10:8080"))
    for part in ("weight=10000",
                 "identity=web.emojivoto.serviceaccount.identity.linkerd.cluster.local",
                 "hint=h2 transport=4143", "zone=zone-b(local)", "pod=web-5d8f7b9c6-9zqtm"):
        assert part in line, part


async def test_get_follows_changes_until_its_count(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    cli = await Cli.start(app, "get", WEB, "--count", "2")
    assert (await cli.line()).startswith("add 2 endpoints")

    while True:  # skip the endpoint lines of the first message
        line = await cli.line()
        if not line.startswith("  "):
            break
        if line.strip().startswith("10.244.2.10"):
            edit(demo_dir, not_ready)
    rc, out, _ = await cli.finish()
    assert line == "remove 1 endpoint"
    assert out.splitlines() == ["  10.244.1.10:8080"] and rc == 0


async def test_get_into_a_reader_that_went_away_ends_quietly_as_unix_tools_do(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    """`meshbridge get ... | head -1`: once head has gone, the next message ends the
    client with SIGPIPE's status and nothing on stderr (it was a BrokenPipe traceback)."""
    app = await make_app(demo_dir)
    stderr = tmp_path / "stderr"
    cmd = (f"{sys.executable} -m meshbridge.cli get {WEB} --server 127.0.0.1:{app.grpc_port}"
           f" 2>{stderr} | head -1; echo status=${{PIPESTATUS[0]}}")
    proc = await asyncio.create_subprocess_exec("bash", "-c", cmd,
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
    assert first.decode().startswith("add 2 endpoints")

    edit(demo_dir, not_ready)  # head has gone: writing this change breaks the pipe
    rest, _ = await asyncio.wait_for(proc.communicate(), DEADLINE)
    assert rest.decode().splitlines() == ["status=141"]
    assert stderr.read_text() == ""


async def test_get_json_is_one_object_per_message_with_readable_addresses(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    rc, out, _ = await run(app, "get", "cart.shop.svc.cluster.local:8080", "--json",
                           "--count", "1")
    assert rc == 0
    lines = out.splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert sorted(a["addr"]["ip"] for a in doc["add"]["addrs"]) == [
        "fd00:10:244::1:30", "fd00:10:244::2:30"]
    assert doc["add"]["addrs"][0]["protocol_hint"]["opaque_transport"]["inbound_port"] == 4143


async def test_get_reports_a_refusal_and_exits_1(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    # A name of another cluster domain: the grammar takes it, the server refuses it.
    rc, out, err = await run(app, "get", "web.emojivoto.svc.example.org:80")
    assert rc == 1 and out == ""
    assert err.startswith(
        "error: INVALID_ARGUMENT: Invalid authority: web.emojivoto.svc.example.org:80")


async def test_get_with_a_timeout_prints_what_came_and_exits_0(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    rc, out, err = await run(app, "get", "payments.shop.svc.cluster.local:8080",
                             "--timeout", "1", "--token", "not json")
    assert rc == 0 and out == "no_endpoints exists=true\n"
    assert "will not understand this --token" in err


@pytest.mark.parametrize("command", ["get", "profile"])
@pytest.mark.parametrize("semantics", ["proto", "linkerd-2.20"])
async def test_a_name_that_matches_no_service_is_one_line_and_exit_1(
        make_app: AppFactory, demo_dir: Path, command: str, semantics: Semantics) -> None:
    # proto answers no_endpoints{exists: false}, Linkerd 2.20 NOT_FOUND; GetProfile
    # answers either with a default profile, so `profile` asks Get first.
    app = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics=semantics),))
    rc, out, err = await run(app, command, "nope.emojivoto:80", "--timeout", "10")
    assert rc == 1 and out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    assert "nope.emojivoto.svc.cluster.local:80" in err or "nope.emojivoto not found" in err


async def test_profile_of_a_service_with_no_endpoints_is_still_an_answer(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    rc, out, _ = await run(app, "profile", "payments.shop:8080", "--count", "1")
    assert rc == 0 and out.startswith("profile  fqn=payments.shop.svc.cluster.local")


async def test_get_says_when_the_server_ends_the_stream(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    cli = await Cli.start(app, "get", WEB)
    assert (await cli.line()).startswith("add 2 endpoints")
    await app.stop(grace=5)
    rc, _, err = await cli.finish()
    assert rc == 0 and "stream ended by the server (status OK)" in err


async def test_profile_prints_routes_budget_and_splits(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    rc, out, _ = await run(app, "profile", WEB, "--count", "1")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == ("profile  fqn=web.emojivoto.svc.cluster.local  opaque=false  "
                        "retry-budget=0.2x,min 10/s,ttl 10s")
    assert lines[1] == ("  route 'GET /api/list'  (method=GET and path~/api/list)  "
                        "timeout=300ms  retryable  failure: status 500-599")
    assert "  dst web-canary.emojivoto.svc.cluster.local:80  weight=1000" in lines
    assert "  parent Service emojivoto/web:80" in lines


async def test_profile_of_a_pod_ip_prints_its_endpoint(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    rc, out, _ = await run(app, "profile", "10.244.3.50:5432", "--count", "1")
    assert rc == 0
    head, endpoint = out.splitlines()
    assert head.startswith("profile  opaque=true")
    assert endpoint.startswith("  endpoint 10.244.3.50:5432  weight=10000  identity=db.data.")
    assert "hint=opaque transport=4143" in endpoint and "namespace=data" in endpoint
    rc, out, _ = await run(app, "profile", "10.244.3.50:5432", "--json", "--count", "1")
    assert json.loads(out)["endpoint"]["addr"] == {"ip": "10.244.3.50", "port": 5432}


async def test_profile_reports_a_missing_statefulset_pod(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    rc, _, err = await run(app, "profile", "db-7.db.data.svc.cluster.local:5432")
    assert rc == 1 and err.startswith("error: NOT_FOUND: no pod found")


async def test_an_unreachable_server_is_an_error(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    port = app.grpc_port
    await app.stop(grace=0.1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meshbridge.cli", "get", WEB, "--server", f"127.0.0.1:{port}",
        "--timeout", "2", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), DEADLINE)
    assert proc.returncode == 1 and err.decode().startswith("error: UNAVAILABLE")
