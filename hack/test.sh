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
# shellcheck source=hack/testenv.sh
source "$HERE/testenv.sh"

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

# On exit (also on failure or Ctrl-C): the operator, the control plane, then the bridge tests'
# PostgreSQL.
testenv_teardown_more() { bash "$HERE/postgres.sh" down "$CLUSTER"; }
trap testenv_cleanup EXIT
trap 'exit 130' INT TERM

step "control plane up"
testenv_control_plane_up

step "real node (kubelet, kube-proxy, containerd, runc, CNI; first run builds the kubelet)"
# Beside the kwok node, tainted so that only the real-node suite's Pods land on it.
bash "$CP" node-up "$CLUSTER"
export MW_TEST_REAL_NODE=1 MW_TEST_CLUSTER=$CLUSTER

step "PostgreSQL for the bridge tests"
bash "$HERE/postgres.sh" down "$CLUSTER"
bash "$HERE/postgres.sh" up "$CLUSTER"
export MW_TEST_PG_URL MW_TEST_PG_PASSWORD_FILE MW_TEST_PG_CA
MW_TEST_PG_URL=$(bash "$HERE/postgres.sh" url "$CLUSTER")
MW_TEST_PG_PASSWORD_FILE=$(bash "$HERE/postgres.sh" password-file "$CLUSTER")
MW_TEST_PG_CA=$(bash "$HERE/postgres.sh" ca "$CLUSTER")

testenv_operator_up

step "integration tests, with the real containers' suite beside them"
cargo test --locked --no-run --test '*' 2>&1 | tail -1
# The real-container suite (#[ignore]d without a real node) runs at the same time as the kwok
# suites: its namespaces send every Pod to the real node, theirs never go there, and the shared
# operator serves both. Its binary is run directly: two cargo commands would wait on each
# other's lock on target/.
REALNODE_TESTS=$(cargo test --locked --no-run --test realnode --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "realnode":
        print(m["executable"])')
[ -x "$REALNODE_TESTS" ] || { echo "cargo named no test binary for tests/realnode.rs" >&2; exit 1; }
"$REALNODE_TESTS" --ignored --test-threads="${MW_TEST_THREADS:-4}" --nocapture >"$LOGS/realnode-tests.log" 2>&1 &
REALNODE_TESTS_PID=$!
# --no-fail-fast: one failing suite does not hide the others' results.
KWOK_SUITES=0
cargo test --locked --no-fail-fast --test '*' -- --test-threads="${MW_TEST_THREADS:-4}" || KWOK_SUITES=$?
REAL_SUITE=0
wait "$REALNODE_TESTS_PID" || REAL_SUITE=$?
step "real containers (ran beside the above): lifecycle, HTTP from the host, crash loop, pull failure, OOM kill, graceful stop, a disk that survives, readiness"
cat "$LOGS/realnode-tests.log"
[ "$KWOK_SUITES" = 0 ] && [ "$REAL_SUITE" = 0 ] || exit 1

step "Manager's provider (node --test: the shared mapping table, then every call as Manager's Role)"
(cd integrations/manager && npm ci --no-audit --no-fund --loglevel=error && node --test)

step "Manager itself on the operator (hack/manager-e2e.sh: patched server.js + job-runner.js, REST API)"
MANAGER_E2E=0
bash "$HERE/manager-e2e.sh" || MANAGER_E2E=$?
case "$MANAGER_E2E" in
  0) ;;
  3) echo "Manager's end-to-end test: NOT RUN (no Manager tree at MANAGER_SRC); not counted as passed" ;;
  *) exit 1 ;;
esac

testenv_operator_alive
# What follows runs alone, one test at a time: each starts operators of its own (the shared
# one watches every namespace), deletes the CRD every other test relies on, or stops
# kube-apiserver and etcd.
bash "$CP" stop-operator "$CLUSTER"

step "serial: the chart on the real node (the operator's image in Pods, failover, helm upgrade and uninstall, the CRD upgrade)"
# The image `make image` builds, from the debug binary the other suites test (a release build
# would add minutes to every cold run; the image's recipe is the same). One image, two tags:
# the upgrade goes from test-1 to test-2.
mkdir -p target/image
python3 "$HERE/image.py" --binary "$REPO/target/debug/mw-operator" --out target/image/mw-operator-test.oci.tar \
  --name mw-test.invalid/mw-operator:test-1 --name mw-test.invalid/mw-operator:test-2
bash "$CP" node-import "$CLUSTER" target/image/mw-operator-test.oci.tar
MW_TEST_KUBECTL="$(bash "$CP" bin-dir)/kubectl" MW_TEST_IMAGE_REPOSITORY=mw-test.invalid/mw-operator \
  cargo test --locked --test release -- --ignored --test-threads=1

# The real node goes before the fault tests stop and start the API server under it, and so
# that the teardown test below can start a real node of its own (one per machine).
bash "$CP" node-down "$CLUSTER"

step "serial: namespace-scoped operator on a ServiceAccount token, uninstall in either order"
cargo test --locked --test install -- --ignored --test-threads=1

step "serial: an operator restart keeps a workload's claim and writes nothing"
cargo test --locked --test volumes -- --ignored --test-threads=1

step "operations: failover, shutdown, probes, redaction, control-plane faults"
cargo test --locked --test faults -- --ignored --test-threads=1

step "teardown keeps what it will not stop"
bash "$HERE/teardown-test.sh"

printf '\n==> all green (%s)\n' "$(date +%T)"
