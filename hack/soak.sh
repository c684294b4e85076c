#!/usr/bin/env bash
# `make soak`: tests/soak.rs with the release build, in two parts, each on a control plane of
# its own:
# 1. the floor (tests/soak/floor.rs): N workloads (MW_SOAK_N, 5000) as the plain objects the
#    operator would make, no operator, changed at one rate after another; the highest rate
#    this control plane carries (every change rolled out, the backlog not growing) goes to
#    target/soak/floor.json. MW_SOAK_FLOOR=0 skips it (the rate is then
#    MW_SOAK_CHANGE_PERCENT, 10, of N a minute); MW_SOAK_FLOOR=FILE uses an earlier run's.
# 2. the operator's soak at that rate for MW_SOAK_MINUTES (30): the API server restarted twice
#    and the leader killed once; the report, the floor beside the operator, goes to
#    target/soak/soak.md (every sample of the leader's RSS to soak.rss.tsv beside it) and
#    docs/performance.md holds the latest. MW_SOAK_OPERATOR=0 stops after the floor.
# The control plane's controllers have no client-side rate limit (MW_CP_UNLIMITED_QPS=1), as
# in `make bench`, and its audit log keeps enough rotated files (MW_CP_AUDIT_BACKUPS) for the
# whole run's writes to be counted.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
CP="$HERE/controlplane.sh"
NAME=${MW_SOAK_CLUSTER:-soak}
mkdir -p target/soak

bash "$HERE/ensure-tools.sh"
cargo build --release --locked --bin mw-operator
cargo test --release --locked --no-run --test soak 2>&1 | tail -1

CLUSTERS="$NAME $NAME-floor"
trap 'for c in $CLUSTERS; do bash "$CP" down "$c" >/dev/null 2>&1 || true; done' EXIT
export MW_CP_UNLIMITED_QPS=1 MW_CP_AUDIT_BACKUPS=${MW_CP_AUDIT_BACKUPS:-20}

# Run soak.rs's test $2 on a fresh control plane $1, then take the control plane down.
run() {
  local cluster=$1 test=$2
  bash "$CP" down "$cluster" >/dev/null 2>&1 || true
  bash "$CP" up "$cluster" 2>/dev/null
  bash "$CP" install-operator "$cluster"
  MW_TEST_KUBECONFIG=$("$CP" kubeconfig "$cluster") MW_TEST_LOG_DIR=$("$CP" log-dir "$cluster") MW_TEST_CLUSTER=$cluster \
    MW_TEST_OPERATOR_BIN="$REPO/target/release/mw-operator" \
    cargo test --release --locked --test soak -- --ignored --exact "$test" --nocapture --test-threads=1 2>&1 |
    tee "target/soak/${test##*::}.log"
  local status=${PIPESTATUS[0]}
  bash "$CP" down "$cluster" >/dev/null 2>&1 || true
  return "$status"
}

case "${MW_SOAK_FLOOR:-}" in
  0) unset MW_SOAK_FLOOR ;;
  "")
    rm -f target/soak/floor.json
    run "$NAME-floor" floor::floor
    export MW_SOAK_FLOOR="$REPO/target/soak/floor.json" ;;
  *) export MW_SOAK_FLOOR=$(realpath "$MW_SOAK_FLOOR") ;; # an earlier run's report
esac
[ "${MW_SOAK_OPERATOR:-}" = 0 ] || run "$NAME" soak
