"""A pod change that changes no endpoint sends nothing (issue #17 row 1), on the kube
source with a real kube-apiserver: the Objects and app fixtures of test_kube_source."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from testkit.linkerd import Stream, addrs, channel_to, kind
from testkit.polling import eventually
from tests.integration import test_kube_source as kube
from tests.integration.test_kube_source import WAIT, Objects

# The shared fixtures: a namespace of objects on the session's API server, and apps.
kube_apiserver = kube.kube_apiserver
api = kube.api
objs = kube.objs
start_app = kube.start_app


async def test_a_pod_label_that_changes_no_endpoint_sends_nothing_on_a_get_stream(
    objs: Objects, start_app: Callable[..., Any]
) -> None:
    node = objs.node("zone-a")
    objs.pod("web-1", "10.1.0.1", node)
    objs.pod("web-2", "10.1.0.2", node)
    objs.service()
    objs.put_slice("web-a", [("web-1", "10.1.0.1")])
    app = await start_app()
    target = f"web.{objs.ns}.svc.cluster.local:80"
    async with channel_to(app) as channel:
        stream = Stream(channel, "Get", target)
        first = await stream.next()
        assert kind(first) == "add" and addrs(first) == ["10.1.0.1:8080"]
        # A label and an annotation nothing reads: the cache takes the new pod object...
        objs.core.patch_namespaced_pod("web-1", objs.ns, {"metadata": {
            "labels": {"team": "blue"}, "annotations": {"example.com/note": "x"}}})
        key = (objs.ns, "web-1")
        await eventually(lambda: app.cluster.pods[key].meta.labels.get("team") == "blue",
                         WAIT)
        # ...then a real change. Both reach the View in that order, so the next message
        # being this change's proves the label change sent none.
        objs.put_slice("web-a", [("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")])
        second = await stream.next(WAIT)
        assert kind(second) == "add" and addrs(second) == ["10.1.0.2:8080"]
        stream.cancel()
