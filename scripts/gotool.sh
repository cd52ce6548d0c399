#!/usr/bin/env bash
# gotool.sh: build a Go command-line tool from the Go module proxy with the local Go
# toolchain, once, and cache it. The peers the tests run that are Go modules (h2spec,
# helm, ...) are built this way; scripts/envtest.sh builds kube-apiserver and etcd.
#
# Usage: scripts/gotool.sh NAME MODULE VERSION PACKAGE [MODULE@VERSION ...]
#   NAME     the binary's name (and the cache folder's)
#   MODULE   the module that holds the tool, at VERSION (as the module proxy spells it)
#   PACKAGE  the main package to install
#   the rest pins dependencies (for a module whose own go.mod does not, or has none)
#   Prints, as the last line on stdout, the path of the executable; progress goes to
#   stderr.
#
# The binary is cached in ${MESHBRIDGE_GOTOOL_CACHE:-~/.cache/meshbridge-gotools}/
# NAME/VERSION/NAME, with the pins it was built with; concurrent runs are serialised
# with flock and the binary is moved into place only once complete.
set -euo pipefail

[[ $# -ge 4 ]] || { echo "usage: $0 NAME MODULE VERSION PACKAGE [MODULE@VERSION ...]" >&2; exit 2; }
NAME="$1" MODULE="$2" VERSION="$3" PACKAGE="$4"
shift 4
PINS=("$@")
CACHE_ROOT="${MESHBRIDGE_GOTOOL_CACHE:-${HOME}/.cache/meshbridge-gotools}"
DEST="${CACHE_ROOT}/${NAME}/${VERSION}"
STAMP="${MODULE} ${VERSION} ${PACKAGE} ${PINS[*]:-}"

log() { printf '%s: %s\n' "${NAME}" "$*" >&2; }
cached() { [[ -x "${DEST}/${NAME}" && "$(cat "${DEST}/.built" 2>/dev/null)" == "${STAMP}" ]]; }

if cached; then  # fast path: no lock, no Go
  printf '%s\n' "${DEST}/${NAME}"
  exit 0
fi
mkdir -p "${DEST}"
exec 9>"${DEST}/.lock"
if command -v flock >/dev/null 2>&1; then
  log "waiting for the build lock ${DEST}/.lock"
  flock 9
fi
if cached; then
  printf '%s\n' "${DEST}/${NAME}"
  exit 0
fi
command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0
export GOFLAGS="-mod=mod -buildvcs=false"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/meshbridge-${NAME}.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT
log "building ${MODULE}@${VERSION} with $(go version)"
start=${SECONDS}
(
  # A throwaway module that requires the tool and the pins; go mod tidy adds what
  # those need, as their own go.mod files fix it.
  mkdir -p "${WORK}/mod" "${WORK}/bin"
  cd "${WORK}/mod"
  {
    printf 'module meshbridge.invalid/%s\n\ngo 1.24\n\nrequire (\n\t%s %s\n' \
      "${NAME}" "${MODULE}" "${VERSION}"
    for pin in "${PINS[@]}"; do
      printf '\t%s %s\n' "${pin%@*}" "${pin#*@}"
    done
    printf ')\n'
  } >go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "${PACKAGE}" >tools.go
  go mod tidy >&2
  GOBIN="${WORK}/bin" go install -trimpath -ldflags "-s -w" "${PACKAGE}" >&2
)
mv -f "${WORK}/bin/${NAME}" "${DEST}/${NAME}"
printf '%s\n' "${STAMP}" >"${DEST}/.built"
log "done in $((SECONDS - start))s"
printf '%s\n' "${DEST}/${NAME}"
