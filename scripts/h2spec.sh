#!/usr/bin/env bash
# h2spec.sh: provide h2spec, the HTTP/2 conformance suite, for the integration
# test that runs it against meshbridge's own gRPC server. It is built from
# source with the local Go toolchain from modules served by the Go module proxy.
#
# Usage: scripts/h2spec.sh
#   Prints, as the last line on stdout, the path of an executable `h2spec`.
#   All progress output goes to stderr.
#
# scripts/gotool.sh builds and caches it (so every run after the first returns at
# once).
#
# Knobs (environment):
#   MESHBRIDGE_H2SPEC_VERSION  h2spec release to build (default below)
#   MESHBRIDGE_GOTOOL_CACHE    cache root (scripts/gotool.sh)
set -euo pipefail

# v2.2.1 (February 2019) is the newest tag on the module proxy. It predates
# Go modules (hence +incompatible) and has no go.mod, so the modules it imports
# are pinned here. Not to the 2016 revisions its Gopkg.lock names: that
# golang.org/x/net framer rejects a HEADERS frame with an empty header block
# (legal HTTP/2; x/net fixed it later), so h2spec would report a server that
# ends a response with empty trailers as broken and skip the rest of the case.
H2SPEC_VERSION="${MESHBRIDGE_H2SPEC_VERSION:-2.2.1}"
H2SPEC_DEPS=(
  golang.org/x/net@v0.62.0
  github.com/spf13/cobra@v1.10.2
  github.com/fatih/color@v1.19.0
)
exec bash "$(dirname "$0")/gotool.sh" h2spec github.com/summerwind/h2spec \
  "v${H2SPEC_VERSION}+incompatible" github.com/summerwind/h2spec/cmd/h2spec "${H2SPEC_DEPS[@]}"
