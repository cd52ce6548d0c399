"""One resource cache per xDS type, behind the mux in `xds_api.cache`.

Each module holds one type's rules where they can be read together — how its
resources are named and built, what a wildcard subscription means for it, and what a
client asking for a name it does not know is sent:

* `endpoints` — EDS: ClusterLoadAssignments from the shared Views;
* `leds` — LEDS: one LbEndpoint resource per endpoint, in a glob collection per
  locality of a delta client's CLA;
* `clusters` — CDS: one Cluster per service port;
* `listeners` — LDS: the proxyless Listener of every service port;
* `routes` — RDS: the RouteConfiguration of every such Listener.

`type_cache` holds what every type shares (the seam, versions, the SotW and delta
reply rules); `ports` is the index of service ports that CDS, LDS and RDS are built
from.
"""
