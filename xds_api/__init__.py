"""xds_api: Envoy xDS v3 (ADS SotW and delta) served from the shared views.

A bare `§N` in this package is a section of docs/protocol/xds.md.
"""
