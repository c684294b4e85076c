#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it: formatting, lints, generated files,
# unit tests, then integration tests against a local control plane that this script starts
# and always stops again (also on failure or Ctrl-C).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
CLUSTER=${MW_TEST_CLUSTER:-test}
CP="$HERE/controlplane.sh"

step() { printf '\n==> %s\n' "$*"; }

step "toolchain"
bash "$HERE/ensure-tools.sh"

step "rustfmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --all-targets --locked -- -D warnings

step "generated CRDs are current"
cargo run --quiet --locked -- crd --out crds --check
cargo run --quiet --locked -- crd --out charts/mw-operator/crds --check

step "unit tests"
cargo test --locked --lib --bins

step "Argo CD health check (gopher-lua, as Argo CD runs it)"
(cd "$HERE/argocd-health" && go test -count=1 ./...)

step "control plane binaries and helm"
bash "$CP" build
HELM=$(bash "$HERE/helm.sh")
bash "$HERE/manifests.sh" --check

cleanup() {
  local rc=$?
  # Stops the operator first, then the control plane, then the bridge tests' PostgreSQL.
  bash "$CP" down "$CLUSTER" || true
  bash "$HERE/postgres.sh" down "$CLUSTER" || true
  if [ "$rc" != 0 ]; then
    echo "tests failed; control plane and operator logs: $("$CP" log-dir "$CLUSTER")" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "control plane up"
# Always a fresh one: whatever a killed earlier run left (namespaces, an operator) goes first.
bash "$CP" down "$CLUSTER"
bash "$CP" up "$CLUSTER"
KUBECONFIG_ADMIN=$("$CP" kubeconfig "$CLUSTER")
LOGS=$("$CP" log-dir "$CLUSTER")

step "real node (kubelet, kube-proxy, containerd, runc, CNI; first run builds the kubelet)"
# Beside the kwok node, tainted so that only the real-node suite's Pods land on it.
bash "$CP" node-up "$CLUSTER"
export MW_TEST_REAL_NODE=1

step "PostgreSQL for the bridge tests"
bash "$HERE/postgres.sh" down "$CLUSTER"
bash "$HERE/postgres.sh" up "$CLUSTER"
export MW_TEST_PG_URL MW_TEST_PG_PASSWORD_FILE MW_TEST_PG_CA
MW_TEST_PG_URL=$(bash "$HERE/postgres.sh" url "$CLUSTER")
MW_TEST_PG_PASSWORD_FILE=$(bash "$HERE/postgres.sh" password-file "$CLUSTER")
MW_TEST_PG_CA=$(bash "$HERE/postgres.sh" ca "$CLUSTER")

step "install CRD and RBAC"
bash "$CP" install-operator "$CLUSTER"

step "operator"
cargo build --locked --bin mw-operator
OPERATOR_PID=$(bash "$CP" start-operator "$CLUSTER" "$REPO/target/debug/mw-operator")
export MW_TEST_KUBECONFIG="$KUBECONFIG_ADMIN" MW_TEST_LOG_DIR="$LOGS" MW_TEST_OPERATOR_USER=mw-operator \
  MW_TEST_HELM="$HELM" MW_TEST_CLUSTER="$CLUSTER" MW_TEST_OPERATOR_BIN="$REPO/target/debug/mw-operator"

step "integration tests"
# --no-fail-fast: one failing suite does not hide the others' results.
cargo test --locked --no-fail-fast --test '*' -- --test-threads="${MW_TEST_THREADS:-4}"

step "Manager's backend examples (@kubernetes/client-node, node --test)"
(cd examples/manager-node && npm ci --no-audit --no-fund --loglevel=error && node --test)

step "real containers: lifecycle, HTTP from the host, crash loop, pull failure, OOM kill, graceful stop"
# Own step (the tests are #[ignore]d without a real node): the shared operator serves them,
# and nothing else runs on the real node meanwhile.
cargo test --locked --test realnode -- --ignored --test-threads="${MW_TEST_THREADS:-4}" --nocapture
kill -0 "$OPERATOR_PID" 2>/dev/null || { echo "the operator exited during the tests; see $LOGS/operator.log" >&2; exit 1; }
# The real node goes before the fault tests stop and start the API server under it, and so
# that the teardown test below can start a real node of its own (one per machine).
bash "$CP" node-down "$CLUSTER"

# What follows runs alone, one test at a time: each starts operators of its own (the shared
# one watches every namespace), deletes the CRD every other test relies on, or stops
# kube-apiserver and etcd.
bash "$CP" stop-operator "$CLUSTER"

step "serial: namespace-scoped operator on a ServiceAccount token, uninstall in either order"
cargo test --locked --test install -- --ignored --test-threads=1

step "serial: an operator restart keeps a workload's claim and writes nothing"
cargo test --locked --test volumes -- --ignored --test-threads=1

step "operations: failover, shutdown, probes, redaction, control-plane faults"
cargo test --locked --test faults -- --ignored --test-threads=1

step "teardown keeps what it will not stop"
bash "$HERE/teardown-test.sh"
