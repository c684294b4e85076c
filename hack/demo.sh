#!/usr/bin/env bash
# `make demo`: start the local control plane, install the CRD and RBAC, run the operator
# against it, apply config/samples/ and show every workload Ready. What the samples need is
# simulated the way a cluster would offer it (hack/samples.sh: a GPU node, a default
# StorageClass with volumes, load balancers' addresses). Then the bridge: a SQLite Manager
# database built from Manager's real schema, seeded with three containers on a `kubernetes`
# node, synced into namespace `manager` with their disks; the demo shows them Running and the
# rows' containerId/ipv4Address filled in. Everything stays up afterwards so you can try
# kubectl (and sqlite3) on it; `make demo-down` (or `make cluster-down`) stops it.
# MW_REAL_NODE=1 adds the real node (hack/realnode.sh) and runs the samples there too, on
# local images, showing each one's HTTP answer (all but the GPU sample: the real node has no
# GPU).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
CP="$HERE/controlplane.sh"
NAME=${MW_DEMO_CLUSTER:-default}
# shellcheck source=hack/samples.sh
source "$HERE/samples.sh"

if [ "${1:-}" = down ]; then
  exec bash "$CP" down "$NAME"
fi

step() { printf '\n==> %s\n' "$*"; }

bash "$HERE/ensure-tools.sh"
step "local control plane (the first run builds Kubernetes from source: see docs/testing.md for how long)"
bash "$CP" up "$NAME"
KCFG=$("$CP" kubeconfig "$NAME")
LOGS=$("$CP" log-dir "$NAME")
KUBECTL=("$("$CP" bin-dir)/kubectl" --kubeconfig "$KCFG")
VOLUMES="$REPO/target/demo-$NAME/volumes"

step "what a cluster would offer: a GPU node, a default StorageClass and volumes"
samples_cluster_offers

step "operator build"
cargo build --locked --bin mw-operator

step "CRD and RBAC"
bash "$CP" install-operator "$NAME"

step "operator (logs: $LOGS/operator.log)"
bash "$CP" start-operator "$NAME" "$REPO/target/debug/mw-operator" >/dev/null

step "samples"
samples_apply

if [ "${MW_REAL_NODE:-0}" != 0 ]; then
  step "the samples on real containers: namespace real-node, on the real node, local images"
  bash "$CP" node-namespace "$NAME" real-node
  # The samples name registry images, and no registry is reachable here: the same workloads
  # run the local HTTP server image (hack/images.py) on its port instead. All but the GPU
  # sample, which needs a GPU the real node does not have (kwok's GPU node showed it above).
  REAL_SAMPLES=$(for f in config/samples/*.yaml; do
    [ "$(basename "$f")" = gpu.yaml ] && continue
    echo '---'
    sed -e 's#^\(  image:\) .*#\1 mw-test.invalid/httpd:1#' -e 's#containerPort: 80\b#containerPort: 8080#' "$f"
  done)
  if grep '^  image:' <<<"$REAL_SAMPLES" | grep -vq 'mw-test.invalid/'; then
    echo "a sample's image was not replaced by a local one; see hack/demo.sh" >&2; exit 1
  fi
  "${KUBECTL[@]}" -n real-node apply -f - <<<"$REAL_SAMPLES"
  simulate_load_balancers real-node
  if ! "${KUBECTL[@]}" -n real-node wait --for=condition=Ready managedworkloads --all --timeout=180s; then
    echo "the samples on the real node did not become Ready; logs: $LOGS/ (kubelet.log, containerd.log)" >&2
    "${KUBECTL[@]}" -n real-node get managedworkloads,pods -o wide >&2
    exit 1
  fi
  "${KUBECTL[@]}" -n real-node get managedworkloads,pods -o wide
  for mw in $("${KUBECTL[@]}" -n real-node get managedworkloads -o name); do
    ip=$("${KUBECTL[@]}" -n real-node get "$mw" -o jsonpath='{.status.podIP}')
    if [ -z "$ip" ]; then echo "$mw: stopped, no Pod"; continue; fi
    echo "curl http://$ip:8080/  ($mw, a real container) → $(curl -s --max-time 5 "http://$ip:8080/" || echo 'no answer')"
  done
fi

step "bridge: Manager's SQLite database → ManagedWorkloads in namespace manager (logs: $LOGS/bridge.log)"
DB=$(bash "$HERE/manager-db.sh" sqlite "$REPO/target/demo-$NAME/manager.sqlite")
echo "before: $(sqlite3 "$DB" 'SELECT group_concat(hostname || " containerId=" || ifnull(containerId, "NULL") || " ipv4Address=" || ifnull(ipv4Address, "NULL"), "; ") FROM Containers')"
bash "$CP" start-bridge "$NAME" "$REPO/target/debug/mw-operator" manager \
  --database-url "sqlite://$DB" --node k8s-lab-1=manager --requests-percent 1 --metrics-address 127.0.0.1:0 \
  >/dev/null  # each container's rootfs becomes a claim of the default class (demo-local)
# The bridge creates the CRs within a poll or two; wait for them, then for Ready.
for _ in $(seq 1 60); do
  [ "$("${KUBECTL[@]}" -n manager get managedworkloads -o name 2>/dev/null | wc -l)" -ge 3 ] && break
  sleep 1
done
if ! "${KUBECTL[@]}" -n manager wait --for=condition=Ready managedworkloads --all --timeout=120s; then
  echo "the bridged workloads did not become Ready; bridge log: $LOGS/bridge.log" >&2
  exit 1
fi
"${KUBECTL[@]}" -n manager get managedworkloads -o wide
"${KUBECTL[@]}" -n manager get persistentvolumeclaims
# Write-back follows the Running phase within a moment.
for _ in $(seq 1 30); do
  [ "$(sqlite3 "$DB" "SELECT COUNT(*) FROM Containers WHERE ipv4Address LIKE '10.244.%'")" = 3 ] && break
  sleep 1
done
echo "Manager's rows now (sqlite3 $DB):"
sqlite3 -header -column "$DB" 'SELECT id, hostname, containerId, ipv4Address, macAddress, updatedAt FROM Containers'

cat <<MSG

The demo is running. Point kubectl at it:
  export KUBECONFIG=$KCFG
  alias kubectl=$("$CP" bin-dir)/kubectl     # the matching v1.36 client, if you have none
  kubectl get mw -A
  kubectl patch mw nginx --type merge -p '{"spec":{"state":"Stopped"}}'
Manager's database (the bridge polls it every 2 s):
  sqlite3 $DB "UPDATE Containers SET environmentVars='{\"TZ\":\"UTC\"}', updatedAt='\$(date -u +'%Y-%m-%d %H:%M:%S.000 +00:00')' WHERE hostname='team-wiki'"
  kubectl -n manager patch mw team-wiki --type merge -p '{"spec":{"state":"Stopped"}}'   # its ipv4Address goes NULL
Logs: $LOGS/   Stop everything: make demo-down
MSG
if [ "${MW_REAL_NODE:-0}" != 0 ]; then
  cat <<MSG
Real containers (namespace real-node, node mw-real-node):
  kubectl -n real-node get mw,pods -o wide
  curl http://\$(kubectl -n real-node get mw nginx -o jsonpath='{.status.podIP}'):8080/
MSG
fi
