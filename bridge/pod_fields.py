"""What of a Pod meshbridge reads, and so all the cache keeps of one.

A meshed pod's JSON is 10-25 KiB (the proxy's forty-odd environment variables, the
injector's annotations, volumes, statuses, managedFields); what enrichment and the
inbound policy read of it is its metadata's labels and owners, a few annotations,
its containers' names, ports and HTTP probes, the proxy's three listen addresses,
and where it runs. The decoders keep that and nothing else (istiod strips its Pods
the same way), so a pod in the cache costs what is read of it.
"""

from __future__ import annotations

PROXY_CONTAINER = "linkerd-proxy"
ENV_INBOUND = "LINKERD2_PROXY_INBOUND_LISTEN_ADDR"
ENV_ADMIN = "LINKERD2_PROXY_ADMIN_LISTEN_ADDR"
ENV_CONTROL = "LINKERD2_PROXY_CONTROL_LISTEN_ADDR"
# The proxy's environment variables read (enrich: opaque transport, the proxy's own
# ports); no other container's environment is read at all.
PROXY_ENV = frozenset({ENV_INBOUND, ENV_ADMIN, ENV_CONTROL})
# Pod annotations read (opaque and skipped ports, the default inbound policy, ports
# that require identity) are all Linkerd's configuration annotations.
ANNOTATION_PREFIX = "config.linkerd.io/"


def keeps_env(container: str, name: str) -> bool:
    return container == PROXY_CONTAINER and name in PROXY_ENV


def keeps_annotation(key: str) -> bool:
    return key.startswith(ANNOTATION_PREFIX)
