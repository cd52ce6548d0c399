"""Past one cluster: linked clusters (Linkerd's cluster store), each a Cluster cache of
its own, watched only as far as what is served from it (docs/multicluster.md)."""

# Seconds a cluster linked at start may hold /ready before it has synced (istiod's
# default); here, not in .store, so that the CLI's flags need none of the store's imports.
DEFAULT_SYNC_TIMEOUT = 30.0
