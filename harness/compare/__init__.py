"""`meshbridge compare`: both addressing models side by side on the same sim churn.

`cli` is the command; `scenario` what a run is given, `run` the run itself (the server
in this process, `worker` the measuring clients in a child, `wire` the server-side
byte counts, `truth` the source's versions, `envoy_fleet` optional real Envoys);
`analysis`, `kube`, `figures`, `verdicts`, `markdown`, `charts` and `report` turn a
finished run into its report folder; `views` shows it while it runs.
"""
