#!/usr/bin/env bash
# istiod.sh: provide istiod (`pilot-discovery`) and Istio's CRDs for the integration
# tests, built from the Go module istio.io/istio through the Go module proxy with the
# local Go toolchain, the way scripts/envtest.sh provides kube-apiserver. istiod is the
# xDS side's reference control plane (tests/integration/test_istiod_differential.py).
#
# Usage: scripts/istiod.sh
#   Prints, as the last line on stdout, a directory that holds an executable
#   `pilot-discovery`, `crd-all.gen.yaml` (Istio's CRDs, from the same module) and
#   `gateway-api-crds.yaml` (the Gateway API's standard CRDs, from the
#   sigs.k8s.io/gateway-api module at the version Istio's go.mod requires).
#   All progress output goes to stderr.
#
# The binary is built (and cached) by scripts/gotool.sh: istio.io/istio's go.mod has no
# replace directives, so a throwaway module that requires it at one version builds it
# with exactly the dependency versions Istio's own go.mod fixes. The directory printed is
#   ${MESHBRIDGE_ISTIOD_CACHE:-~/.cache/meshbridge-istiod}/<version>/
# so every run after the first returns at once; concurrent runs are serialised with flock.
#
# Knobs (environment):
#   MESHBRIDGE_ISTIO_VERSION  the istio.io/istio module version (the module proxy serves
#                             Istio's main branch at pseudo-versions; default below)
#   MESHBRIDGE_ISTIOD_CACHE   cache root
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=istio_version.sh
source "${HERE}/istio_version.sh"
CACHE_ROOT="${MESHBRIDGE_ISTIOD_CACHE:-${HOME}/.cache/meshbridge-istiod}"
DEST="${CACHE_ROOT}/${ISTIO_VERSION}"

log() { printf 'istiod: %s\n' "$*" >&2; }
have_all() { [[ -x "${DEST}/pilot-discovery" && -s "${DEST}/crd-all.gen.yaml"
               && -s "${DEST}/gateway-api-crds.yaml" ]]; }

if have_all; then  # fast path: no lock, no Go
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
export GOFLAGS="-mod=mod -buildvcs=false"

start=${SECONDS}
bin="$(bash "${HERE}/gotool.sh" pilot-discovery istio.io/istio "${ISTIO_VERSION}" \
  istio.io/istio/pilot/cmd/pilot-discovery | tail -n 1)"
[[ -x "${bin}" ]] || { log "gotool.sh printed ${bin}, which is not executable"; exit 1; }

# The CRDs are in the module's source tree, which the build has put in the module cache.
mod_dir="$(go mod download -json "istio.io/istio@${ISTIO_VERSION}" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
crds="${mod_dir}/manifests/charts/base/files/crd-all.gen.yaml"
[[ -s "${crds}" ]] || { log "no CRDs at ${crds}"; exit 1; }
cp -f "${crds}" "${DEST}/crd-all.gen.yaml.tmp"
chmod 0644 "${DEST}/crd-all.gen.yaml.tmp"
mv -f "${DEST}/crd-all.gen.yaml.tmp" "${DEST}/crd-all.gen.yaml"
# The Gateway API's CRDs (routes for a mesh), at the version Istio builds against.
gw_version="$(sed -n 's/^[[:space:]]*sigs\.k8s\.io\/gateway-api v\([^ ]*\)$/v\1/p' \
  "${mod_dir}/go.mod" | head -n 1)"
[[ -n "${gw_version}" ]] || { log "no sigs.k8s.io/gateway-api in ${mod_dir}/go.mod"; exit 1; }
gw_dir="$(go mod download -json "sigs.k8s.io/gateway-api@${gw_version}" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
{
  for kind in gatewayclasses gateways httproutes grpcroutes referencegrants; do
    printf -- '---\n'
    cat "${gw_dir}/config/crd/standard/gateway.networking.k8s.io_${kind}.yaml"
  done
} > "${DEST}/gateway-api-crds.yaml.tmp"
chmod 0644 "${DEST}/gateway-api-crds.yaml.tmp"
mv -f "${DEST}/gateway-api-crds.yaml.tmp" "${DEST}/gateway-api-crds.yaml"
# A link, not a copy: the binary is ~100 MB and stays in gotool.sh's cache; if that
# cache is removed the link dangles, have_all fails and the next run rebuilds.
ln -sfn "${bin}" "${DEST}/pilot-discovery"
"${DEST}/pilot-discovery" version --short >&2 || true
log "done in $((SECONDS - start))s"
printf '%s\n' "${DEST}"
