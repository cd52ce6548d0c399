# The two commands: `make run` serves the bundled demo cluster, `make test` runs every test.
# Both create .venv and install what they need, so they work on a fresh clone; `run`
# installs only the server's runtime dependencies, the others the extra they need.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat pyproject.toml | sha1sum | cut -c1-12)
# One stamp per extra ("runtime" is none), redone when pyproject.toml changes.
STAMP = $(VENV)/.installed-$(1)-$(HASH)

.PHONY: run test test-workers lint bench protos install install-test install-dev install-bench clean \
	envtest chromium h2spec helm istiod istioctl

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# --no-compile: byte-compiling every installed file (xds-protos alone is thousands)
# took over half of the install; Python compiles what it imports, when it imports it.
$(VENV)/.installed-%-$(HASH): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --no-compile --disable-pip-version-check -e '.$(if $(filter-out runtime,$*),[$*])'
	touch $@

install: $(call STAMP,runtime)
install-test: $(call STAMP,test)
install-dev: $(call STAMP,dev)
install-bench: $(call STAMP,bench)

run: install
	$(BIN)/meshbridge serve --source demo

test: install-test envtest chromium h2spec helm istiod istioctl
	$(BIN)/python -m pytest -q -p no:cacheprovider tests
	$(MAKE) --no-print-directory test-workers

# The protocol and reliability tiers again with the port served by two worker
# processes (docs/workers.md, "Tests"): every test here starts its server through the
# test kit, which reads MESHBRIDGE_TEST_WORKERS (`serve` processes get --workers from
# it). tests/integration/test_workers.py (in the run above) starts `serve --workers 2`
# itself. Files that start a server and are not here, and why, are listed in
# docs/workers.md, "Tests".
WORKER_TIERS := $(addprefix tests/integration/test_,linkerd_get.py linkerd_profile.py \
	linkerd_policy.py linkerd_policy_streams.py linkerd_identity.py linkerd_identity_tls.py \
	linkerd_identity_kube.py linkerd_2_20_differences.py linkerd_cli.py \
	xds_api.py xds_envoy.py xds_leds_envoy.py xds_proxyless.py xds_one_truth.py one_truth.py \
	route_canary.py route_grpc.py route_envoy.py route_cli.py grpc_port.py h2spec.py \
	transports.py shadow_fields.py shadow_linkerd.py shadow_xds.py \
	metrics.py metric_names.py admin.py debug_read_only.py operator_views.py istioctl.py \
	multicluster_get.py multicluster_xds.py multicluster_traffic.py \
	istiod_differential.py istiod_routes.py \
	kube_source.py kube_unchanged_pod.py kube_serve.py kube_routes.py kube_policy.py) \
	tests/attacks/test_attacks.py tests/reliability/test_faults.py tests/reliability/test_soak.py

test-workers: install-test envtest chromium h2spec istiod istioctl
	MESHBRIDGE_TEST_WORKERS=2 $(BIN)/python -m pytest -q -p no:cacheprovider $(WORKER_TIERS)

# A real kube-apiserver and etcd for the integration tests, built once from the Go
# module proxy (about 4 minutes on a fresh 2-core machine) and cached after that.
envtest:
	bash scripts/envtest.sh >/dev/null

# h2spec, the HTTP/2 conformance suite run against the native gRPC server, built
# once from the Go module proxy (under a minute) and cached after that.
h2spec:
	bash scripts/h2spec.sh >/dev/null

# helm, for the chart's lint/template/apply test, built once from the Go module proxy
# (two to three minutes on a fresh 2-core machine) and cached.
helm:
	bash scripts/helm.sh >/dev/null

# istiod (pilot-discovery) and Istio's CRDs, the xDS side's reference peer, built once
# from the Go module proxy (istio.io/istio; about 35 minutes on a busy 2-core machine)
# and cached after that.
istiod:
	bash scripts/istiod.sh >/dev/null

# istioctl from the same istio.io/istio module version as pilot-discovery (it shares
# that build's module and build caches), for the tests that point
# `istioctl proxy-status` at meshbridge's gRPC port; cached after the first build.
istioctl:
	bash scripts/istioctl.sh >/dev/null

# Debian's Chromium, for the admin page's browser test (as root, like CI).
chromium:
	command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

lint: install-dev
	$(BIN)/ruff check bridge meshbridge h2grpc linkerd_api xds_api admission harness testkit tests \
		bench fuzz scripts
	$(BIN)/mypy

bench: install-bench
	$(BIN)/python -m bench

protos: install-dev
	$(BIN)/python scripts/gen_protos.py

clean:
	rm -rf $(VENV)
