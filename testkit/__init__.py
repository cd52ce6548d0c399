"""The test kit: what the tests, the benchmarks and the fuzz targets share, so that none
of them imports another's modules and no helper is written twice. New tests build on it.

    polling        eventually / eventually_seen / eventually_sync: the one way to wait
                   (poll with a deadline, never a bare sleep)
    net            free_port(s), http_get / http_text, ready (an admin port's /ready)
    recorders      ViewRecorder (a View subscriber that keeps every change),
                   HandlerRecorder (a gRPC server stand-in that keeps a layer's handlers)
    builders       Kubernetes-shaped manifests, decoded and applied to a Cluster
    xds_model      the model xDS clients: a Cluster, its Views and an xDS cache in
                   memory (World), driven by SotW and delta clients with real requests
    linkerd        the model Linkerd client (Get, GetProfile streams read with deadlines,
                   what an Update says) and manifest edits the files source picks up
    linkerd_policy the model Linkerd policy client (Watch, WatchPort) and its checks
    envoy          the tests' Envoy and waiting for it to hold what a test expects
    kubeapi        the kube-apiserver + etcd launcher (scripts/envtest.sh) and its
                   session fixture
    istiod         the istiod (pilot-discovery) launcher on that API server
    serving        StaticSource and serve_objects: meshbridge in this process on fixed
                   objects (benchmarks, fault and soak tests)
    processes      Child / commands / out_line: a client process talking JSON lines;
                   rss_kib

Nothing here is a test; nothing here is installed with the package.
"""
