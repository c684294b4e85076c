#!/usr/bin/env bash
# `make demo`: start the local control plane, install the CRD and RBAC, run the operator
# against it, apply config/samples/ and show the workloads reaching Running. Then the bridge:
# a SQLite Manager database built from Manager's real schema, seeded with three containers on
# a `kubernetes` node, synced into namespace `manager`; the demo shows them Running and the
# rows' containerId/ipv4Address filled in. Everything stays up afterwards so you can try
# kubectl (and sqlite3) on it; `make demo-down` (or `make cluster-down`) stops it.
# MW_REAL_NODE=1 adds the real node (hack/realnode.sh) and runs the samples there too, on
# local images, showing each one's HTTP answer.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
CP="$HERE/controlplane.sh"
NAME=${MW_DEMO_CLUSTER:-default}

if [ "${1:-}" = down ]; then
  exec bash "$CP" down "$NAME"
fi

step() { printf '\n==> %s\n' "$*"; }

bash "$HERE/ensure-tools.sh"
step "local control plane (first run builds Kubernetes from source: expect ~20 minutes on 2 cores)"
bash "$CP" up "$NAME"
KCFG=$("$CP" kubeconfig "$NAME")
LOGS=$("$CP" log-dir "$NAME")
KUBECTL=("$("$CP" bin-dir)/kubectl" --kubeconfig "$KCFG")

step "operator build"
cargo build --locked --bin mw-operator

step "CRD and RBAC"
bash "$CP" install-operator "$NAME"

step "operator (logs: $LOGS/operator.log)"
bash "$CP" start-operator "$NAME" "$REPO/target/debug/mw-operator" >/dev/null

step "samples"
"${KUBECTL[@]}" apply -f config/samples/
if ! "${KUBECTL[@]}" wait --for=condition=Ready managedworkloads --all --timeout=120s; then
  echo "the samples did not become Ready; operator log: $LOGS/operator.log" >&2
  "${KUBECTL[@]}" get managedworkloads -o yaml >&2
  exit 1
fi
"${KUBECTL[@]}" get managedworkloads -o wide
"${KUBECTL[@]}" get deployments,pods -o wide

if [ "${MW_REAL_NODE:-0}" != 0 ]; then
  step "the samples on real containers: namespace real-node, on the real node, local images"
  bash "$CP" node-namespace "$NAME" real-node
  # The samples name registry images, and no registry is reachable here: the same workloads
  # run the local HTTP server image (hack/images.py) on its port instead.
  REAL_SAMPLES=$(sed -e 's#^\(  image:\) .*#\1 mw-test.invalid/httpd:1#' -e 's#containerPort: 80$#containerPort: 8080#' config/samples/*.yaml)
  if grep '^  image:' <<<"$REAL_SAMPLES" | grep -vq 'mw-test.invalid/'; then
    echo "a sample's image was not replaced by a local one; see hack/demo.sh" >&2; exit 1
  fi
  "${KUBECTL[@]}" -n real-node apply -f - <<<"$REAL_SAMPLES"
  if ! "${KUBECTL[@]}" -n real-node wait --for=condition=Ready managedworkloads --all --timeout=180s; then
    echo "the samples on the real node did not become Ready; logs: $LOGS/ (kubelet.log, containerd.log)" >&2
    "${KUBECTL[@]}" -n real-node get managedworkloads,pods -o wide >&2
    exit 1
  fi
  "${KUBECTL[@]}" -n real-node get managedworkloads,pods -o wide
  for mw in $("${KUBECTL[@]}" -n real-node get managedworkloads -o name); do
    ip=$("${KUBECTL[@]}" -n real-node get "$mw" -o jsonpath='{.status.podIP}')
    echo "curl http://$ip:8080/  ($mw, a real container) → $(curl -s --max-time 5 "http://$ip:8080/" || echo 'no answer')"
  done
fi

step "bridge: Manager's SQLite database → ManagedWorkloads in namespace manager (logs: $LOGS/bridge.log)"
DB=$(bash "$HERE/manager-db.sh" sqlite "$REPO/target/demo-$NAME/manager.sqlite")
echo "before: $(sqlite3 "$DB" 'SELECT group_concat(hostname || " containerId=" || ifnull(containerId, "NULL") || " ipv4Address=" || ifnull(ipv4Address, "NULL"), "; ") FROM Containers')"
bash "$CP" start-bridge "$NAME" "$REPO/target/debug/mw-operator" manager \
  --database-url "sqlite://$DB" --node k8s-lab-1=manager --requests-percent 1 --metrics-address 127.0.0.1:0 \
  --rootfs-mount-path '' >/dev/null  # no rootfs volumes: the demo control plane has no StorageClass
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
