"""xds_api: Envoy xDS v3 (ADS SotW and delta) served from the shared views."""
