#!/usr/bin/env bash
# `make bench`: the operator and the bridge at scale on the local control plane, with figures
# that are stable from run to run (API writes counted in the API server's audit log, memory,
# CPU seconds) and wall times for information.
# The bridge first (MW_BENCH_BRIDGE=0 skips it): MW_BENCH_BRIDGE_ROWS (default 10,000) Manager
# rows in PostgreSQL → first sync, a full resync with nothing to do, row change → CR applied
# (tests/bench_bridge.rs; target/bench/bridge.json). The operator is not running meanwhile,
# so the figures are the bridge's own.
# Then the operator, N workloads (MW_BENCH_WORKLOADS, default 200):
#   create N → all Ready; 30 s idle; restart the operator; stop all → all Ready (Stopped).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
CP="$HERE/controlplane.sh"
NAME=bench
N=${MW_BENCH_WORKLOADS:-200}
NS=bench

bash "$HERE/ensure-tools.sh"
cargo build --release --locked --bin mw-operator
bash "$CP" down "$NAME" >/dev/null 2>&1 || true
bash "$CP" up "$NAME" 2>/dev/null
trap 'bash "$CP" down "$NAME" >/dev/null 2>&1' EXIT
KCFG=$("$CP" kubeconfig "$NAME"); LOGS=$("$CP" log-dir "$NAME")
K=("$("$CP" bin-dir)/kubectl" --kubeconfig "$KCFG")
bash "$CP" install-operator "$NAME"
"${K[@]}" create namespace "$NS" >/dev/null
until "${K[@]}" -n "$NS" get serviceaccount default >/dev/null 2>&1; do sleep 0.2; done

if [ "${MW_BENCH_BRIDGE:-1}" != 0 ]; then
  bash "$HERE/postgres.sh" down "$NAME" >/dev/null 2>&1 || true
  bash "$HERE/postgres.sh" up "$NAME"
  trap 'bash "$CP" down "$NAME" >/dev/null 2>&1; bash "$HERE/postgres.sh" down "$NAME" >/dev/null 2>&1' EXIT
  echo "== bridge: ${MW_BENCH_BRIDGE_ROWS:-10000} rows (release build; takes a few minutes)"
  MW_TEST_KUBECONFIG="$KCFG" MW_TEST_LOG_DIR="$LOGS" \
    MW_TEST_PG_URL=$(bash "$HERE/postgres.sh" url "$NAME") \
    MW_TEST_PG_PASSWORD_FILE=$(bash "$HERE/postgres.sh" password-file "$NAME") \
    MW_TEST_PG_CA=$(bash "$HERE/postgres.sh" ca "$NAME") \
    cargo test --release --locked --test bench_bridge -- --ignored --nocapture 2>&1 | sed -n '/^## Bridge/,/^| memory/p'
  bash "$HERE/postgres.sh" down "$NAME" >/dev/null 2>&1 || true
  # The bench namespace (and its CRs) is being deleted; the operator starts only once it is gone.
  while "${K[@]}" get namespaces -o name | grep -q 'bench-bridge'; do sleep 1; done
fi

start_operator() { OPERATOR=$(bash "$CP" start-operator "$NAME" "$REPO/target/release/mw-operator"); }

writes() { # operator writes in the bench namespace so far, by verb/resource
  python3 - "$LOGS/audit.log" "$NS" <<'PY'
import json, sys, collections
counts = collections.Counter()
for line in open(sys.argv[1]):
    e = json.loads(line)
    ref = e.get("objectRef", {})
    if e.get("stage") != "ResponseComplete" or e["user"]["username"] != "mw-operator" or ref.get("namespace") != sys.argv[2]:
        continue
    if e["verb"] in ("create", "update", "patch", "delete"):
        res = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
        counts[f'{e["verb"]} {res}'] += 1
print(json.dumps(counts))
PY
}
total() { python3 -c 'import json,sys; print(sum(json.loads(sys.argv[1]).values()))' "$1"; }
delta() { python3 -c '
import json,sys
a,b,n=json.loads(sys.argv[1]),json.loads(sys.argv[2]),int(sys.argv[3])
for k in sorted(set(a)|set(b)):
    d=b.get(k,0)-a.get(k,0)
    if d: print(f"    {k:<40} {d:>6}  ({d/n:.2f} per workload)")
' "$1" "$2" "$N"; }
rss() { awk '/^(VmRSS|VmHWM)/ {printf "%s %.1f MiB  ", $1, $2/1024}' "/proc/$OPERATOR/status"; }

start_operator
sleep 1
manifest=$(for i in $(seq 1 "$N"); do
  printf -- '---\napiVersion: opensource-server.mieweb.org/v1alpha1\nkind: ManagedWorkload\nmetadata: {name: w%d, labels: {opensource-server.mieweb.org/container-id: "%d"}}\nspec: {image: "nginx:latest", env: [{name: ID, value: "%d"}], resources: {requests: {cpu: 10m, memory: 16Mi}}}\n' "$i" "$i" "$i"
done)
w0=$(writes); t0=$(date +%s.%N)
echo "$manifest" | "${K[@]}" -n "$NS" apply -f - >/dev/null
"${K[@]}" -n "$NS" wait --for=condition=Ready mw --all --timeout=600s >/dev/null
t1=$(date +%s.%N); w1=$(writes)
echo "== create $N workloads → all Ready: $(python3 -c "print(f'{$t1-$t0:.1f}')") s (wall, informational)"
delta "$w0" "$w1"
echo "    operator memory: $(rss)"

sleep 30; w2=$(writes)
echo "== 30 s idle with $N Running workloads: $(( $(total "$w2") - $(total "$w1") )) writes"

start_operator # stops the running one first
sleep 20; w3=$(writes)
echo "== operator restart, 20 s to resync $N workloads: $(( $(total "$w3") - $(total "$w2") )) writes; memory: $(rss)"

t2=$(date +%s.%N)
"${K[@]}" -n "$NS" get mw -o name | sed 's|.*/||' | while read -r mw; do
  "${K[@]}" -n "$NS" patch mw "$mw" --type merge -p '{"spec":{"state":"Stopped"}}' >/dev/null
done
"${K[@]}" -n "$NS" wait --for=condition=Ready mw --all --timeout=600s >/dev/null
t3=$(date +%s.%N); w4=$(writes)
echo "== stop $N workloads → all Stopped: $(python3 -c "print(f'{$t3-$t2:.1f}')") s (wall, includes $N kubectl calls)"
delta "$w3" "$w4"
echo "    operator memory: $(rss)"
