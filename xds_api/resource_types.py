"""The xDS resource types meshbridge serves, and the rules that differ by type."""

from __future__ import annotations

from typing import Final

CLUSTER: Final = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER: Final = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE: Final = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
# LEDS (xDS §7): one endpoint per resource, in the glob collections a CLA names.
LB_ENDPOINT: Final = "type.googleapis.com/envoy.config.endpoint.v3.LbEndpoint"

# xDS §1.9 (make before break): on one ADS stream, responses go out CDS, then EDS,
# then LEDS (the endpoints of the collections a CLA names), then LDS, then RDS, so
# nothing refers to a resource the client does not have yet.
ORDER: Final = (CLUSTER, ENDPOINT, LB_ENDPOINT, LISTENER, ROUTE)

# xDS §7.1: glob collections are a delta-xDS feature; a SotW client never gets them.
DELTA_ONLY: Final = frozenset({LB_ENDPOINT})

# xDS §1.6: in SotW every CDS and LDS response carries the whole subscribed set (a
# missing one is deleted); EDS and RDS responses carry only what changed.
FULL_STATE: Final = frozenset({CLUSTER, LISTENER})

# xDS §1.5: only LDS and CDS have wildcard subscriptions.
WILDCARD_CAPABLE: Final = frozenset({CLUSTER, LISTENER})

SHORT: Final = {CLUSTER: "cds", ENDPOINT: "eds", LB_ENDPOINT: "leds", LISTENER: "lds",
                ROUTE: "rds"}
BY_SHORT: Final = {v: k for k, v in SHORT.items()}
# Each served type URL, as its own key: a request's copy looked up here is replaced by
# this module's string.
SERVED: Final = {t: t for t in SHORT}

WILDCARD: Final = "*"


def short_name(type_url: str) -> str:
    """`eds` for the EDS type URL; anything else is shown as its message name."""
    return SHORT.get(type_url) or type_url.rsplit("/", 1)[-1] or "unknown"
