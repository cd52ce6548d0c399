"""`meshbridge mirror`: the service mirror, so that meshbridge works without Linkerd's
multicluster extension (docs/multicluster.md, "The mirror").

It reads the same links as `serve` (Linkerd's cluster-credentials Secrets in the
controller namespace, and `--link` flags) and keeps the local mirror and federated
Services (`bridge.multicluster.mirror`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

import structlog

from bridge.cluster import Cluster
from bridge.multicluster.links import LinkError, parse_link_flag
from bridge.multicluster.mirror import (
    MirrorController,
    Writer,
    exported_services_source,
    local_kinds,
)
from bridge.multicluster.mirror_rules import (
    DEFAULT_FEDERATED_SELECTOR,
    DEFAULT_REMOTE_DISCOVERY_SELECTOR,
    LinkRules,
    Selector,
    SelectorError,
)
from bridge.multicluster.store import ClusterStore
from bridge.sources.kube import KubeSource
from bridge.sources.kube_api import ApiClient
from meshbridge.log import LOG_LEVELS, configure_logging
from meshbridge.startup import StartupError, load_kube_credentials

log = structlog.get_logger("meshbridge.mirror")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None, help="the local cluster's kubeconfig")
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.add_argument("--controller-namespace", default="linkerd",
                   help="where the linked clusters' credentials Secrets are")
    p.add_argument("--link", action="append", default=[], metavar="NAME=KUBECONFIG[,...]",
                   help="link a cluster by flag (repeatable): NAME=KUBECONFIG"
                        "[,trust-domain=D][,cluster-domain=D]")
    p.add_argument("--remote-discovery-selector", default=DEFAULT_REMOTE_DISCOVERY_SELECTOR,
                   help="key=value[,key=value]: remote services mirrored as <svc>-<cluster>")
    p.add_argument("--federated-selector", default=DEFAULT_FEDERATED_SELECTOR,
                   help="key=value[,...]: services (remote and local) that join "
                        "<svc>-federated")
    p.add_argument("--excluded-labels", default="",
                   help="comma-separated label keys (or prefix/*) not copied")
    p.add_argument("--excluded-annotations", default="",
                   help="comma-separated annotation keys (or prefix/*) not copied")
    p.add_argument("--log-format", choices=("json", "console"), default="console",
                   help="json: one object a line; console: key=value for a terminal")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="the least severe level logged")


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    try:
        remote_discovery = Selector.parse(args.remote_discovery_selector)
        federated = Selector.parse(args.federated_selector)
        links = [parse_link_flag(text) for text in args.link]
    except (SelectorError, LinkError) as e:
        raise StartupError(str(e)) from None
    excluded_labels = tuple(filter(None, args.excluded_labels.split(",")))
    excluded_annotations = tuple(filter(None, args.excluded_annotations.split(",")))

    def rules(cluster: str, rank: int, domain: str = "cluster.local") -> LinkRules:
        return LinkRules(cluster, domain, remote_discovery, federated, excluded_labels,
                         excluded_annotations, rank)

    async def main() -> int:
        creds = await asyncio.to_thread(load_kube_credentials, args.kubeconfig, args.context)
        local = Cluster()
        source = KubeSource(credentials=creds,
                            kinds=local_kinds(args.controller_namespace))
        synced = asyncio.Event()
        tasks = [asyncio.create_task(source.run(local, synced), name="local")]
        await synced.wait()
        store = ClusterStore(local, args.controller_namespace, flag_links=links,
                             make_kube_source=exported_services_source)
        store.start()

        def rules_for(cluster: str) -> LinkRules:
            # The oldest link wins a federated Service's metadata: links rank in the
            # order they were made (flags first, then Secrets by name).
            order = list(store.linked)
            lc = store.get(cluster)
            return rules(cluster, order.index(cluster) + 1 if cluster in order else 0,
                         lc.link.cluster_domain if lc is not None else "cluster.local")

        controller = MirrorController(local, store, Writer(ApiClient(creds)), rules_for,
                                      rules("", 0))
        controller.start()
        tasks.append(asyncio.create_task(controller.run(), name="mirror"))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("mirroring", namespace=args.controller_namespace,
                 remote_discovery=args.remote_discovery_selector,
                 federated=args.federated_selector)
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({waiter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        store.stop()
        for task in (waiter, *tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for task in done:
            if task is not waiter and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return 0

    return asyncio.run(main())
