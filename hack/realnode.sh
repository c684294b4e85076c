# shellcheck shell=bash
# The real node: a kubelet and kube-proxy built from the same Kubernetes tree as the control
# plane, Debian's containerd and runc, and CNI (bridge, host-local, loopback, portmap), joined
# to a local control plane beside its kwok nodes. Sourced by hack/controlplane.sh, whose
# helpers (start, stop_wave, pid_runs, sign, write_kubeconfig, wait_for, ...) it uses:
#
#   hack/controlplane.sh node-build          build (or reuse) kubelet, kube-proxy, cri-cleanup
#   hack/controlplane.sh node-up NAME        start the real node of control plane NAME
#   hack/controlplane.sh node-down NAME      stop it and remove every trace (also after a kill)
#   hack/controlplane.sh node-status NAME    whether it runs and is Ready
#   hack/controlplane.sh node-namespace NAME NS   a namespace whose Pods all run on the real node
#   hack/controlplane.sh node-import NAME ARCHIVE  import an OCI image archive into its containerd
#   hack/controlplane.sh node-expose NAME PORT     let its Pods reach the host's 127.0.0.1:PORT
#                                                  (prints the address they use for it)
#   hack/controlplane.sh images              build the test images' OCI archive, print its path
#
# Why these choices:
# - containerd 1.6.20 from Debian 12: the kubelet 1.36 runs on it here over CRI v1 (it only
#   notes that 1.6 lacks the RuntimeConfig call, added in 1.7, and takes the cgroup driver
#   from its own config). 1.7 and 2.x are the lines Kubernetes 1.36 supports; 1.6 is past
#   its support window, but every real-node test passes on it. A
#   package keeps the cold `make test` short (no containerd build) and patched by Debian;
#   should a later kubelet refuse it, containerd 2.x builds from the Go module proxy.
# - cgroup v1 with the cgroupfs driver: this machine has no systemd and a v1 hierarchy, which
#   the kubelet accepts only with failCgroupV1: false. Pods live under the cgroup /mw-NAME,
#   so teardown can find every process they left.
# - restrict_oom_score_adj: the machine lacks CAP_SYS_RESOURCE, so runc cannot lower a
#   container's oom_score_adj below its own (the kubelet asks -997 for the sandbox); without
#   this every sandbox fails with "can't get final child's PID from pipe".
# - No registry is reachable: the sandbox image and every test image are built here
#   (hack/images.py) and imported; their names (mw-test.invalid/...) no registry serves.
# - One real node per machine: kube-proxy owns the host's KUBE-* iptables chains and two
#   kube-proxies would overwrite each other's rules. A lock file names the owner.
# - The node is tainted and labelled mw-test/real-node=true: ordinary Pods (and every
#   kwok-based test) never land on it; a Pod picks it with a toleration and a nodeSelector,
#   or by living in a namespace whose PodNodeSelector/PodTolerationRestriction annotations
#   add both (see node_namespace_annotations).
# - Every server here listens on loopback, the API server too (and it advertises 127.0.0.1,
#   with no endpoint for the `kubernetes` Service). A Pod cannot reach the host's loopback, so
#   the node DNATs what Pods send to the Service's cluster IP (10.96.0.1:443, which the API
#   server's certificate names) to the API server's loopback port: in-cluster configuration
#   works as in any cluster, and nothing listens on another address. The kernel routes such
#   packets because kube-proxy sets route_localnet (for localhost NodePorts); node-expose
#   does the same for another loopback server (a database) at the bridge's gateway address.
#   The API server reaches the kubelet (kubectl logs, exec) at the node's name, which
#   /etc/hosts maps to 127.0.0.1 while the node runs.

NODE_BINARIES=(kubelet kube-proxy cri-cleanup)
REAL_NODE=mw-real-node
REAL_NODE_KEY=mw-test/real-node
REAL_NODE_LOCK=/run/mw-operator-realnode.lock
POD_SUBNET=10.88.0.0/24
POD_GATEWAY=10.88.0.1
KUBERNETES_SERVICE_IP=10.96.0.1
CNI_BRIDGE=mwbr0
CNI_NETWORK=mw-real-node
CNI_BIN_DIR=/usr/lib/cni
# The host settings the kubelet, CNI or kube-proxy change, restored at teardown.
NODE_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables)

node_cache_key() {
  {
    echo "$K8S_VERSION"
    cat "$BUILD_MODULE/go.mod" "$BUILD_MODULE/go.sum" "$BUILD_MODULE/cmd/cri-cleanup/main.go"
  } | sha256sum | cut -c1-12
}

# Beside the control plane's binaries, not inside: a control-plane rebuild replaces its
# directory whole, and the demo (which may not want a real node) never pays for these.
node_bin_dir() { echo "$CACHE_ROOT/bin/k8s-$K8S_VERSION-node-$(node_cache_key)"; }

# The packages the node runs on, from Debian (see above for why containerd 1.6 is fine).
ensure_node_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x "$CNI_BIN_DIR/bridge" ] || missing+=(containernetworking-plugins)
  # The images' one binary: it must be the static build (the dynamic `busybox` package's
  # would find no libc inside an image).
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' || missing+=(busybox-static)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v ip >/dev/null || missing+=(iproute2)
  # The system-container test image's Debian (hack/systemd-image.sh).
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if ((${#missing[@]})); then
    log "installing ${missing[*]} from Debian's packages (the real node's runtime)"
    local sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

cmd_node_build() {
  # The real node is the current line's kubelet; the compat line tests the API server only.
  [ "$CONTROLPLANE" = current ] || die "the real node exists for the current Kubernetes line only, not $CONTROLPLANE"
  ensure_tools
  local dir; dir=$(node_bin_dir)
  local ok=1 b
  for b in "${NODE_BINARIES[@]}"; do [ -x "$dir/$b" ] || ok=0; done
  if ((ok)); then echo "$dir"; return 0; fi
  log "building kubelet and kube-proxy $K8S_VERSION into $dir (once; how long: docs/testing.md, Timings)"
  local tmp="$dir.partial.$$" start=$SECONDS
  rm -rf "$tmp"; mkdir -p "$tmp"
  local ldflags; ldflags=$(version_ldflags)
  (
    cd "$BUILD_MODULE"
    export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
    for b in kubelet kube-proxy; do
      log "go build $b"
      go build -ldflags "$ldflags" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b"
    done
    go build -ldflags "-s -w" -o "$tmp/cri-cleanup" ./cmd/cri-cleanup
  )
  rm -rf "$dir"; mv "$tmp" "$dir"
  log "node binaries built in $((SECONDS - start))s"
  echo "$dir"
}

# The OCI archive of the test images, rebuilt only when hack/images.py or busybox changes.
cmd_images() {
  local key dir
  key=$( { cat "$HERE/images.py" "$HERE/oci.py"; dpkg-query -W -f='${Version}' busybox-static 2>/dev/null; } | sha256sum | cut -c1-12)
  dir="$CACHE_ROOT/images/$key"
  if [ ! -s "$dir/mw-test-images.tar" ]; then
    mkdir -p "$dir"
    python3 "$HERE/images.py" "$dir/mw-test-images.tar"
  fi
  echo "$dir/mw-test-images.tar"
}

# Annotations that send every Pod of a namespace to the real node (the API server runs the
# PodNodeSelector and PodTolerationRestriction admission plugins).
node_namespace_annotations() {
  printf 'scheduler.alpha.kubernetes.io/node-selector=%s=true\n' "$REAL_NODE_KEY"
  printf 'scheduler.alpha.kubernetes.io/defaultTolerations=[{"key":"%s","operator":"Equal","value":"true","effect":"NoSchedule"}]\n' "$REAL_NODE_KEY"
}

# Create namespace NS on control plane NAME (if missing) with those annotations.
cmd_node_namespace() {
  local name=${1:?NAME} ns=${2:?NAMESPACE}
  local kubectl=("$(bin_dir)/kubectl" --kubeconfig "$RUN_ROOT/$name/kubeconfig")
  "${kubectl[@]}" create namespace "$ns" --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
  local annotations=()
  mapfile -t annotations < <(node_namespace_annotations)
  "${kubectl[@]}" annotate --overwrite namespace "$ns" "${annotations[@]}" >/dev/null
}

free_port_pair() { echo "$(free_port) $(free_port)"; }

# Every cgroup v1 hierarchy (or the v2 root) in which the node's Pods live.
node_cgroup_dirs() {
  local name=$1 d
  if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
    echo "/sys/fs/cgroup/mw-$name"
  else
    for d in /sys/fs/cgroup/*/; do
      [ -e "$d/cgroup.procs" ] || continue
      echo "${d%/}/mw-$name"
    done
  fi
}

cmd_node_up() {
  local name=${1:?NAME}
  [ "$CONTROLPLANE" = current ] || die "the real node exists for the current Kubernetes line only, not $CONTROLPLANE"
  local state="$RUN_ROOT/$name" logs="$LOG_ROOT/$name"
  local node="$state/node"
  [ -f "$state/kubeconfig" ] || die "control plane '$name' is not up (hack/controlplane.sh up $name)"
  local kubectl=("$(bin_dir)/kubectl" --kubeconfig "$state/kubeconfig")
  if node_alive "$state" && "${kubectl[@]}" get node "$REAL_NODE" >/dev/null 2>&1; then
    log "real node of '$name' is already up"; return 0
  fi
  [ "$(id -u)" = 0 ] || die "the real node runs containers: it needs root (containerd, runc, iptables)"
  node_lock_free "$name"
  # Whatever a killed earlier run of this node left goes first.
  node_cleanup "$name" || die "an earlier real node of '$name' could not be cleaned up (see above)"
  claim_bridge
  echo "$state" >"$REAL_NODE_LOCK"
  ensure_node_packages
  local nbin images systemd_image
  nbin=$(cmd_node_build)
  images=$(cmd_images)
  systemd_image=$(bash "$HERE/systemd-image.sh")
  local t0=$SECONDS
  mkdir -p "$node"/{containerd/root,containerd/state,cni/net.d,cni/ipam,kubelet/pki} "$state/pids"

  # Host settings this node changes, recorded so that teardown puts them back.
  local s
  for s in "${NODE_SYSCTLS[@]}"; do
    printf '%s=%s\n' "$s" "$(sysctl -n "$s" 2>/dev/null || echo '')"
  done >"$node/sysctl.orig"
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true

  # The cgroup the node's Pods live under (the kubelet requires its cgroupRoot to exist).
  local cg
  while read -r cg; do
    mkdir -p "$cg"
    if [ -e "$(dirname "$cg")/cpuset.cpus" ]; then
      cat "$(dirname "$cg")/cpuset.cpus" >"$cg/cpuset.cpus"
      cat "$(dirname "$cg")/cpuset.mems" >"$cg/cpuset.mems"
    fi
  done < <(node_cgroup_dirs "$name")

  # Credentials signed by the control plane's CA: the kubelet as system:node:NODE (the Node
  # authorizer and NodeRestriction admit exactly what a node may do), kube-proxy as
  # system:kube-proxy (bound to system:node-proxier by the bootstrap RBAC).
  (
    cd "$state/pki"
    umask 077
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    sign kubelet "/O=system:nodes/CN=system:node:$REAL_NODE" client.ext
    sign kube-proxy "/CN=system:kube-proxy" client.ext
    rm -f ./*.csr ./*.ext ca.srl
  )
  local server
  server=$(sed -n 's/^ *server: //p' "$state/kubeconfig" | head -1)
  write_kubeconfig "$state/kubelet.kubeconfig" kubelet "$server" "$state/pki"
  write_kubeconfig "$state/kube-proxy.kubeconfig" kube-proxy "$server" "$state/pki"

  local sock="$node/containerd/containerd.sock"
  cat >"$node/containerd.toml" <<TOML
# containerd for the real node of control plane '$name' (written by hack/realnode.sh).
version = 2
root = "$node/containerd/root"
state = "$node/containerd/state"
# Plugins that would write outside the node's directories or need what is not here.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "mw-test.invalid/pause:1"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state inside the node's directory (by default /run/containerd/runc).
        Root = "$node/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$node/cni/net.d"
TOML

  # No masquerading: Pods talk to the host and to each other, never out (there is no
  # internet to reach), so the bridge plugin adds no iptables rule at all. portmap acts only
  # for Pods with hostPorts.
  cat >"$node/cni/net.d/10-mw-real-node.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$node/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON

  start "$state" "$logs" containerd "$(command -v containerd)" --config "$node/containerd.toml"
  wait_for "containerd" 60 "$logs" ctr --address "$sock" version || { cmd_node_down "$name"; return 1; }
  local archive
  for archive in "$images" "$systemd_image"; do
    ctr --address "$sock" -n k8s.io images import "$archive" >/dev/null ||
      { log "importing $archive failed; see $logs/containerd.log"; cmd_node_down "$name"; return 1; }
  done

  local kubelet_port healthz_port proxy_healthz proxy_metrics
  read -r kubelet_port healthz_port < <(free_port_pair)
  read -r proxy_healthz proxy_metrics < <(free_port_pair)
  local cgroup_root="/mw-$name"
  cat >"$node/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 and no systemd (see hack/realnode.sh).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $cgroup_root
containerRuntimeEndpoint: unix://$sock
# Loopback only, like every other server here.
address: 127.0.0.1
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $state/pki/ca.crt}
authorization: {mode: Webhook}
registerNode: true
registerWithTaints:
- {key: $REAL_NODE_KEY, value: "true", effect: NoSchedule}
failSwapOn: false
# A shared development machine: never evict test Pods because other work fills the disk
# or memory, and never garbage-collect the imported images (they cannot be pulled again).
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# Inside the node's directory (by default /var/log/pods); the kubelet still links each
# container's log from /var/log/containers, which teardown removes.
podLogsDir: $node/pod-logs
containerLogMaxSize: 1Mi
containerLogMaxFiles: 2
# A crash-looping container is restarted at most 10 s apart (the default back-off doubles to
# 5 minutes): the tests watch several real restart cycles in half a minute. The cycle itself
# (waiting, running, terminated, CrashLoopBackOff) is the kubelet's own.
crashLoopBackOff: {maxContainerRestartPeriod: 10s}
YAML
  start "$state" "$logs" kubelet "$nbin/kubelet" \
    --config="$node/kubelet.yaml" --kubeconfig="$state/kubelet.kubeconfig" \
    --root-dir="$node/kubelet" --cert-dir="$node/kubelet/pki" \
    --hostname-override="$REAL_NODE" --node-labels="$REAL_NODE_KEY=true" --v=1

  cat >"$node/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $state/kube-proxy.kubeconfig}
hostnameOverride: $REAL_NODE
mode: iptables
clusterCIDR: $POD_SUBNET
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$proxy_healthz
metricsBindAddress: 127.0.0.1:$proxy_metrics
nodePortAddresses: [primary]
# Leave the host's conntrack table settings alone (0 = do not change).
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
  start "$state" "$logs" kube-proxy "$nbin/kube-proxy" --config="$node/kube-proxy.yaml" --v=1
  node_hosts_entry add || { cmd_node_down "$name"; return 1; }
  local api_port=${server##*:}
  node_dnat "$name" "$KUBERNETES_SERVICE_IP" 443 "$api_port" "the API server (in-cluster configuration)" ||
    { cmd_node_down "$name"; return 1; }

  wait_for "the real node to be Ready" 120 "$logs" "${kubectl[@]}" wait --for=condition=Ready \
    "node/$REAL_NODE" --timeout=2s || { cmd_node_down "$name"; return 1; }
  node_alive "$state" || { log "a real-node component died during start-up; logs are in $logs"; cmd_node_down "$name"; return 1; }
  log "real node '$REAL_NODE' of '$name' up in $((SECONDS - t0))s (taint and label $REAL_NODE_KEY=true)"
}

# containerd, kubelet and kube-proxy all run.
node_alive() {
  local state=$1 c
  for c in containerd kubelet kube-proxy; do
    [ -e "$state/pids/$c.pid" ] && pid_runs "$(cat "$state/pids/$c.pid")" || return 1
  done
}

# Fail unless the machine's one real node is free for control plane NAME: no lock, or one
# that NAME holds, or one whose control plane's node no longer runs.
node_lock_free() {
  local name=$1 owner
  [ -e "$REAL_NODE_LOCK" ] || return 0
  owner=$(cat "$REAL_NODE_LOCK")
  if [ "$owner" != "$RUN_ROOT/$name" ] && node_alive "$owner" 2>/dev/null; then
    die "a real node already runs on this machine, for the control plane in $owner (one per machine: it owns the host's KUBE-* iptables chains); stop it first (hack/controlplane.sh node-down NAME, or make demo-down)"
  fi
}

# Fail when the CNI bridge carries another real node's Pods; remove one left empty. The lock
# lives in /run, so a node started from another container that shares this network namespace
# (a CI job beside a demo) does not hold it, yet its Pods sit on the same bridge: the CNI
# bridge plugin would take that bridge over, and two host-local IP pools on one bridge hand
# out the same Pod IPs (requests reach the other node's Pod, probes fail).
claim_bridge() {
  ip link show "$CNI_BRIDGE" >/dev/null 2>&1 || return 0
  local ports
  ports=$(ip -o link show master "$CNI_BRIDGE" 2>/dev/null | wc -l)
  if [ "$ports" -gt 0 ]; then
    die "the CNI bridge $CNI_BRIDGE has $ports Pod interface(s) of another real node on it: one runs in this network namespace outside this checkout's view (make demo in another checkout or container?); stop it first (make demo-down there)"
  fi
  ip link delete "$CNI_BRIDGE" || die "could not delete the empty bridge $CNI_BRIDGE left by an earlier run"
}

# The comment that marks node NAME's DNAT rules (teardown removes them by it).
node_dnat_comment() { echo "mw-real-node $1"; }

# DNAT what node NAME's Pods send to ADDRESS:PORT to the host's 127.0.0.1:TARGET. Idempotent.
node_dnat() {
  local name=$1 address=$2 port=$3 target=$4 what=$5
  local rule=(PREROUTING -i "$CNI_BRIDGE" -d "$address/32" -p tcp --dport "$port"
    -m comment --comment "$(node_dnat_comment "$name"): $what"
    -j DNAT --to-destination "127.0.0.1:$target")
  iptables -w 5 -t nat -C "${rule[@]}" 2>/dev/null && return 0
  # First in PREROUTING: before kube-proxy's KUBE-SERVICES, which has no endpoint for it.
  iptables -w 5 -t nat -I "${rule[@]:0:1}" 1 "${rule[@]:1}" ||
    { log "could not add the DNAT rule for $what"; return 1; }
}

# Let node NAME's Pods reach the host's loopback server on PORT; prints the address they use.
cmd_node_expose() {
  local name=${1:?NAME} port=${2:?PORT}
  node_alive "$RUN_ROOT/$name" || die "the real node of '$name' is not up"
  node_dnat "$name" "$POD_GATEWAY" "$port" "$port" "127.0.0.1:$port" || return 1
  echo "$POD_GATEWAY:$port"
}

# Import the OCI image archive ARCHIVE into node NAME's containerd (the kubelet's namespace),
# where its Pods find it without a registry.
cmd_node_import() {
  local name=${1:?NAME} archive=${2:?ARCHIVE}
  local sock="$RUN_ROOT/$name/node/containerd/containerd.sock"
  node_alive "$RUN_ROOT/$name" || die "the real node of '$name' is not up"
  ctr --address "$sock" -n k8s.io images import "$archive" >/dev/null || die "importing $archive failed"
}

# Map the node's name to 127.0.0.1 in /etc/hosts (add), or remove that line (remove).
# Written in place: /etc/hosts is often a bind mount, which a rename would fail on.
node_hosts_entry() {
  local line="127.0.0.1 $REAL_NODE # hack/realnode.sh" rest
  rest=$(grep -vxF "$line" /etc/hosts || true)
  case $1 in
    add) printf '%s\n%s\n' "$rest" "$line" >/etc/hosts ;;
    remove) grep -qxF "$line" /etc/hosts && printf '%s\n' "$rest" >/etc/hosts ;;
  esac
  return 0
}

# Remove node NAME's DNAT rules.
remove_node_dnat() {
  local name=$1 rule
  while read -r rule; do
    eval "iptables -w 5 -t nat -D ${rule#-A }" 2>/dev/null || true
  done < <(iptables-save -t nat 2>/dev/null | grep -F -- "--comment \"$(node_dnat_comment "$name"):" || true)
}

cmd_node_down() {
  local name=${1:?NAME}
  node_cleanup "$name" || { log "real node of '$name' NOT fully removed: see above"; return 1; }
  log "real node of '$name' stopped and removed"
}

cmd_node_status() {
  local name=${1:?NAME} state="$RUN_ROOT/${1:?NAME}"
  if node_alive "$state" && "$(bin_dir)/kubectl" --kubeconfig "$state/kubeconfig" wait --for=condition=Ready \
    "node/$REAL_NODE" --timeout=5s >/dev/null 2>&1; then
    log "real node '$REAL_NODE' of '$name' is up and Ready"
  else
    log "real node of '$name' is not up"; return 1
  fi
}

# Remove everything a real node of NAME may have left, whether it was stopped in order or
# killed mid-run: Pods (through the CRI, so CNI tears their networks down), the kubelet,
# kube-proxy and its iptables rules, containerd, shims, container processes, mounts, network
# namespaces, veth pairs, the bridge, cgroups, IPAM and CNI cache files, the changed host
# settings, the node's files and the lock. Idempotent; returns non-zero if something stays.
node_cleanup() {
  local name=$1
  local state="$RUN_ROOT/$name" node="$RUN_ROOT/$name/node"
  local sock="$node/containerd/containerd.sock" nbin failed=0
  [ -d "$node" ] || [ -e "$state/pids/kubelet.pid" ] || [ -e "$state/pids/containerd.pid" ] || {
    node_release_lock "$name"; return 0; }
  # Only now: the compat line (no real node) has no node build to name.
  nbin=$(node_bin_dir)

  # 1. The kubelet first, so that nothing restarts what follows removes.
  stop_wave "$state" kubelet || failed=1
  # Its Node object goes too (when the API server still answers): a node that will never
  # report again must not keep Pods bound to it.
  if healthy "$state"; then
    "$(bin_dir)/kubectl" --kubeconfig "$state/kubeconfig" --request-timeout=5s delete node "$REAL_NODE" \
      --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  # 2. Every Pod through the CRI while containerd still runs: StopPodSandbox runs CNI DEL.
  if [ -S "$sock" ] && [ -x "$nbin/cri-cleanup" ] && ctr --address "$sock" version >/dev/null 2>&1; then
    timeout 90 "$nbin/cri-cleanup" -endpoint "unix://$sock" -timeout 80s >&2 || log "cri-cleanup failed; removing what is left by hand"
  fi
  # 3. kube-proxy, and its rules (its --cleanup removes the KUBE-* chains it owns). Only the
  #    lock's owner does this: the chains are the machine's, not this control plane's.
  stop_wave "$state" kube-proxy || failed=1
  if [ "$(cat "$REAL_NODE_LOCK" 2>/dev/null)" = "$state" ]; then
    if [ -x "$nbin/kube-proxy" ]; then
      "$nbin/kube-proxy" --cleanup --v=0 >/dev/null 2>&1 || log "kube-proxy --cleanup reported an error"
    fi
    # The kubelet's own chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT), which
    # kube-proxy --cleanup leaves, and anything of kube-proxy's it missed.
    remove_kube_chains || failed=1
  fi
  remove_node_dnat "$name"
  [ "$(cat "$REAL_NODE_LOCK" 2>/dev/null)" = "$state" ] && node_hosts_entry remove
  # 4. containerd.
  stop_wave "$state" containerd || failed=1
  # 5. Shims and container processes containerd leaves behind when it was killed: shims are
  #    found by the socket address of this node's containerd on their command line,
  #    container processes by this node's cgroup.
  local pid pids=() shim_sockets=()
  for pid in $(pgrep -f -- "-address $sock" 2>/dev/null || true); do
    pids+=("$pid")
    # The socket a shim listens on (under /run/containerd/s/) outlives a SIGKILLed shim.
    mapfile -t -O "${#shim_sockets[@]}" shim_sockets < <(process_unix_sockets "$pid" | grep '^/run/containerd/s/' || true)
  done
  local cg
  while read -r cg; do
    [ -d "$cg" ] || continue
    while read -r pid; do [ -n "$pid" ] && pids+=("$pid"); done < <(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
  done < <(node_cgroup_dirs "$name")
  if ((${#pids[@]})); then
    log "killing ${#pids[@]} leftover shim/container processes of '$name': ${pids[*]}"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    for pid in "${pids[@]}"; do
      while pid_runs "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
      pid_runs "$pid" && { log "pid $pid survived SIGKILL"; failed=1; }
    done
  fi
  rm -f "${shim_sockets[@]}"
  # 6. Network: Pod netns on this node's subnet (left when CNI DEL never ran), the veth
  #    pairs on its bridge, the bridge, and CNI's cache entries for its network.
  local ns
  for ns in /run/netns/cni-*; do
    [ -e "$ns" ] || continue
    if ip -n "$(basename "$ns")" -4 addr show 2>/dev/null | grep -q "inet ${POD_SUBNET%.*}\."; then
      ip netns delete "$(basename "$ns")" 2>/dev/null || { umount "$ns" 2>/dev/null; rm -f "$ns"; }
    fi
  done
  if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
    local veth
    for veth in $(ip -o link show master "$CNI_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link delete "$veth" 2>/dev/null || true
    done
    ip link delete "$CNI_BRIDGE" 2>/dev/null || { log "could not delete the bridge $CNI_BRIDGE"; failed=1; }
  fi
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
  # libcni also caches the loopback network's result per sandbox (cni-loopback-ID-lo); the
  # sandboxes' IDs are the directory names containerd's CRI keeps for them.
  local id
  for id in $(ls "$node"/containerd/{root,state}/io.containerd.grpc.v1.cri/sandboxes 2>/dev/null | sort -u); do
    rm -f /var/lib/cni/results/*-"$id"-* 2>/dev/null || true
  done
  # Directories CNI and containerd create on first use, when nothing else uses them.
  rmdir /var/lib/cni/results /var/lib/cni /run/netns /run/containerd/s /run/containerd /var/log/containers 2>/dev/null || true
  # The kubelet's links to container logs that lived in this node's pod-logs directory.
  local link
  for link in /var/log/containers/*.log; do
    [ -L "$link" ] && [[ "$(readlink "$link")" == "$node/"* ]] && rm -f "$link"
  done
  # 7. Mounts under the node's directory (rootfs overlays, shm, Pod volumes), deepest first.
  if [ -d "$node" ]; then
    local m
    while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || { log "could not unmount $m"; failed=1; }
    done < <(awk -v p="$node/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  fi
  # 8. Cgroups, deepest first (empty now that their processes are gone).
  while read -r cg; do
    [ -d "$cg" ] || continue
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ -d "$cg" ] && { log "cgroup $cg is still there"; failed=1; }
  done < <(node_cgroup_dirs "$name")
  # 9. Host settings back as they were.
  if [ -f "$node/sysctl.orig" ]; then
    local kv
    while read -r kv; do
      [ -n "${kv#*=}" ] && sysctl -qw "$kv" 2>/dev/null || true
    done <"$node/sysctl.orig"
  fi
  ((failed)) && return 1
  # 10. Files: --one-file-system, so a mount that survived the above is never descended into.
  rm -rf --one-file-system "$node" "$state"/{kubelet,kube-proxy}.kubeconfig "$state"/pki/{kubelet,kube-proxy}.{crt,key}
  rm -f "$state"/cmd/{containerd,kubelet,kube-proxy}
  node_release_lock "$name"
}

# Remove every KUBE-* iptables chain and every rule that jumps to one, IPv4 and IPv6. Only
# the lock's owner calls this: one real node per machine, so these are its kubelet's and
# kube-proxy's. Returns non-zero when one stays.
remove_kube_chains() {
  local tool table rule chain left=0
  for tool in iptables ip6tables; do
    command -v "$tool-save" >/dev/null || continue
    for table in filter nat mangle raw; do
      # Rules in any chain that jump to a KUBE-* chain (iptables-save quotes comments the way
      # the shell reads them, hence eval).
      while read -r rule; do
        eval "$tool -w 5 -t $table -D ${rule#-A }" 2>/dev/null || true
      done < <("$tool-save" -t "$table" 2>/dev/null | grep -E '^-A .* -j KUBE-[A-Z0-9-]+( |$)' | grep -v '^-A KUBE-' || true)
      for chain in $("$tool-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
        "$tool" -w 5 -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$tool-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
        "$tool" -w 5 -t "$table" -X "$chain" 2>/dev/null || true
      done
      if "$tool-save" -t "$table" 2>/dev/null | grep -q 'KUBE-'; then
        log "$tool table $table still has KUBE-* rules"; left=1
      fi
    done
  done
  return "$left"
}

# The paths of the unix sockets process PID holds open.
process_unix_sockets() {
  local pid=$1 fd inodes=()
  for fd in /proc/"$pid"/fd/*; do
    fd=$(readlink "$fd" 2>/dev/null) || continue
    [[ "$fd" == socket:\[*\] ]] && inodes+=("${fd//[^0-9]/}")
  done
  ((${#inodes[@]})) || return 0
  awk -v list=" ${inodes[*]} " 'NR > 1 && $8 != "" && index(list, " " $7 " ") {print $8}' /proc/net/unix
}

node_release_lock() {
  [ "$(cat "$REAL_NODE_LOCK" 2>/dev/null)" = "$RUN_ROOT/$1" ] && rm -f "$REAL_NODE_LOCK"
  return 0
}
