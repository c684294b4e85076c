# Sourced by hack/demo.sh (`make demo`) and hack/test-compat.sh (`make test-compat`):
# config/samples/ on a local control plane, with what the samples need from a cluster
# simulated the way a cluster would offer it: a GPU node (kwok, labelled, tainted, two GPUs)
# for gpu.yaml, a default StorageClass with hostPath volumes for the disks, and a load
# balancer's address for loadbalancer.yaml (set on the Service's status, as a cloud's
# controller would). The caller sets KUBECTL (an array: kubectl and its --kubeconfig), LOGS
# (where the operator logs) and VOLUMES (a directory for the hostPath volumes).

# The GPU node, the default StorageClass and eight volumes.
samples_cluster_offers() {
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
}

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

# Apply config/samples/ in namespace default and wait (at most 120 s) for every workload to be
# Ready in the phase it asks for; then show them and check that the GPU sample's Pod landed on
# the GPU node.
samples_apply() {
  "${KUBECTL[@]}" apply -f "$REPO/config/samples/"
  simulate_load_balancers default
  if ! "${KUBECTL[@]}" wait --for=condition=Ready managedworkloads --all --timeout=120s; then
    echo "the samples did not become Ready; operator log: $LOGS/operator.log" >&2
    "${KUBECTL[@]}" get managedworkloads -o yaml >&2
    exit 1
  fi
  "${KUBECTL[@]}" get managedworkloads -o wide
  "${KUBECTL[@]}" get deployments,pods,services,persistentvolumeclaims -o wide
  # Ready means the phase asked for was reached: Running, or Stopped for `state: Stopped`.
  local name state phase gpu_node
  while IFS=/ read -r name state phase; do
    [ "$phase" = "${state:-Running}" ] || { echo "sample $name is Ready in phase '$phase', not ${state:-Running}" >&2; exit 1; }
  done < <("${KUBECTL[@]}" get managedworkloads \
    -o jsonpath='{range .items[*]}{.metadata.name}/{.spec.state}/{.status.phase}{"\n"}{end}')
  gpu_node=$("${KUBECTL[@]}" get pods -l app.kubernetes.io/instance=trainer -o jsonpath='{.items[0].spec.nodeName}')
  [ "$gpu_node" = kwok-gpu-node-0 ] || { echo "the GPU sample's Pod runs on '$gpu_node', not the GPU node" >&2; exit 1; }
  echo "GPU placement: trainer's Pod asked for 1 nvidia.com/gpu and runs on $gpu_node"
}
