"""Views: the one enriched, filtered endpoint set that every subscriber shares.

The shape is Linkerd's destination watcher (Linkerd §4.2, §4.6), one class per level,
each owning its own work; a parent only routes to its children:

    ViewRegistry   (registry.py)        every watched service port: routes each cluster
                                        change to the ports it touches, and each
                                        subscription to its View
    PortPublisher  (port_publisher.py)  one service port: merges its slices,
                                        deduplicates and enriches their endpoints
    View           (view.py)            one filter key of that port: filters, diffs,
                                        versions and reports its snapshot, holds its
                                        subscribers (Linkerd and xDS alike) and what
                                        the layers derive from it (derived.py)

A change is merged and enriched once per port, filtered and diffed once per View;
the View advances what each layer derives from it (its encoded bytes, once per
version), then hands the change to each subscriber, which only reads those and
queues. Subscribers must never block: they are called on the event loop.

Each level costs what changed: a slice event redoes that slice, a pod event that
pod's entries; a View filters and diffs only the endpoints that changed (unless a
topology-hint rule flips for the whole set); and a version is a persistent map
(snapshot.py), so publishing one copies nothing. A change to a Service, a Node, or
an object every endpoint of a namespace may depend on redoes what it touches.
"""

from bridge.views.derived import Derivation, Derived
from bridge.views.port_publisher import EMPTY_ENDPOINTS, PortPublisher
from bridge.views.registry import InvalidService, ViewRegistry
from bridge.views.snapshot import EndpointSnapshot, VersionedMap
from bridge.views.view import EMPTY, Snapshot, View, ViewChange, ViewSubscriber

__all__ = [
    "EMPTY",
    "EMPTY_ENDPOINTS",
    "Derivation",
    "Derived",
    "EndpointSnapshot",
    "InvalidService",
    "PortPublisher",
    "Snapshot",
    "VersionedMap",
    "View",
    "ViewChange",
    "ViewRegistry",
    "ViewSubscriber",
]
