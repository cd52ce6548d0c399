#!/usr/bin/env bash
# bench_go.sh: build one of the benchmarks' own Go programs, bench/NAME/main.go, from
# the Go module proxy, once, and cache it. Prints, as the last line on stdout, the
# path of the executable.
#
# Usage: scripts/bench_go.sh NAME [MODULE@VERSION ...]
#   NAME  a folder of bench/ (sotw_client: bench.fanout's SotW client; gcp_peer:
#         scripts/gcp_peer.sh) with a main.go and either a go.mod that pins what it
#         requires or, on the command line, the modules to require
#
# The binary is cached in ${MESHBRIDGE_GOTOOL_CACHE:-~/.cache/meshbridge-gotools}/
# NAME/HASH/ (HASH: of the main.go and the go.mod it is built with), under a flock.
set -euo pipefail

[[ $# -ge 1 ]] || { echo "usage: $0 NAME [MODULE@VERSION ...]" >&2; exit 2; }
NAME="$1"
shift
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="${HERE}/bench/${NAME}"
if [[ -f "${SRC}/go.mod" ]]; then
  GOMOD="$(cat "${SRC}/go.mod")"
else
  GOMOD="$(printf 'module meshbridge.invalid/%s\n\ngo 1.24\n' "${NAME}"
           for pin in "$@"; do printf '\nrequire %s %s\n' "${pin%@*}" "${pin#*@}"; done)"
fi
[[ -f "${SRC}/main.go" ]] || { echo "$0: no ${SRC}/main.go" >&2; exit 2; }
HASH="$( (cat "${SRC}/main.go"; printf '%s' "${GOMOD}") | sha1sum | cut -c1-12)"
CACHE_ROOT="${MESHBRIDGE_GOTOOL_CACHE:-${HOME}/.cache/meshbridge-gotools}"
DEST="${CACHE_ROOT}/${NAME}/${HASH}"

log() { printf '%s: %s\n' "${NAME}" "$*" >&2; }

if [[ -x "${DEST}/${NAME}" ]]; then
  printf '%s\n' "${DEST}/${NAME}"
  exit 0
fi
mkdir -p "${DEST}"
exec 9>"${DEST}/.lock"
log "waiting for the build lock ${DEST}/.lock"
flock 9
if [[ -x "${DEST}/${NAME}" ]]; then
  printf '%s\n' "${DEST}/${NAME}"
  exit 0
fi
command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/meshbridge-${NAME}.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT
log "building with $(go version)"
start=${SECONDS}
(
  cd "${WORK}"
  cp "${SRC}/main.go" .
  printf '%s\n' "${GOMOD}" >go.mod
  go mod tidy >&2  # the go.sum for the pinned requirements and what they need
  go build -trimpath -ldflags "-s -w" -o "${NAME}" . >&2
)
mv -f "${WORK}/${NAME}" "${DEST}/${NAME}"
log "done in $((SECONDS - start))s"
printf '%s\n' "${DEST}/${NAME}"
