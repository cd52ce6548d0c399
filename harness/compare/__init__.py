"""`meshbridge compare`: the addressing models side by side on the same sim churn.

`cli` is the command; `scenario` what a run is given, `run` the run itself (the server
in this process, `worker` each model's measuring clients in a child process of their
own, `leds` the LEDS client, `wire` the server-side byte counts, `truth` the source's
versions, `environment` what the run ran on, `envoy_fleet` optional real Envoys);
`analysis`, `kube`, `figures`, `verdicts`, `markdown`, `charts` and `report` turn a
finished run (and, with `--isolate`, each model's run alone) into its report folder;
`views` shows it while it runs.
"""
