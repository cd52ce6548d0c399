"""Past one cluster: linked clusters (Linkerd's cluster store), each a Cluster cache of
its own, watched only as far as what is served from it (docs/multicluster.md)."""
