"""Serving on many cores: one watcher, N worker processes (docs/workers.md).

    cores.py    `--workers N|auto` and its limit (the cores this process may use)
    watcher.py  the App's side: layers mounted for their services, the pool, what the
                admin port gathers
    pool.py     the worker processes: the held port, start, restart, stop
    process.py  one worker: its gRPC server, the layers' worker sides, the relay
    link.py     the channel between the watcher and one worker
    relay.py    methods without a worker side, run by the watcher for the workers
    counts.py   per-client-address counts shared by the workers (the port's limits)
    gather.py   /metrics and the stream pages summed over the processes
"""
