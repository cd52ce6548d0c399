#!/usr/bin/env bash
# gcp_peer.sh: build bench/gcp_peer (our own small program on go-control-plane's
# LinearCache, the xDS peer of bench/gcp_compare.py) from the Go module proxy, once,
# and cache it (scripts/bench_go.sh). Prints, as the last line on stdout, the path of
# the executable.
set -euo pipefail

GCP_VERSION="${GCP_VERSION:-v0.14.0}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/bench_go.sh" gcp_peer \
  "github.com/envoyproxy/go-control-plane@${GCP_VERSION}"
