#!/usr/bin/env bash
# `make test-compat`: the operator on the oldest Kubernetes it supports (docs/install.md,
# "Supported Kubernetes versions"). A control plane of that version (MW_CONTROLPLANE=compat:
# hack/controlplane-compat/, built from the Go module proxy like the current one and cached
# beside it), the CRD and RBAC, the operator, then: the CRD's validation suite
# (tests/validation.rs), config/samples/ reaching their phases (hack/samples.sh, as `make
# demo` applies them), the chart (its kubeVersion admits this version, and tests/chart.rs:
# what it renders is accepted and runs) and the lifecycle suite (tests/lifecycle.rs). The
# control plane is always stopped again, also on failure or Ctrl-C. CI runs this after `make
# test`; what it adds to a run: docs/testing.md.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
export MW_CONTROLPLANE=compat
CLUSTER=${MW_TEST_CLUSTER:-compat}
CP="$HERE/controlplane.sh"
# shellcheck source=hack/testenv.sh
source "$HERE/testenv.sh"
# shellcheck source=hack/samples.sh
source "$HERE/samples.sh"

step "toolchain"
bash "$HERE/ensure-tools.sh"

step "control plane binaries and helm (the first run builds them: see docs/testing.md for how long)"
bash "$CP" build
HELM=$(bash "$HERE/helm.sh")

trap testenv_cleanup EXIT
trap 'exit 130' INT TERM

step "control plane up"
testenv_control_plane_up
KUBECTL=("$("$CP" bin-dir)/kubectl" --kubeconfig "$KUBECONFIG_ADMIN")
# The API server that answers is this line's build (the same version as its kubectl) and of
# the minor version the chart's kubeVersion names as the minimum.
SERVER_VERSION=$("${KUBECTL[@]}" version -o json | python3 -c '
import json, re, sys
v = json.load(sys.stdin)
server, client = v["serverVersion"]["gitVersion"], v["clientVersion"]["gitVersion"]
chart = open("charts/mw-operator/Chart.yaml").read()
minimum = re.search(r"^kubeVersion: \">=(\d+\.\d+)\.0-0\"$", chart, re.M)
if server != client or not minimum or not server.startswith("v" + minimum.group(1) + "."):
    sys.exit(f"the API server is {server} (kubectl {client}); the chart says kubeVersion {minimum and minimum.group(0)}")
print(server)')
echo "kube-apiserver $SERVER_VERSION"

testenv_operator_up

step "CRD validation (tests/validation.rs)"
cargo test --locked --test validation -- --test-threads="${MW_TEST_THREADS:-4}"

step "samples (config/samples/, as make demo applies them)"
VOLUMES="$REPO/target/compat-$CLUSTER/volumes"
samples_cluster_offers
samples_apply

step "the chart: its kubeVersion admits $SERVER_VERSION, and what it renders is accepted here and runs (tests/chart.rs)"
"$HELM" template mw-operator charts/mw-operator --kube-version "$SERVER_VERSION" >/dev/null
cargo test --locked --test chart -- --test-threads="${MW_TEST_THREADS:-4}"

step "lifecycle (tests/lifecycle.rs)"
cargo test --locked --test lifecycle -- --test-threads="${MW_TEST_THREADS:-4}"

testenv_operator_alive
printf '\n==> all green on Kubernetes %s (%s)\n' "$SERVER_VERSION" "$(date +%T)"
