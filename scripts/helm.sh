#!/usr/bin/env bash
# helm.sh: provide helm, for the test that lints and renders deploy/helm/meshbridge
# and applies what it renders to the test kube-apiserver. Built from the Go module
# proxy by scripts/gotool.sh and cached.
#
# Usage: scripts/helm.sh   (prints the path of an executable `helm` last)
# Knobs: MESHBRIDGE_HELM_VERSION (default below), MESHBRIDGE_GOTOOL_CACHE
set -euo pipefail
HELM_VERSION="${MESHBRIDGE_HELM_VERSION:-3.22.0}"
exec bash "$(dirname "$0")/gotool.sh" helm helm.sh/helm/v3 "v${HELM_VERSION}" \
  helm.sh/helm/v3/cmd/helm
