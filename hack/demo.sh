#!/usr/bin/env bash
# `make demo`: start the local control plane, install the CRD and RBAC, run the operator
# against it, apply config/samples/ and show every workload Ready. What the samples need is
# simulated the way a cluster would offer it: a GPU node (kwok, labelled, tainted, two GPUs)
# for gpu.yaml, a default StorageClass with hostPath volumes for the disks, and a load
# balancer's address for loadbalancer.yaml (set on the Service's status, as a cloud's
# controller would). Then the bridge: a SQLite Manager database built from Manager's real
# schema, seeded with three containers on a `kubernetes` node, synced into namespace `manager`
# with their disks; the demo shows them Running and the rows' containerId/ipv4Address filled
# in. Everything stays up afterwards so you can try kubectl (and sqlite3) on it;
# `make demo-down` (or `make cluster-down`) stops it.
# MW_REAL_NODE=1 adds the real node (hack/realnode.sh) and runs the samples there too, on
# local images, showing each one's HTTP answer (all but the GPU sample: the real node has no
# GPU).
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
step "local control plane (the first run builds Kubernetes from source: see docs/testing.md for how long)"
bash "$CP" up "$NAME"
KCFG=$("$CP" kubeconfig "$NAME")
LOGS=$("$CP" log-dir "$NAME")
KUBECTL=("$("$CP" bin-dir)/kubectl" --kubeconfig "$KCFG")
VOLUMES="$REPO/target/demo-$NAME/volumes"

step "what a cluster would offer: a GPU node, a default StorageClass and volumes"
"${KUBECTL[@]}" apply -f "$HERE/kwok/gpu-node.yaml" >/dev/null
# No provisioner: kube-controller-manager binds each claim to one of these hostPath volumes.
# hostPath is real storage on the real node (which shares this machine's filesystem) and
# harmless on kwok's nodes, which mount nothing.
{
  cat <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: demo-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
allowVolumeExpansion: true
reclaimPolicy: Retain
YAML
  for i in $(seq 0 7); do
    cat <<YAML
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: demo-pv$i}
spec:
  capacity: {storage: 100Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: demo-local
  hostPath: {path: "$VOLUMES/pv$i", type: DirectoryOrCreate}
YAML
  done
} | "${KUBECTL[@]}" apply -f - >/dev/null
"${KUBECTL[@]}" wait --for=condition=Ready node/kwok-gpu-node-0 --timeout=60s >/dev/null

# The cloud's part for LoadBalancer Services: once the operator has made a workload's Service,
# give it an address of its own from TEST-NET-1 (192.0.2.0/24), as a cloud controller or MetalLB
# would. A Service that has one keeps it (a second run changes nothing); a new one gets the next
# address after those already given, in any namespace.
simulate_load_balancers() {
  local ns=$1 mw svc n
  n=$((100 + $("${KUBECTL[@]}" get services -A \
      -o jsonpath='{range .items[*]}{.status.loadBalancer.ingress[0].ip}{"\n"}{end}' | grep -c '^192\.0\.2\.' || true)))
  for mw in $("${KUBECTL[@]}" -n "$ns" get managedworkloads \
      -o jsonpath='{range .items[?(@.spec.service.type=="LoadBalancer")]}{.metadata.name}{"\n"}{end}'); do
    svc=""
    for _ in $(seq 1 60); do
      svc=$("${KUBECTL[@]}" -n "$ns" get managedworkload "$mw" -o jsonpath='{.status.service.name}')
      [ -n "$svc" ] && break
      sleep 1
    done
    [ -n "$svc" ] || { echo "workload $ns/$mw has no Service after 60 s; operator log: $LOGS/operator.log" >&2; exit 1; }
    if [ -n "$("${KUBECTL[@]}" -n "$ns" get service "$svc" -o jsonpath='{.status.loadBalancer.ingress[0].ip}')" ]; then
      continue
    fi
    "${KUBECTL[@]}" -n "$ns" patch service "$svc" --subresource=status --type merge \
      -p "{\"status\":{\"loadBalancer\":{\"ingress\":[{\"ip\":\"192.0.2.$n\"}]}}}" >/dev/null
    echo "load balancer (simulated): service $ns/$svc has address 192.0.2.$n"
    n=$((n + 1))
  done
}

step "operator build"
cargo build --locked --bin mw-operator

step "CRD and RBAC"
bash "$CP" install-operator "$NAME"

step "operator (logs: $LOGS/operator.log)"
bash "$CP" start-operator "$NAME" "$REPO/target/debug/mw-operator" >/dev/null

step "samples"
"${KUBECTL[@]}" apply -f config/samples/
simulate_load_balancers default
if ! "${KUBECTL[@]}" wait --for=condition=Ready managedworkloads --all --timeout=120s; then
  echo "the samples did not become Ready; operator log: $LOGS/operator.log" >&2
  "${KUBECTL[@]}" get managedworkloads -o yaml >&2
  exit 1
fi
"${KUBECTL[@]}" get managedworkloads -o wide
"${KUBECTL[@]}" get deployments,pods,services,persistentvolumeclaims -o wide
gpu_node=$("${KUBECTL[@]}" get pods -l app.kubernetes.io/instance=trainer -o jsonpath='{.items[0].spec.nodeName}')
[ "$gpu_node" = kwok-gpu-node-0 ] || { echo "the GPU sample's Pod runs on '$gpu_node', not the GPU node" >&2; exit 1; }
echo "GPU placement: trainer's Pod asked for 1 nvidia.com/gpu and runs on $gpu_node"

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
