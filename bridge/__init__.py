"""meshbridge core: sources, cluster cache, enrichment, shared views."""
