#!/usr/bin/env bash
# gcp_peer.sh: build bench/gcp_peer (our own small program on go-control-plane's
# LinearCache, the xDS peer of bench/gcp_compare.py) from the Go module proxy, once,
# and cache it. Prints, as the last line on stdout, the path of the executable.
#
# The binary is cached in ${MESHBRIDGE_GOTOOL_CACHE:-~/.cache/meshbridge-gotools}/
# gcp-peer/VERSION-HASH/ (HASH: of main.go), built under a flock.
set -euo pipefail

GCP_VERSION="${GCP_VERSION:-v0.14.0}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="${HERE}/bench/gcp_peer/main.go"
HASH="$(sha1sum "${SRC}" | cut -c1-12)"
CACHE_ROOT="${MESHBRIDGE_GOTOOL_CACHE:-${HOME}/.cache/meshbridge-gotools}"
DEST="${CACHE_ROOT}/gcp-peer/${GCP_VERSION}-${HASH}"

log() { printf 'gcp-peer: %s\n' "$*" >&2; }

if [[ -x "${DEST}/gcp-peer" ]]; then
  printf '%s\n' "${DEST}/gcp-peer"
  exit 0
fi
mkdir -p "${DEST}"
exec 9>"${DEST}/.lock"
log "waiting for the build lock ${DEST}/.lock"
flock 9
if [[ -x "${DEST}/gcp-peer" ]]; then
  printf '%s\n' "${DEST}/gcp-peer"
  exit 0
fi
command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/meshbridge-gcp-peer.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT
log "building on github.com/envoyproxy/go-control-plane ${GCP_VERSION} with $(go version)"
start=${SECONDS}
(
  cd "${WORK}"
  cp "${SRC}" main.go
  printf 'module meshbridge.invalid/gcp-peer\n\ngo 1.24\n\nrequire github.com/envoyproxy/go-control-plane %s\n' \
    "${GCP_VERSION}" >go.mod
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o gcp-peer . >&2
)
mv -f "${WORK}/gcp-peer" "${DEST}/gcp-peer"
log "done in $((SECONDS - start))s"
printf '%s\n' "${DEST}/gcp-peer"
