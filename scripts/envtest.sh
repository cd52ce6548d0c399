#!/usr/bin/env bash
# envtest.sh: provide a real kube-apiserver and etcd for the integration tests
# (the same idea as controller-runtime's envtest), built from source with the
# local Go toolchain from modules served by the Go module proxy.
#
# Usage: scripts/envtest.sh
#   Prints, as the last line on stdout, a directory that holds executable
#   `kube-apiserver` and `etcd`. All progress output goes to stderr.
#
# The binaries are cached in
#   ${MESHBRIDGE_ENVTEST_CACHE:-~/.cache/meshbridge-envtest}/<k8s-version>/
# so every run after the first returns at once. Concurrent runs are serialised
# with flock, and binaries are moved into place only once complete.
#
# Knobs (environment):
#   MESHBRIDGE_K8S_VERSION   Kubernetes release to build (default below)
#   MESHBRIDGE_ETCD_VERSION  etcd release to build (default below)
#   MESHBRIDGE_ENVTEST_CACHE cache root
set -euo pipefail

K8S_VERSION="${MESHBRIDGE_K8S_VERSION:-1.35.4}"
ETCD_VERSION="${MESHBRIDGE_ETCD_VERSION:-3.6.5}"
CACHE_ROOT="${MESHBRIDGE_ENVTEST_CACHE:-${HOME}/.cache/meshbridge-envtest}"
DEST="${CACHE_ROOT}/${K8S_VERSION}"

log() { printf 'envtest: %s\n' "$*" >&2; }

have_etcd() {
  [[ -x "${DEST}/etcd" && "$(cat "${DEST}/.etcd-version" 2>/dev/null)" == "${ETCD_VERSION}" ]]
}
have_all() {
  [[ -x "${DEST}/kube-apiserver" ]] && have_etcd
}

# Fast path: no lock, no Go.
if have_all; then
  printf '%s\n' "${DEST}"
  exit 0
fi

mkdir -p "${DEST}"
exec 9>"${DEST}/.lock"
if command -v flock >/dev/null 2>&1; then
  log "waiting for the build lock ${DEST}/.lock"
  flock 9
fi
if have_all; then
  printf '%s\n' "${DEST}"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0
export GOFLAGS="-mod=mod -buildvcs=false"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/meshbridge-envtest.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

log "using $(go version), GOTOOLCHAIN=${GOTOOLCHAIN}"

# go.mod of the published k8s.io/kubernetes module: its `replace` lines name
# every staging module (k8s.io/X => ./staging/src/k8s.io/X). The module zip has
# no staging/ dir, so each is redirected to its published v0.<minor>.<patch>.
k8s_gomod() {
  go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p'
}

build_kube_apiserver() {
  local mod_dir="${WORK}/mod-kube" staging_version gomod
  staging_version="v0.${K8S_VERSION#*.}"
  mkdir -p "${mod_dir}"
  (
    cd "${mod_dir}"
    gomod="$(k8s_gomod)"
    [[ -f "${gomod}" ]] || { log "could not download k8s.io/kubernetes v${K8S_VERSION}"; exit 1; }
    {
      printf 'module meshbridge.invalid/envtest/kube\n\n'
      printf 'go %s\n\n' "$(sed -n 's/^go \([0-9.]*\)$/\1/p' "${gomod}")"
      printf 'require k8s.io/kubernetes v%s\n\n' "${K8S_VERSION}"
      printf 'replace (\n'
      sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/k8s\.io/.*$#\1#p' "${gomod}" |
        while read -r m; do printf '\t%s => %s %s\n' "${m}" "${m}" "${staging_version}"; done
      printf ')\n'
    } >go.mod
    printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >tools.go
    log "resolving modules for kube-apiserver v${K8S_VERSION} (staging ${staging_version})"
    go mod tidy >&2
    log "building kube-apiserver v${K8S_VERSION}"
    # What hack/lib/version.sh stamps, so /version reports the real release.
    local ldflags="-s -w" pkg minor="${K8S_VERSION#*.}"
    minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X ${pkg}.gitVersion=v${K8S_VERSION}"
      ldflags+=" -X ${pkg}.gitMajor=${K8S_VERSION%%.*} -X ${pkg}.gitMinor=${minor}"
      ldflags+=" -X ${pkg}.gitTreeState=clean"
      ldflags+=" -X ${pkg}.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    go build -trimpath -ldflags "${ldflags}" -o "${WORK}/kube-apiserver" \
      k8s.io/kubernetes/cmd/kube-apiserver >&2
  )
  "${WORK}/kube-apiserver" --version >&2
  mv -f "${WORK}/kube-apiserver" "${DEST}/kube-apiserver"
}

build_etcd() {
  # go.etcd.io/etcd/server/v3's go.mod replaces its sibling modules with
  # relative paths, so `go install pkg@version` refuses it; a throwaway module
  # that pins every etcd module to the same release builds it instead.
  local mod_dir="${WORK}/mod-etcd" m
  mkdir -p "${mod_dir}"
  (
    cd "${mod_dir}"
    {
      printf 'module meshbridge.invalid/envtest/etcd\n\ngo 1.24\n\n'
      printf 'require go.etcd.io/etcd/server/v3 v%s\n\n' "${ETCD_VERSION}"
      printf 'replace (\n'
      for m in api/v3 client/pkg/v3 client/v3 pkg/v3 server/v3; do
        printf '\tgo.etcd.io/etcd/%s => go.etcd.io/etcd/%s v%s\n' "${m}" "${m}" "${ETCD_VERSION}"
      done
      printf ')\n'
    } >go.mod
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
    log "resolving modules for etcd v${ETCD_VERSION}"
    go mod tidy >&2
    log "building etcd v${ETCD_VERSION}"
    go build -trimpath -ldflags '-s -w' -o "${WORK}/etcd" go.etcd.io/etcd/server/v3 >&2
  )
  "${WORK}/etcd" --version >&2
  mv -f "${WORK}/etcd" "${DEST}/etcd"
  printf '%s\n' "${ETCD_VERSION}" >"${DEST}/.etcd-version"
}

start=${SECONDS}
have_etcd || build_etcd
[[ -x "${DEST}/kube-apiserver" ]] || build_kube_apiserver
log "done in $((SECONDS - start))s"
printf '%s\n' "${DEST}"
