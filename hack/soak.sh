#!/usr/bin/env bash
# `make soak`: tests/soak.rs on a control plane of its own, with the release build: N
# workloads (MW_SOAK_N, 5000) changed a tenth a minute for MW_SOAK_MINUTES (30), the API server
# restarted twice and the leader killed once; the report goes to target/soak/soak.md (every
# sample of the leader's RSS to soak.rss.tsv beside it) and docs/performance.md holds the
# latest. The control plane's controllers have no client-side
# rate limit (MW_CP_UNLIMITED_QPS=1), as in `make bench`, and its audit log keeps enough
# rotated files (MW_CP_AUDIT_BACKUPS) for the whole run's writes to be counted.
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

trap 'bash "$CP" down "$NAME" >/dev/null 2>&1 || true' EXIT
export MW_CP_UNLIMITED_QPS=1 MW_CP_AUDIT_BACKUPS=${MW_CP_AUDIT_BACKUPS:-20}
bash "$CP" down "$NAME" >/dev/null 2>&1 || true
bash "$CP" up "$NAME" 2>/dev/null
bash "$CP" install-operator "$NAME"
MW_TEST_KUBECONFIG=$("$CP" kubeconfig "$NAME") MW_TEST_LOG_DIR=$("$CP" log-dir "$NAME") MW_TEST_CLUSTER=$NAME \
  MW_TEST_OPERATOR_BIN="$REPO/target/release/mw-operator" \
  cargo test --release --locked --test soak -- --ignored --nocapture --test-threads=1 2>&1 | tee target/soak/soak.log
