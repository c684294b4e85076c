#!/usr/bin/env bash
# A real, local Kubernetes control plane for the demo, the integration tests and the
# benchmarks: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
# (simulated nodes), all on loopback, all built from the Go module proxy at pinned
# versions and cached outside the repository.
#
#   hack/controlplane.sh build            build (or reuse) the pinned binaries
#   hack/controlplane.sh up   [NAME]      start a control plane (idempotent)
#   hack/controlplane.sh down [NAME]      stop it by PID and remove its files
#   hack/controlplane.sh status [NAME]    print where it is and whether it is healthy
#   hack/controlplane.sh kubeconfig [NAME]  print the admin kubeconfig path
#   hack/controlplane.sh log-dir [NAME]   print where its components log
#   hack/controlplane.sh install-operator [NAME]       CRD + RBAC for the operator
#   hack/controlplane.sh start-operator NAME BINARY    (re)start the operator as mw-operator
#   hack/controlplane.sh start-bridge NAME BINARY NS ARGS...  (re)start the bridge as mw-bridge,
#                                                    granted its role in namespace NS
#   hack/controlplane.sh stop-operator NAME            stop that operator (by its recorded PID)
#   hack/controlplane.sh operator-metrics NAME         print the operator's probe/metrics address
#   hack/controlplane.sh stop-component NAME COMPONENT   stop one process (etcd, kube-apiserver,
#                                         ..., operator) by its recorded PID
#   hack/controlplane.sh start-component NAME COMPONENT  start it again with the same flags and
#                                         ports (waits for the API server to be ready again)
#   hack/controlplane.sh bin-dir          print the directory holding the binaries
#   hack/controlplane.sh peer-build       build (or reuse) the controller-runtime peer (hack/peer)
#                                         `make bench` compares the operator with; prints its path
#   hack/controlplane.sh install-peer NAME  its ClusterRole (hack/peer/role.yaml) bound to user
#                                         mw-peer, the identity of peer.kubeconfig
#   hack/controlplane.sh node-build|node-up NAME|node-down NAME|node-status NAME|
#                        node-namespace NAME NS|node-import NAME ARCHIVE|node-expose NAME PORT|images
#                                         the real node (kubelet, kube-proxy, containerd,
#                                         CNI) and its local images: see hack/realnode.sh
#
# NAME defaults to "default"; `make test` uses "test" so a running demo is left alone.
# MW_CP_PROFILING=true serves the API server's Go profiles (`kubectl get --raw
# /debug/pprof/profile?seconds=30`), to see where its CPU goes under a benchmark.
# MW_REAL_NODE=1 makes `up` start the real node too. MW_CONTROLPLANE=compat builds and starts
# the oldest Kubernetes the operator supports instead (`make test-compat`).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)

# ---- pinned versions (changing one rebuilds; the cache key covers go.mod/go.sum too) ----
# MW_CONTROLPLANE picks the Kubernetes line: `current` (the default: what the demo, the tests
# and the real node run) or `compat`, the oldest Kubernetes the operator supports, for
# `make test-compat` (docs/install.md, "Supported Kubernetes versions"). Each line has its own
# build module and so its own cache directory; the real node exists for `current` only. A
# control plane records its line, and later commands on it use that line (see adopt_line).
select_line() {
  CONTROLPLANE=$1
  case "$CONTROLPLANE" in
    current)
      K8S_VERSION=v1.36.3
      ETCD_VERSION=v3.6.8 # the etcd Kubernetes v1.36 pins in its go.mod
      BUILD_MODULE="$HERE/controlplane" ;;
    compat)
      K8S_VERSION=v1.31.14
      ETCD_VERSION=v3.5.14 # the etcd client Kubernetes v1.31 pins in its go.mod
      BUILD_MODULE="$HERE/controlplane-compat" ;;
    *) echo "[controlplane] error: MW_CONTROLPLANE is '$CONTROLPLANE'; it is current or compat" >&2; exit 2 ;;
  esac
}
select_line "${MW_CONTROLPLANE:-current}"
KWOK_VERSION=v0.8.0
CACHE_ROOT="${MW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mw-operator}"
RUN_ROOT="${MW_RUN_DIR:-${TMPDIR:-/tmp}/mw-operator}"
LOG_ROOT="${MW_LOG_DIR:-$REPO/target/controlplane}"

log() { printf '[controlplane] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

cache_key() {
  {
    echo "$K8S_VERSION $ETCD_VERSION $KWOK_VERSION"
    cat "$BUILD_MODULE/go.mod" "$BUILD_MODULE/go.sum" "$BUILD_MODULE/cmd/etcd/main.go"
  } | sha256sum | cut -c1-12
}

bin_dir() { echo "$CACHE_ROOT/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-$(cache_key)"; }

BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

ensure_tools() {
  local missing=()
  command -v go >/dev/null || die "Go is required to build the control plane (https://go.dev/dl)"
  for t in openssl curl python3; do command -v "$t" >/dev/null || missing+=("$t"); done
  if ((${#missing[@]})); then
    log "installing ${missing[*]} from Debian's packages"
    local pkgs=("${missing[@]/python3/python3-minimal}")
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
    else
      sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
    fi
  fi
}

# The same version stamps Kubernetes' own build (hack/lib/version.sh) writes, so
# `kubectl version`, clients and the kubelet's node status show a real release rather than
# v0.0.0-master.
version_ldflags() {
  local ldflags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1"
    ldflags+=" -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $pkg.gitTreeState=clean"
  done
  echo "$ldflags"
}

cmd_build() {
  ensure_tools
  local dir; dir=$(bin_dir)
  local ok=1
  for b in "${BINARIES[@]}"; do [ -x "$dir/$b" ] || ok=0; done
  if ((ok)); then echo "$dir"; return 0; fi

  log "building Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION into $dir"
  log "(a cold build takes a while on 2 cores; later runs reuse the cache)"
  local tmp="$dir.partial.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  local start=$SECONDS
  local ldflags; ldflags=$(version_ldflags)
  (
    cd "$BUILD_MODULE"
    export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
    for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
      log "go build $b"
      go build -ldflags "$ldflags" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b"
    done
    log "go build etcd"
    go build -ldflags "-s -w" -o "$tmp/etcd" ./cmd/etcd
  )
  log "go install kwok"
  (
    cd "$tmp"
    CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOBIN="$tmp" \
      go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  )
  rm -rf "$dir"; mv "$tmp" "$dir"
  log "built in $((SECONDS - start))s"
  echo "$dir"
}

# ---------------------------------------------------------------------------------------
# Running a control plane. Everything one control plane owns lives in $RUN_ROOT/NAME (pids,
# certificates, keys, kubeconfigs, etcd data); logs live in $LOG_ROOT/NAME so they outlive
# teardown and a failed test can point at them.

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Stop what an earlier run of NAME started, by PID, checking that the PID still runs one of
# our binaries (a PID reused by an unrelated process after a crash is left alone). Clients go
# first, then kube-apiserver, then etcd: an apiserver whose etcd is gone hangs on shutdown.
stop_recorded() {
  local state=$1 wave refused=0
  # The real node first, while the API server still runs (its Pods are removed through the
  # CRI, its Node object through the API); a no-op when this control plane has none.
  node_cleanup "$(basename "$state")" || refused=1
  [ -d "$state/pids" ] || return "$refused"
  for wave in "bridge operator kwok kube-scheduler kube-controller-manager" "kube-apiserver" "etcd"; do
    stop_wave "$state" $wave || refused=1
  done
  # Anything else recorded (nothing today) goes last.
  stop_wave "$state" $(cd "$state/pids" && ls -- *.pid 2>/dev/null | sed 's/\.pid$//') || refused=1
  return "$refused"
}

# Whether PID runs: exists and is not a zombie. Our processes are orphans (started by a script
# that exited), and an init that reaps slowly leaves an exited one as a zombie for a while,
# which `kill -0` still finds.
pid_runs() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# Stop the recorded processes NAME... and wait for them. A process is stopped only when it
# still runs the binary recorded at its start (`start` writes NAME.exe beside NAME.pid), so
# a reused PID is never hit, whatever MW_CACHE_DIR says now; a rebuilt binary shows as
# "PATH (deleted)" and still matches. A live process that does not match is reported and
# keeps its PID file (so a later `down` can still find it), and the wave fails.
stop_wave() {
  local state=$1; shift
  local name pidfile pid exe want pids=() refused=0
  for name in "$@"; do
    pidfile="$state/pids/$name.pid"
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if ! pid_runs "$pid"; then
      rm -f "$pidfile" "$state/pids/$name.exe"; continue
    fi
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
    exe=${exe% (deleted)}
    want=$(cat "$state/pids/$name.exe" 2>/dev/null || true)
    if [ -n "$want" ] && [ "$exe" = "$want" ]; then
      kill -TERM "$pid" 2>/dev/null && pids+=("$name:$pid")
      rm -f "$pidfile" "$state/pids/$name.exe"
    else
      log "not stopping $name: pid $pid runs '${exe:-?}', not the recorded '${want:-?}' (PID reused?); its PID file stays in $state/pids"
      refused=1
    fi
  done
  local deadline=$((SECONDS + 20)) entry
  for entry in "${pids[@]}"; do
    pid=${entry#*:}
    while pid_runs "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if pid_runs "$pid"; then
      log "${entry%%:*} (pid $pid) did not stop on SIGTERM; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
      if pid_runs "$pid"; then log "${entry%%:*} (pid $pid) survived SIGKILL"; refused=1; fi
    fi
  done
  return "$refused"
}

gen_certs() {
  local pki=$1
  mkdir -p "$pki"
  (
    cd "$pki"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=mw-operator-local-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    # kube-apiserver serving certificate: loopback only, plus the in-cluster names.
    cat >apiserver.ext <<EXT
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EXT
    sign apiserver "/CN=kube-apiserver" apiserver.ext
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    # Client identities. kube-controller-manager and kwok act for many controllers, so they
    # are cluster admins here; the scheduler gets its own bootstrap RBAC identity.
    sign admin "/O=system:masters/CN=mw-admin" client.ext
    sign controller-manager "/O=system:masters/CN=system:kube-controller-manager" client.ext
    sign scheduler "/CN=system:kube-scheduler" client.ext
    sign kwok "/O=system:masters/CN=kwok-controller" client.ext
    # The operator under test: no groups, so only the RBAC in config/rbac applies to it.
    sign operator "/CN=mw-operator" client.ext
    # The bridge under test, likewise bound only to config/rbac/bridge-*.yaml.
    sign bridge "/CN=mw-bridge" client.ext
    # The benchmark's controller-runtime peer (hack/peer), bound only to hack/peer/role.yaml,
    # so the audit log tells its writes apart.
    sign peer "/CN=mw-peer" client.ext
    # The API server's identity toward kubelets (kubectl logs and exec on the real node).
    sign kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client.ext
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext ca.srl
  )
}

sign() {
  local name=$1 subj=$2 ext=$3
  openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$name.key" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
    -extfile "$ext" -out "$name.crt" 2>/dev/null
}

write_kubeconfig() {
  local file=$1 user=$2 server=$3 pki=$4
  cat >"$file" <<KC
apiVersion: v1
kind: Config
clusters:
- name: mw-local
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $pki/$user.crt
    client-key: $pki/$user.key
contexts:
- name: mw-local
  context: {cluster: mw-local, user: $user}
current-context: mw-local
KC
  chmod 600 "$file"
}

start() {
  local state=$1 logs=$2 name=$3; shift 3
  # The command line is kept so start-component can start this component again exactly as
  # it was (same flags, same ports) after a fault test stopped it.
  mkdir -p "$state/cmd"
  printf '%s\0' "$@" >"$state/cmd/$name"
  # setsid: the control plane outlives the shell that started it (make demo) and is not
  # hit by that terminal's Ctrl-C; teardown is by PID. Appending: a restarted component
  # keeps its earlier log.
  setsid "$@" >>"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$state/pids/$name.pid"
  readlink -f "$1" >"$state/pids/$name.exe"
}

cmd_stop_component() {
  local name=$1 component=$2
  local state="$RUN_ROOT/$name"
  [ -e "$state/pids/$component.pid" ] || die "no running $component recorded for control plane '$name'"
  stop_wave "$state" "$component" || die "$component of '$name' could not be stopped (see above)"
  log "stopped $component of '$name'"
}

cmd_start_component() {
  local name=$1 component=$2
  local state="$RUN_ROOT/$name" logs="$LOG_ROOT/$name"
  [ -f "$state/cmd/$component" ] || die "no recorded command for $component of '$name'"
  if [ -e "$state/pids/$component.pid" ] && pid_runs "$(cat "$state/pids/$component.pid")"; then
    die "$component of '$name' is already running"
  fi
  local args=()
  mapfile -d '' args <"$state/cmd/$component"
  start "$state" "$logs" "$component" "${args[@]}"
  # Everything else reaches etcd through the API server, so its readiness covers both.
  case "$component" in
    etcd | kube-apiserver)
      wait_for "kube-apiserver to be ready again" 120 "$logs" healthy "$state" || return 1 ;;
  esac
  log "started $component of '$name' again"
}

healthy() {
  local state=$1
  [ -f "$state/kubeconfig" ] || return 1
  "$(bin_dir)/kubectl" --kubeconfig "$state/kubeconfig" --request-timeout=3s get --raw=/readyz >/dev/null 2>&1
}

# wait_for WHAT TIMEOUT LOGS [--starting STATE] COMMAND...: until COMMAND succeeds. With
# --starting, a component of that control plane that was started and has exited (a port taken
# between free_port and its bind, a bad flag) fails the wait at once, instead of at the timeout.
wait_for() {
  local what=$1 timeout=$2 logs=$3; shift 3
  local starting=
  if [ "$1" = --starting ]; then starting=$2; shift 2; fi
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$starting" ] && ! alive "$starting" started; then
      log "... while waiting for $what"
      return 1
    fi
    if ((SECONDS >= deadline)); then
      log "timed out after ${timeout}s waiting for $what; logs are in $logs"
      return 1
    fi
    sleep 0.5
  done
}

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

# Every control-plane component still runs (the operator, when one is recorded, is not part
# of the control plane's health). `alive STATE started`: every one started so far (during
# start-up).
alive() {
  local state=$1 only_started=${2:-} name pidfile
  for name in "${COMPONENTS[@]}"; do
    pidfile="$state/pids/$name.pid"
    if [ ! -e "$pidfile" ]; then
      [ -n "$only_started" ] && continue
      return 1
    fi
    pid_runs "$(cat "$pidfile")" || { log "$name exited"; return 1; }
  done
}

cmd_up() {
  local name=${1:-default}
  local state="$RUN_ROOT/$name"
  if alive "$state" 2>/dev/null && healthy "$state"; then
    log "control plane '$name' is already up"
    if [ "${MW_REAL_NODE:-0}" != 0 ]; then cmd_node_up "$name"; fi
    print_env "$name"
    return 0
  fi
  # One more try, on fresh ports, when a start fails: free_port cannot hold a port until the
  # component binds it, and a start that fails says why above before the retry. (A subshell
  # with its own `set -e`, run as a plain command, keeps every step's failure fatal to the
  # attempt; called as a condition, `||` would switch that off inside it.)
  local rc
  set +e
  (set -e; start_control_plane "$name")
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    log "starting control plane '$name' failed (see above); trying once more on fresh ports"
    (set -e; start_control_plane "$name")
  fi
  if [ "${MW_REAL_NODE:-0}" != 0 ]; then cmd_node_up "$name" || { cmd_down "$name"; return 1; }; fi
  print_env "$name"
}

start_control_plane() {
  local name=$1
  local state="$RUN_ROOT/$name" logs="$LOG_ROOT/$name"
  # Whatever a crashed or killed earlier run left behind goes first.
  stop_recorded "$state" || die "processes of an earlier '$name' are still running (see above); stop them first"
  rm -rf "$state"
  local bin; bin=$(cmd_build)
  mkdir -p "$state/pids" "$logs"
  echo "$CONTROLPLANE" >"$state/controlplane"
  rm -f "$logs"/*.log
  local t0=$SECONDS

  gen_certs "$state/pki"
  local pki="$state/pki"
  local etcd_port etcd_peer api_port kcm_port sched_port kwok_port
  etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port)
  kcm_port=$(free_port); sched_port=$(free_port); kwok_port=$(free_port)
  local server="https://127.0.0.1:$api_port"
  for who in admin controller-manager scheduler kwok operator bridge peer; do
    write_kubeconfig "$state/$who.kubeconfig" "$who" "$server" "$pki"
  done
  mv "$state/admin.kubeconfig" "$state/kubeconfig"

  start "$state" "$logs" etcd "$bin/etcd" \
    --name=mw-local --data-dir="$state/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer" \
    --initial-cluster="mw-local=http://127.0.0.1:$etcd_peer" \
    --unsafe-no-fsync --quota-backend-bytes=2147483648 --log-level=warn
  wait_for "etcd" 60 "$logs" --starting "$state" curl -sf "http://127.0.0.1:$etcd_port/health" ||
    { failed_start "$name"; return 1; }

  start "$state" "$logs" kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --kubelet-client-certificate="$pki/kubelet-client.crt" --kubelet-client-key="$pki/kubelet-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --enable-admission-plugins=NodeRestriction,PodNodeSelector,PodTolerationRestriction \
    --endpoint-reconciler-type=none --profiling="${MW_CP_PROFILING:-false}" \
    --audit-policy-file="$HERE/audit-policy.yaml" --audit-log-path="$logs/audit.log" \
    --audit-log-maxsize=200 --audit-log-maxbackup="${MW_CP_AUDIT_BACKUPS:-1}"
  wait_for "kube-apiserver" 120 "$logs" --starting "$state" "$bin/kubectl" --kubeconfig "$state/kubeconfig" \
    --request-timeout=3s get --raw=/readyz || { failed_start "$name"; return 1; }

  # MW_CP_UNLIMITED_QPS=1 lifts the client-side rate limits of kube-controller-manager (20/s
  # by default) and kube-scheduler (50/s), as `kwokctl --disable-qps-limits` does, so that a
  # benchmark measures the API server and etcd rather than a client throttle. (kwok has none.)
  local qps=()
  [ "${MW_CP_UNLIMITED_QPS:-0}" = 0 ] || qps=(--kube-api-qps=5000 --kube-api-burst=10000)
  start "$state" "$logs" kube-controller-manager "$bin/kube-controller-manager" "${qps[@]}" \
    --kubeconfig="$state/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$state/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$state/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$kcm_port" \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --leader-elect=false --use-service-account-credentials=false \
    --service-cluster-ip-range=10.96.0.0/16 --profiling=false

  start "$state" "$logs" kube-scheduler "$bin/kube-scheduler" "${qps[@]}" \
    --kubeconfig="$state/scheduler.kubeconfig" \
    --authentication-kubeconfig="$state/scheduler.kubeconfig" \
    --authorization-kubeconfig="$state/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$sched_port" --leader-elect=false --profiling=false

  start "$state" "$logs" kwok "$bin/kwok" \
    --kubeconfig="$state/kwok.kubeconfig" \
    --config="$HERE/kwok/stages.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=40 \
    --cidr=10.244.0.0/16 --node-ip=192.0.2.1 \
    --server-address="127.0.0.1:$kwok_port"

  "$bin/kubectl" --kubeconfig "$state/kubeconfig" apply -f "$HERE/kwok/node.yaml" >/dev/null
  wait_for "the kwok node to be Ready" 120 "$logs" --starting "$state" "$bin/kubectl" --kubeconfig "$state/kubeconfig" \
    wait --for=condition=Ready node/kwok-node-0 --timeout=2s || { failed_start "$name"; return 1; }
  # Pods need the namespace's default ServiceAccount, which kube-controller-manager creates.
  wait_for "the default ServiceAccount" 60 "$logs" --starting "$state" "$bin/kubectl" --kubeconfig "$state/kubeconfig" \
    get serviceaccount default -n default || { failed_start "$name"; return 1; }
  alive "$state" || { log "a component died during start-up"; failed_start "$name"; return 1; }

  log "control plane '$name' up in $((SECONDS - t0))s"
}

print_env() {
  local name=$1
  log "kubeconfig: $RUN_ROOT/$name/kubeconfig (admin); operator identity: $RUN_ROOT/$name/operator.kubeconfig"
  log "logs:       $LOG_ROOT/$name/"
  log "kubectl:    $(bin_dir)/kubectl --kubeconfig $RUN_ROOT/$name/kubeconfig get nodes"
}

# A failed start-up: say which component still ran and show the end of each one's log (CI's
# output is all its reader gets), then stop what was started.
failed_start() {
  local name=$1
  local state="$RUN_ROOT/$name" logs="$LOG_ROOT/$name" component pidfile lines
  for component in "${COMPONENTS[@]}"; do
    pidfile="$state/pids/$component.pid"
    if [ ! -e "$pidfile" ]; then continue; fi
    if pid_runs "$(cat "$pidfile")"; then lines=3; log "$component: running"; else lines=12; log "$component: exited"; fi
    if [ -s "$logs/$component.log" ]; then
      log "the end of $logs/$component.log:"
      tail -n "$lines" "$logs/$component.log" | cut -c1-400 | sed 's/^/    /' >&2
    fi
  done
  cmd_down "$name"
}

cmd_down() {
  local name=${1:-default}
  local state="$RUN_ROOT/$name"
  [ -d "$state" ] || { log "control plane '$name' is not running"; return 0; }
  if ! stop_recorded "$state"; then
    log "control plane '$name' NOT fully stopped: see above; run state kept in $state"
    return 1
  fi
  rm -rf "$state"
  log "control plane '$name' stopped; logs kept in $LOG_ROOT/$name/"
}

# What the operator needs on a control plane: the CRD, the ClusterRole from config/rbac bound
# to user mw-operator (the identity of operator.kubeconfig), and the leader-election Role in
# namespace default. Binding exactly the shipped RBAC means every demo, test and benchmark run
# also proves that it suffices.
cmd_install_operator() {
  local name=${1:-default}
  local kcfg="$RUN_ROOT/$name/kubeconfig"
  [ -f "$kcfg" ] || die "control plane '$name' is not up"
  local kubectl=("$(bin_dir)/kubectl" --kubeconfig "$kcfg")
  "${kubectl[@]}" apply --server-side -f "$REPO/crds/" >/dev/null
  # Until the API server has written a new CRD's first status, `kubectl wait` fails at once
  # (".status.conditions accessor error") rather than waiting: it is tried again, for a minute.
  wait_for "the CRD to be Established" 60 "$LOG_ROOT/$name" \
    "${kubectl[@]}" wait --for=condition=Established crd --all --timeout=10s || return 1
  "${kubectl[@]}" apply -f "$REPO/config/rbac/cluster-role.yaml" >/dev/null
  "${kubectl[@]}" create clusterrolebinding mw-operator --clusterrole=mw-operator --user=mw-operator \
    --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
  # Leader election: the Lease only in the namespace `run` keeps it in without $POD_NAMESPACE
  # (default), as the chart grants it only in the operator's own namespace.
  "${kubectl[@]}" -n default apply -f "$REPO/config/rbac/leader-election-role.yaml" >/dev/null
  "${kubectl[@]}" -n default create rolebinding mw-operator-leader-election \
    --role=mw-operator-leader-election --user=mw-operator \
    --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
  # The bridge's ClusterRole; each namespace it serves binds it with a RoleBinding to user
  # mw-bridge (the identity of bridge.kubeconfig), so it holds nothing anywhere else.
  "${kubectl[@]}" apply -f "$REPO/config/rbac/bridge-cluster-role.yaml" >/dev/null
}

# The controller-runtime peer `make bench` compares the operator with (hack/peer, a Go module
# of its own), built like the control plane: once per content of its sources and the Go
# version, into the cache outside the repository.
peer_bin() {
  local key
  key=$( {
    go env GOVERSION
    for f in "$HERE/peer/go.mod" "$HERE/peer/go.sum" "$HERE"/peer/*.go; do basename "$f"; cat "$f"; done
  } | sha256sum | cut -c1-12)
  echo "$CACHE_ROOT/bin/peer-$key/peer"
}

cmd_peer_build() {
  ensure_tools
  local bin dir; bin=$(peer_bin); dir=$(dirname "$bin")
  if [ -x "$bin" ]; then echo "$bin"; return 0; fi
  log "building the controller-runtime peer into $dir"
  local tmp="$dir.partial.$$" start=$SECONDS
  rm -rf "$tmp"; mkdir -p "$tmp"
  (
    cd "$HERE/peer"
    CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false -trimpath" go build -ldflags "-s -w" -o "$tmp/peer" .
  )
  rm -rf "$dir"; mv "$tmp" "$dir"
  log "built in $((SECONDS - start))s"
  echo "$bin"
}

# The peer's permissions on control plane NAME: hack/peer/role.yaml bound to user mw-peer.
cmd_install_peer() {
  local name=$1
  local kcfg="$RUN_ROOT/$name/kubeconfig"
  [ -f "$kcfg" ] || die "control plane '$name' is not up"
  local kubectl=("$(bin_dir)/kubectl" --kubeconfig "$kcfg")
  "${kubectl[@]}" apply -f "$HERE/peer/role.yaml" >/dev/null
  "${kubectl[@]}" create clusterrolebinding mw-peer --clusterrole=mw-peer --user=mw-peer \
    --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
  # RBAC is cached by the API server: wait until the binding is in effect.
  wait_for "the peer's ClusterRoleBinding" 30 "$LOG_ROOT/$name" "${kubectl[@]}" auth can-i \
    update managedworkloads.opensource-server.mieweb.org --subresource=status --all-namespaces --as mw-peer
}

# (Re)start the operator BINARY against control plane NAME as user mw-operator, appending to
# its log. Its PID is recorded with the control plane's, so `down` stops it too, even after a
# killed run. Prints the PID.
cmd_start_operator() {
  local name=$1 binary=$2
  local state="$RUN_ROOT/$name" logs="$LOG_ROOT/$name"
  [ -d "$state/pids" ] || die "control plane '$name' is not up"
  [ -x "$binary" ] || die "no operator binary at $binary"
  stop_wave "$state" operator || die "the operator recorded for '$name' could not be stopped"
  # A port of its own (a demo and a test run may share the machine); operator-metrics prints it.
  local metrics="127.0.0.1:$(free_port)"
  echo "$metrics" >"$state/operator.metrics"
  start "$state" "$logs" operator "$binary" run --kubeconfig "$state/operator.kubeconfig" \
    --metrics-address "$metrics"
  cat "$state/pids/operator.pid"
}

# (Re)start the bridge BINARY against control plane NAME as user mw-bridge, with its
# ClusterRole bound in namespace NS only (as a namespace-scoped install does), and ARGS
# (database URL, --node mappings...). Recorded like the operator, so `down` stops it.
cmd_start_bridge() {
  local name=$1 binary=$2 ns=$3; shift 3
  local state="$RUN_ROOT/$name" logs="$LOG_ROOT/$name"
  [ -d "$state/pids" ] || die "control plane '$name' is not up"
  [ -x "$binary" ] || die "no binary at $binary"
  local kubectl=("$(bin_dir)/kubectl" --kubeconfig "$state/kubeconfig")
  "${kubectl[@]}" create namespace "$ns" --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
  "${kubectl[@]}" -n "$ns" create rolebinding mw-bridge --clusterrole=mw-bridge --user=mw-bridge \
    --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
  # Its leader election: the Lease in that namespace too (passed as --lease-namespace below).
  "${kubectl[@]}" -n "$ns" apply -f "$REPO/config/rbac/bridge-leader-election-role.yaml" >/dev/null
  "${kubectl[@]}" -n "$ns" create rolebinding mw-bridge-leader-election --role=mw-bridge-leader-election \
    --user=mw-bridge --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
  # RBAC is cached by the API server: wait until the binding is in effect.
  wait_for "the bridge's RoleBinding" 30 "$logs" "${kubectl[@]}" auth can-i list managedworkloads.opensource-server.mieweb.org \
    -n "$ns" --as mw-bridge
  stop_wave "$state" bridge || die "the bridge recorded for '$name' could not be stopped"
  start "$state" "$logs" bridge "$binary" bridge --kubeconfig "$state/bridge.kubeconfig" --lease-namespace "$ns" "$@"
  cat "$state/pids/bridge.pid"
}

cmd_status() {
  local name=${1:-default}
  local state="$RUN_ROOT/$name"
  if alive "$state" 2>/dev/null && healthy "$state"; then
    log "control plane '$name' is up"; print_env "$name"
    if [ -e "$state/pids/kubelet.pid" ]; then cmd_node_status "$name" || return 1; fi
  else
    log "control plane '$name' is not up"; return 1
  fi
}

# shellcheck source=hack/realnode.sh
source "$HERE/realnode.sh"

# Commands on control plane NAME use the Kubernetes line it was started from (its kubectl,
# its binaries for start-component), so `status compat` or `down compat` need no
# MW_CONTROLPLANE. `up` never silently reuses a running control plane of the other line, and
# an explicit MW_CONTROLPLANE that contradicts the recorded line is refused (but `down`, which
# only stops recorded PIDs, always goes ahead).
adopt_line() {
  local cmd=$1 name=$2 recorded
  recorded=$(cat "$RUN_ROOT/$name/controlplane" 2>/dev/null) || return 0
  [ "$recorded" != "$CONTROLPLANE" ] || return 0
  if [ "$cmd" = up ] || { [ -n "${MW_CONTROLPLANE:-}" ] && [ "$cmd" != down ]; }; then
    die "control plane '$name' runs the $recorded Kubernetes line, not $CONTROLPLANE: use MW_CONTROLPLANE=$recorded, or stop it first (hack/controlplane.sh down $name)"
  fi
  select_line "$recorded"
}

main() {
  case "${1:-}" in
    "" | build | bin-dir | node-build | images | peer-build) ;;
    *) adopt_line "$1" "${2:-default}" ;;
  esac
  case "${1:-}" in
    build) cmd_build >/dev/null; bin_dir ;;
    bin-dir) bin_dir ;;
    peer-build) cmd_peer_build ;;
    install-peer) cmd_install_peer "${2:?NAME}" ;;
    up) cmd_up "${2:-}" ;;
    down) cmd_down "${2:-}" ;;
    status) cmd_status "${2:-}" ;;
    kubeconfig) echo "$RUN_ROOT/${2:-default}/kubeconfig" ;;
    log-dir) echo "$LOG_ROOT/${2:-default}" ;;
    install-operator) cmd_install_operator "${2:-}" ;;
    start-operator) cmd_start_operator "${2:?NAME}" "${3:?operator binary}" ;;
    start-bridge) shift; cmd_start_bridge "$@" ;;
    stop-operator) stop_wave "$RUN_ROOT/${2:?NAME}" operator ;;
    operator-metrics) cat "$RUN_ROOT/${2:?NAME}/operator.metrics" ;;
    node-build) cmd_node_build >/dev/null; node_bin_dir ;;
    node-up) cmd_node_up "${2:?NAME}" ;;
    node-down) cmd_node_down "${2:?NAME}" ;;
    node-status) cmd_node_status "${2:?NAME}" ;;
    node-namespace) cmd_node_namespace "${2:?NAME}" "${3:?NAMESPACE}" ;;
    node-import) cmd_node_import "${2:?NAME}" "${3:?ARCHIVE}" ;;
    node-expose) cmd_node_expose "${2:?NAME}" "${3:?PORT}" ;;
    images) cmd_images ;;
    stop-component) cmd_stop_component "${2:?NAME}" "${3:?COMPONENT}" ;;
    start-component) cmd_start_component "${2:?NAME}" "${3:?COMPONENT}" ;;
    *) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
}

# One line, so bash has read it whole before running it: editing this file while it runs
# (a long build) cannot make bash read half-written text after main returns.
main "$@"; exit $?
