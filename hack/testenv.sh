# Sourced by hack/test.sh (`make test`) and hack/test-compat.sh (`make test-compat`): the
# steps both take to put the operator on a fresh control plane for the integration tests.
# The caller sets CP (hack/controlplane.sh), REPO and CLUSTER (the control plane's name).

# Each step says when it started, so a slow one shows in the log.
step() { printf '\n==> %s (%s)\n' "$*" "$(date +%T)"; }

# A fresh control plane CLUSTER: whatever a killed earlier run left (namespaces, an operator)
# goes first. Sets KUBECONFIG_ADMIN and LOGS.
testenv_control_plane_up() {
  bash "$CP" down "$CLUSTER"
  bash "$CP" up "$CLUSTER"
  KUBECONFIG_ADMIN=$("$CP" kubeconfig "$CLUSTER")
  LOGS=$("$CP" log-dir "$CLUSTER")
}

# The CRD and the shipped RBAC, then the operator (a debug build) as user mw-operator, and the
# MW_TEST_* variables the integration tests read. HELM (the helm binary) is passed on when set.
# Sets OPERATOR_PID.
testenv_operator_up() {
  step "install CRD and RBAC"
  bash "$CP" install-operator "$CLUSTER"
  step "operator"
  cargo build --locked --bin mw-operator
  OPERATOR_PID=$(bash "$CP" start-operator "$CLUSTER" "$REPO/target/debug/mw-operator")
  export MW_TEST_KUBECONFIG="$KUBECONFIG_ADMIN" MW_TEST_LOG_DIR="$LOGS" MW_TEST_OPERATOR_USER=mw-operator \
    MW_TEST_CLUSTER="$CLUSTER" MW_TEST_OPERATOR_BIN="$REPO/target/debug/mw-operator"
  if [ -n "${HELM:-}" ]; then export MW_TEST_HELM="$HELM"; fi
}

# The shared operator did not exit during the tests (a crash would otherwise pass unseen when
# the tests that followed it did not need it).
testenv_operator_alive() {
  kill -0 "$OPERATOR_PID" 2>/dev/null || { echo "the operator exited during the tests; see $LOGS/operator.log" >&2; return 1; }
}

# For `trap testenv_cleanup EXIT`: stops the operator, then the control plane, then whatever
# the caller's testenv_teardown_more stops (when it defines one), and on failure says where
# the logs are.
testenv_cleanup() {
  local rc=$?
  bash "$CP" down "$CLUSTER" || true
  if declare -F testenv_teardown_more >/dev/null; then testenv_teardown_more || true; fi
  if [ "$rc" != 0 ]; then
    echo "tests failed; control plane and operator logs: $("$CP" log-dir "$CLUSTER")" >&2
  fi
  exit "$rc"
}
