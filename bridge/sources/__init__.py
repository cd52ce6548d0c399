"""Sources: where Kubernetes objects come from. Each feeds the same Cluster the same way,
so nothing downstream can tell a manifest folder from a live API server.

    base.py      the Source protocol and SourceSpecError
    catalog.py   make_source: a source from its command-line name; DEMO_DIR
    files.py     a folder of manifests, polled (demo is files on demo/)
    sim.py       a synthetic cluster with seeded churn
    kube.py      list and watch a real API server (kube_api.py: its HTTP client and
                 credentials, shared with the start-up checks and TokenReview;
                 kube_kinds.py: the kinds and how each is asked for; kube_relay.py:
                 the Pods' first watch read by a process of its own at start)
"""
