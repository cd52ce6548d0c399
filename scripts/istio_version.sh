# istio_version.sh: the one istio.io/istio module version the tests' Istio tools are
# built from (sourced by istiod.sh and istioctl.sh, so istioctl always speaks the
# debug protocol of the pilot-discovery beside it).
# A pseudo-version of Istio's main branch that go get and go mod tidy accept on go1.26.
ISTIO_VERSION="${MESHBRIDGE_ISTIO_VERSION:-v0.0.0-20260827124520-eed52ebb66ad}"
