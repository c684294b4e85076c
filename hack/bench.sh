#!/usr/bin/env bash
# `make bench`: the bridge and the operator at scale on the local control plane (release
# build). Figures that are stable from run to run (API writes counted in the API server's
# audit log, CPU seconds, memory) beside wall times; everything is written to target/bench/
# (JSON per part, summary.md) and printed. docs/performance.md holds the latest figures.
#
# 0. Heap accounting (tests/heap.rs): the bytes each cached object keeps, no cluster needed.
# 1. The bridge (MW_BENCH_BRIDGE=0 skips it): MW_BENCH_BRIDGE_ROWS (10,000) Manager rows in
#    PostgreSQL → first sync, a full resync with nothing to do, row change → CR applied
#    (tests/bench_bridge.rs). The operator is not running meanwhile.
# 2. Status writes (tests/bench_status.rs; MW_BENCH_STATUS=0 skips it): the API server's and
#    etcd's CPU per status write, the operator's JSON patch of a ManagedWorkload's status beside
#    kube-controller-manager's Deployment status update and beside variants that change one
#    thing each (merge patch, PUT, server-side apply; fewer conditions; no managed fields; a
#    copy of the CRD without descriptions, CEL rules, status schema or any schema, or with the
#    status tracked field by field), 300 objects each, 5 rounds, kube-controller-manager
#    stopped meanwhile. No operator runs.
# 3. The operator against the floor (tests/bench_operator.rs), on a control plane whose
#    kube-controller-manager and kube-scheduler have no client-side rate limit
#    (MW_CP_UNLIMITED_QPS=1): N = 100 and 1000 (MW_BENCH_5000=1 adds 5000; MW_BENCH_SIZES,
#    e.g. 1000,5000, any list) ManagedWorkloads applied at once vs two floors: the objects the operator would make (Deployment, Service)
#    applied directly, and the ideal controller (the same ManagedWorkloads, with exactly the
#    writes the contract needs made by the benchmark from precomputed bodies,
#    tests/bench_operator/ideal.rs; MW_BENCH_IDEAL=0 skips it); and vs its controller-runtime
#    peer (hack/peer: the same contract written as most Go operators are, built once into
#    ~/.cache/mw-operator/bin by `hack/controlplane.sh peer-build`, run on the same workloads
#    as user mw-peer, tests/bench_operator/peer.rs; MW_BENCH_PEER=0 skips it);
#    MW_BENCH_ROUNDS=2 runs the ideal controller, the peer and the operator twice at each size,
#    the first round in the reverse order, and compares their medians (at N = 5,000 two runs
#    of the operator have differed by 6.5%); 60 s steady
#    state; MW_BENCH_STOPS (1,000, at most N / 2) stops vs the same flips on those plain
#    Deployments; an operator restart; as many stops of other workloads by the ideal
#    controller (the stops' floor); 100 workloads with a volume vs their floor.
#    MW_BENCH_VOLUME_EACH=1 gives every workload of every size (and its floor) a volume too;
#    MW_BENCH_SERVICE=0 leaves the Service out, MW_BENCH_VOLUMES=0 the 100 with a volume;
#    MW_BENCH_FLOOR=0 skips the floor of each size (the memory slope with a volume each).
#    MW_BENCH_OPERATOR=0 skips 3 and 4 (the bridge and the status writes alone).
#    MW_BENCH_PROFILE=S: the API server's CPU profile of each convergence run's first S seconds,
#    its goroutines at S / 2 and what its counters moved by, in target/bench/profiles/
#    (tests/bench_operator/profile.rs).
# 4. The same convergence at N = 1000 with the control plane's default rate limits, the ideal
#    controller and the peer beside it again (MW_BENCH_DEFAULT_LIMITS=0 skips it).
# 5. Manager's container list (MW_BENCH_MANAGER=0 skips it): hack/manager-e2e.sh's pages suite
#    (integrations/manager/e2e/pages.bench.js) on a control plane of its own with the operator
#    running: 100, then 1,000 containers made through Manager's API on a kubernetes node and on
#    a dummy node, GET /api/v1/sites/:id/containers timed on both (p50, p99), the provider's
#    requests per list (audit log), the API server's CPU per list, the Manager server's RSS.
#    Not run (a line says so) without Manager's tree (MANAGER_SRC), or without root (the dummy
#    node's registry listens on port 443).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
CP="$HERE/controlplane.sh"
# (Re)start the operator on control plane NAME and wait until it is ready (every watch synced);
# `hack/bench.sh start-operator NAME` is how the benchmark restarts it.
start_operator() {
  local name=$1 address
  bash "$CP" start-operator "$name" "$REPO/target/release/mw-operator" >/dev/null
  address=$("$CP" operator-metrics "$name")
  for _ in $(seq 120); do
    curl -fs "http://$address/readyz" >/dev/null && return 0
    sleep 0.5
  done
  echo "the operator on $name was not ready within 60 s" >&2; return 1
}

if [ "${1:-}" = start-operator ]; then start_operator "${2:?NAME}"; exit; fi

OUT=target/bench
mkdir -p "$OUT"
rm -rf "$OUT"/*.md "$OUT"/*.json "$OUT"/profiles

bash "$HERE/ensure-tools.sh"
cargo build --release --locked --bin mw-operator
# Build the benchmark binaries once, before anything is timed.
cargo test --release --locked --no-run --test bench_bridge --test bench_operator --test bench_status --test heap 2>&1 | tail -1
# The controller-runtime peer too (cached outside the repository by its sources' hash).
PEER=
if [ "${MW_BENCH_PEER:-1}" != 0 ] && [ "${MW_BENCH_OPERATOR:-1}" != 0 ]; then PEER=$(bash "$CP" peer-build); fi
# 0. Heap accounting: what the caches keep per workload, kind by kind (tests/heap.rs).
cargo test --release --locked --test heap -- --nocapture 2>/dev/null | grep '^heap' | tee "$OUT/heap.md"

cleanup() {
  for name in bench bench-default bench-manager; do bash "$CP" down "$name" >/dev/null 2>&1 || true; done
  bash "$HERE/postgres.sh" down bench >/dev/null 2>&1 || true
}
trap cleanup EXIT

# A fresh control plane NAME with the operator's CRD and RBAC; sets KCFG, LOGS, K.
control_plane() {
  local name=$1
  bash "$CP" down "$name" >/dev/null 2>&1 || true
  bash "$CP" up "$name" 2>/dev/null
  KCFG=$("$CP" kubeconfig "$name"); LOGS=$("$CP" log-dir "$name")
  K=("$("$CP" bin-dir)/kubectl" --kubeconfig "$KCFG")
  bash "$CP" install-operator "$name"
}

bench_test() { # TEST: run one benchmark binary against the current control plane
  MW_TEST_KUBECONFIG="$KCFG" MW_TEST_LOG_DIR="$LOGS" \
    cargo test --release --locked --test "$1" -- --ignored --nocapture --test-threads=1 >"$OUT/$1.log" 2>&1 ||
    { tail -n 40 "$OUT/$1.log" >&2; echo "$1 failed; full output in $OUT/$1.log" >&2; return 1; }
}

operator_bench() { # NAME LABEL SIZES FLIPS
  local name=$1 pid_file
  pid_file="$(dirname "$KCFG")/pids/operator.pid"
  start_operator "$name"
  if [ -n "$PEER" ]; then bash "$CP" install-peer "$name"; fi
  # The ideal controller's and the peer's runs stop the operator (it watches every namespace)
  # and start it again afterwards. An empty MW_BENCH_PEER: no peer run.
  MW_BENCH_OPERATOR_PIDFILE="$pid_file" MW_BENCH_LABEL=$2 MW_BENCH_SIZES=$3 MW_BENCH_FLIPS=$4 MW_BENCH_PEER="$PEER" \
    MW_BENCH_STOP_CMD="bash $CP stop-operator $name" \
    MW_BENCH_RESTART_CMD="bash $HERE/bench.sh start-operator $name" \
    bench_test bench_operator
  cat "$OUT/operator-$2.md"
}

# The audit log keeps every run of the largest size (about 200 MB a file), so each
# contender's writes can be compared afterwards.
export MW_CP_UNLIMITED_QPS=1 MW_CP_AUDIT_BACKUPS=${MW_CP_AUDIT_BACKUPS:-10}
if [ "${MW_BENCH_PROFILE:-0}" != 0 ]; then export MW_CP_PROFILING=true; fi
control_plane bench
if [ "${MW_BENCH_BRIDGE:-1}" != 0 ]; then
  echo "== bridge: ${MW_BENCH_BRIDGE_ROWS:-10000} rows in PostgreSQL"
  bash "$HERE/postgres.sh" down bench >/dev/null 2>&1 || true
  bash "$HERE/postgres.sh" up bench
  MW_TEST_PG_URL=$(bash "$HERE/postgres.sh" url bench) \
    MW_TEST_PG_PASSWORD_FILE=$(bash "$HERE/postgres.sh" password-file bench) \
    MW_TEST_PG_CA=$(bash "$HERE/postgres.sh" ca bench) \
    bench_test bench_bridge
  sed -n '/^## Bridge/,/^| memory/p' "$OUT/bench_bridge.log" | tee "$OUT/bridge.md"
  bash "$HERE/postgres.sh" down bench >/dev/null 2>&1 || true
  # Its namespace (10,000 CRs) is being deleted; the operator starts only once it is gone.
  while "${K[@]}" get namespaces -o name | grep -q 'bench-bridge'; do sleep 1; done
fi

if [ "${MW_BENCH_STATUS:-1}" != 0 ]; then
  echo "== status writes: the operator's, kube-controller-manager's and variants"
  bench_test bench_status
  cat "$OUT/status.md"
  # Its objects and the copies of the CRD are being deleted; nothing is timed until they are gone.
  while "${K[@]}" get namespaces -o name | grep -q 't-status-'; do sleep 1; done
  while "${K[@]}" get crd -o name | grep -q 'statusbench.test'; do sleep 1; done
fi

if [ "${MW_BENCH_OPERATOR:-1}" != 0 ]; then
  sizes="100,1000"; [ "${MW_BENCH_5000:-0}" = 0 ] || sizes="100,1000,5000"
  sizes=${MW_BENCH_SIZES:-$sizes}
  echo "== operator, no client-side rate limit on the control plane's controllers"
  operator_bench bench unlimited "$sizes" 1
fi
bash "$CP" down bench >/dev/null 2>&1 || true

if [ "${MW_BENCH_OPERATOR:-1}" != 0 ] && [ "${MW_BENCH_DEFAULT_LIMITS:-1}" != 0 ]; then
  echo "== operator, the control plane's default rate limits (kube-controller-manager 20/s)"
  MW_CP_UNLIMITED_QPS=0 control_plane bench-default
  operator_bench bench-default default-limits 1000 0
fi

if [ "${MW_BENCH_MANAGER:-1}" != 0 ]; then
  echo "== Manager's container list: a kubernetes node against a dummy node"
  control_plane bench-manager
  start_operator bench-manager
  rc=0
  MW_TEST_KUBECONFIG="$KCFG" MW_TEST_LOG_DIR="$LOGS" MW_TEST_CLUSTER=bench-manager MW_MANAGER_E2E_PG=bench-manager \
    MW_MANAGER_E2E_SUITES=pages MW_BENCH_OUT="$OUT/manager-pages.md" \
    bash "$HERE/manager-e2e.sh" >"$OUT/manager-pages.log" 2>&1 || rc=$?
  case $rc in
    0) cat "$OUT/manager-pages.md" ;;
    3) tail -n 1 "$OUT/manager-pages.log" ;;
    *) tail -n 40 "$OUT/manager-pages.log" >&2; echo "the Manager part failed; full output in $OUT/manager-pages.log" >&2; exit 1 ;;
  esac
  bash "$CP" down bench-manager >/dev/null 2>&1 || true
fi

{
  echo "# make bench, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  for part in "$OUT"/heap.md "$OUT"/bridge.md "$OUT"/status.md "$OUT"/operator-*.md "$OUT"/manager-pages.md; do
    if [ -e "$part" ]; then cat "$part"; fi
  done
} >"$OUT/summary.md"
echo; echo "Summary: $OUT/summary.md"
