"""Measuring clients and the tools built on them: `meshbridge compare` and `meshbridge shadow`.

At this level, what both tools (and the tests and benchmarks) share: `clients` (Linkerd
and xDS measuring clients), `normalize` (both protocols' endpoints in one form) and
`envoy_process` (a real Envoy fed over ADS, and its admin API). `harness.compare` and
`harness.shadow` are the two tools, each with its command in `cli`.
"""
