"""The informer cache: one `Cluster` per cluster, each a set of per-kind stores.

    change.py   Event, EventType (what a source sends) and ClusterChange (what one
                batch changed, as each kind's store reports it)
    store.py    KindStore: one kind's objects, indexes and change handler
    stores.py   the core kinds' stores and the registry a Cluster is built from
    cache.py    Cluster: composes the stores, keeps its identity and the listeners
                in declared stages
"""

from bridge.cluster.cache import Cluster, Listener, ListenerStage
from bridge.cluster.change import ClusterChange, Event, EventType, PodKey, SliceKey
from bridge.cluster.store import KindStore

__all__ = [
    "Cluster",
    "ClusterChange",
    "Event",
    "EventType",
    "KindStore",
    "Listener",
    "ListenerStage",
    "PodKey",
    "SliceKey",
]
