#!/usr/bin/env bash
# istioctl.sh: provide istioctl, for the tests that point `istioctl proxy-status` and
# `istioctl proxy-config` at meshbridge's gRPC port. Built by scripts/gotool.sh from
# the same istio.io/istio module version as pilot-discovery (scripts/istio_version.sh),
# so it shares that build's module and build caches and asks for the debug types the
# tests' istiod answers.
#
# Usage: scripts/istioctl.sh   (prints the path of an executable `istioctl` last)
# Knobs: MESHBRIDGE_ISTIO_VERSION, MESHBRIDGE_GOTOOL_CACHE
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=istio_version.sh
source "${HERE}/istio_version.sh"
exec bash "${HERE}/gotool.sh" istioctl istio.io/istio "${ISTIO_VERSION}" \
  istio.io/istio/istioctl/cmd/istioctl
