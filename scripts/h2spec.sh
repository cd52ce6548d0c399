#!/usr/bin/env bash
# h2spec.sh: provide h2spec, the HTTP/2 conformance suite, for the integration
# test that runs it against meshbridge's own gRPC server. It is built from
# source with the local Go toolchain from modules served by the Go module proxy.
#
# Usage: scripts/h2spec.sh
#   Prints, as the last line on stdout, the path of an executable `h2spec`.
#   All progress output goes to stderr.
#
# The binary is cached in
#   ${MESHBRIDGE_H2SPEC_CACHE:-~/.cache/meshbridge-h2spec}/<version>/h2spec
# so every run after the first returns at once. Concurrent runs are serialised
# with flock, and the binary is moved into place only once complete.
#
# Knobs (environment):
#   MESHBRIDGE_H2SPEC_VERSION  h2spec release to build (default below)
#   MESHBRIDGE_H2SPEC_CACHE    cache root
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
CACHE_ROOT="${MESHBRIDGE_H2SPEC_CACHE:-${HOME}/.cache/meshbridge-h2spec}"
DEST="${CACHE_ROOT}/${H2SPEC_VERSION}"

log() { printf 'h2spec: %s\n' "$*" >&2; }

# A binary built with other pins is rebuilt.
have_h2spec() {
  [[ -x "${DEST}/h2spec" && "$(cat "${DEST}/.deps" 2>/dev/null)" == "${H2SPEC_DEPS[*]}" ]]
}

# Fast path: no lock, no Go.
if have_h2spec; then
  printf '%s\n' "${DEST}/h2spec"
  exit 0
fi

mkdir -p "${DEST}"
exec 9>"${DEST}/.lock"
if command -v flock >/dev/null 2>&1; then
  log "waiting for the build lock ${DEST}/.lock"
  flock 9
fi
if have_h2spec; then
  printf '%s\n' "${DEST}/h2spec"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0
export GOFLAGS="-mod=mod -buildvcs=false"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/meshbridge-h2spec.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

log "using $(go version), GOTOOLCHAIN=${GOTOOLCHAIN}"

build_h2spec() {
  # A throwaway module that requires the release and the pins above; go mod
  # tidy adds what those need (their own go.mod files fix the versions).
  local mod_dir="${WORK}/mod" bin_dir="${WORK}/bin" dep
  mkdir -p "${mod_dir}" "${bin_dir}"
  (
    cd "${mod_dir}"
    {
      printf 'module meshbridge.invalid/h2spec\n\ngo 1.24\n\n'
      printf 'require (\n'
      printf '\tgithub.com/summerwind/h2spec v%s+incompatible\n' "${H2SPEC_VERSION}"
      for dep in "${H2SPEC_DEPS[@]}"; do
        printf '\t%s %s\n' "${dep%@*}" "${dep#*@}"
      done
      printf ')\n'
    } >go.mod
    printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/summerwind/h2spec/cmd/h2spec"\n' >tools.go
    log "resolving modules for h2spec v${H2SPEC_VERSION}"
    go mod tidy >&2
    log "building h2spec v${H2SPEC_VERSION}"
    GOBIN="${bin_dir}" go install -trimpath \
      -ldflags "-s -w -X main.VERSION=${H2SPEC_VERSION}" \
      github.com/summerwind/h2spec/cmd/h2spec >&2
  )
  "${bin_dir}/h2spec" --version >&2
  mv -f "${bin_dir}/h2spec" "${DEST}/h2spec"
  printf '%s\n' "${H2SPEC_DEPS[*]}" >"${DEST}/.deps"
}

start=${SECONDS}
build_h2spec
log "done in $((SECONDS - start))s"
printf '%s\n' "${DEST}/h2spec"
