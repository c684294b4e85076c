#!/usr/bin/env bash
# Teardown never loses a process (issue 8, item 7), checked at the shell level:
#   1. a recorded process that runs something other than its recorded binary is reported, not
#      stopped, keeps its PID file, and `down` exits non-zero; one that does match is stopped
#      and really gone;
#   2. the scenario a new user hit: a control plane started with MW_CACHE_DIR set and stopped
#      without it leaves nothing running;
#   3. a real node whose kubelet and containerd were killed while a Pod ran (as when `make
#      test` is killed) leaves no process, mount, network namespace, veth, bridge, iptables
#      rule, cgroup or file after `down`, and the next real node starts.
# Run by hack/test.sh; needs the control-plane binaries built (hack/controlplane.sh build).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CP="$HERE/controlplane.sh"
tmp=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  # Part 3's control plane and real node, if it failed half-way.
  if [ -d "$tmp/run/realnode-td" ]; then bash "$CP" down realnode-td >/dev/null 2>&1 || true; fi
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
fail() { echo "teardown test FAILED: $*" >&2; exit 1; }
# Running and not a zombie (an orphan whose exit init has not reaped yet is gone for our purposes).
runs() { local s; s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1; [ -n "$s" ] && [ "$s" != Z ]; }
export MW_RUN_DIR="$tmp/run" MW_LOG_DIR="$tmp/logs"

# ---- 1. a PID that runs something else is kept; one that matches is stopped -------------
state="$MW_RUN_DIR/fake"
mkdir -p "$state/pids"
# Not children of this shell (a subshell starts them and exits), as control-plane processes
# are not children of `down`: a stopped one is reaped by init instead of lingering as a zombie.
orphan() { (setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!); }
matching=$(orphan); pids+=("$matching")
foreign=$(orphan); pids+=("$foreign")
sleep 0.2
echo "$matching" >"$state/pids/kube-scheduler.pid"
readlink -f "/proc/$matching/exe" >"$state/pids/kube-scheduler.exe"
# Recorded as etcd, but the PID now runs `sleep`: as after a PID was reused.
echo "$foreign" >"$state/pids/etcd.pid"
echo /nonexistent/etcd >"$state/pids/etcd.exe"
if out=$(bash "$CP" down fake 2>&1); then fail "down exited 0 although it left etcd's PID running: $out"; fi
grep -q "not stopping etcd: pid $foreign" <<<"$out" || fail "down did not say which process it kept and why: $out"
grep -q "NOT fully stopped" <<<"$out" || fail "down did not report the control plane as not stopped: $out"
[ -e "$state/pids/etcd.pid" ] || fail "down deleted the PID file of a process it did not stop"
runs "$foreign" || fail "down stopped a process that does not run the recorded binary"
runs "$matching" && fail "down left a process running that it reported stopping"
[ -e "$state/pids/kube-scheduler.pid" ] && fail "the stopped process's PID file is still there"
kill -KILL "$foreign"
for _ in $(seq 50); do runs "$foreign" || break; sleep 0.1; done
bash "$CP" down fake >/dev/null 2>&1 || fail "down after the foreign process went still failed"
[ -d "$state" ] && fail "down left the run state behind once everything was stopped"
echo "teardown: a non-matching PID is reported and kept, a matching one stopped"

# ---- 2. up with MW_CACHE_DIR, down without ------------------------------------------------
bin=$(bash "$CP" build)
# Hard links: another path for the same binaries, as a second cache would be, at no cost in
# space (same file system as the real cache, else a copy).
cache="$(dirname "$(dirname "$bin")")/teardown-test.$$"
mkdir -p "$cache/bin"
cp -al "$bin" "$cache/bin/" 2>/dev/null || cp -a "$bin" "$cache/bin/"
trap 'cleanup; rm -rf "$cache"' EXIT
t0=$SECONDS
MW_CACHE_DIR="$cache" env -u MW_REAL_NODE bash "$CP" up cachedir >/dev/null 2>&1 || fail "up with MW_CACHE_DIR failed (logs: $MW_LOG_DIR/cachedir)"
recorded=()
for f in "$MW_RUN_DIR/cachedir/pids/"*.pid; do recorded+=("$(cat "$f")"); done
((${#recorded[@]} == 5)) || fail "expected 5 recorded components, found ${#recorded[@]}"
out=$(env -u MW_CACHE_DIR bash "$CP" down cachedir 2>&1) || fail "down without MW_CACHE_DIR failed: $out"
for p in "${recorded[@]}"; do
  runs "$p" && fail "pid $p is still running after down reported success: $out"
done
[ -d "$MW_RUN_DIR/cachedir" ] && fail "down reported success but kept the run state"
echo "teardown: up with MW_CACHE_DIR, down without: all ${#recorded[@]} components gone ($((SECONDS - t0))s)"

# ---- 3. a real node killed mid-run leaves nothing after `down` ----------------------------
# As when `make test` is killed: the kubelet and containerd die by SIGKILL while a Pod runs,
# so its shim, container, mounts, network namespace and veth outlive them. `down` must still
# remove everything, and a real node must start again afterwards.
t0=$SECONDS
veths_before=$(ip -o link show type veth 2>/dev/null | wc -l)
kube_rules_before=$(iptables-save 2>/dev/null | grep -c KUBE- || true)
cni_cache_before=$( (ls /var/lib/cni/results 2>/dev/null || true) | wc -l)
sysctls="vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward"
# shellcheck disable=SC2086
sysctls_before=$(sysctl -n $sysctls 2>/dev/null | tr '\n' ' ')
MW_REAL_NODE=1 bash "$CP" up realnode-td >/dev/null 2>&1 || fail "up with a real node failed (logs: $MW_LOG_DIR/realnode-td)"
state="$MW_RUN_DIR/realnode-td"
K=("$(bash "$CP" bin-dir)/kubectl" --kubeconfig "$state/kubeconfig")
"${K[@]}" run web --image=mw-test.invalid/httpd:1 --restart=Never --overrides='{"spec":{
  "nodeSelector":{"mw-test/real-node":"true"},
  "tolerations":[{"key":"mw-test/real-node","operator":"Exists","effect":"NoSchedule"}]}}' >/dev/null
"${K[@]}" wait --for=condition=Ready pod/web --timeout=120s >/dev/null || fail "a Pod on the real node did not become Ready"
ip=$("${K[@]}" get pod web -o jsonpath='{.status.podIP}')
curl -sf --max-time 5 "http://$ip:8080/" | grep -q "mw-test httpd v1" || fail "the Pod at $ip did not answer HTTP"
sock="$state/node/containerd/containerd.sock"
shims=$(pgrep -f -- "-address $sock" | tr '\n' ' ')
[ -n "$shims" ] || fail "no containerd shim found for the running Pod"
for c in kubelet containerd kube-proxy; do kill -KILL "$(cat "$state/pids/$c.pid")"; done
sleep 1
pgrep -f -- "-address $sock" >/dev/null || fail "the shims died with containerd: this part would test nothing"
out=$(bash "$CP" down realnode-td 2>&1) || fail "down after killing the real node failed: $out"
leftovers=()
for p in $shims; do runs "$p" && leftovers+=("shim pid $p"); done
grep -q " $MW_RUN_DIR/" /proc/self/mountinfo && leftovers+=("mounts: $(grep -c " $MW_RUN_DIR/" /proc/self/mountinfo)")
for ns in /run/netns/cni-*; do
  [ -e "$ns" ] && ip -n "$(basename "$ns")" -4 addr show 2>/dev/null | grep -q "inet 10\.88\.0\." && leftovers+=("netns $ns")
done
ip link show mwbr0 >/dev/null 2>&1 && leftovers+=("bridge mwbr0")
veths=$(ip -o link show type veth 2>/dev/null | wc -l)
((veths > veths_before)) && leftovers+=("$((veths - veths_before)) veth interfaces")
kube_rules=$(iptables-save 2>/dev/null | grep -c KUBE- || true)
((kube_rules > kube_rules_before)) && leftovers+=("$((kube_rules - kube_rules_before)) KUBE-* iptables lines")
ls -d /sys/fs/cgroup/*/mw-realnode-td /sys/fs/cgroup/mw-realnode-td 2>/dev/null | grep -q . && leftovers+=("cgroups")
[ -e /run/mw-operator-realnode.lock ] && leftovers+=("lock file")
(($( (ls /var/lib/cni/results 2>/dev/null || true) | wc -l) > cni_cache_before)) && leftovers+=("CNI cache: $(ls /var/lib/cni/results | tr '\n' ' ')")
# shellcheck disable=SC2086
[ "$(sysctl -n $sysctls 2>/dev/null | tr '\n' ' ')" = "$sysctls_before" ] || leftovers+=("sysctls ($sysctls) changed")
[ -d "$state" ] && leftovers+=("run state $state")
((${#leftovers[@]} == 0)) || fail "down left behind: ${leftovers[*]}"
# And the next run is not broken by the last one.
MW_REAL_NODE=1 bash "$CP" up realnode-td >/dev/null 2>&1 || fail "a real node did not start again after the killed one (logs: $MW_LOG_DIR/realnode-td)"
bash "$CP" down realnode-td >/dev/null 2>&1 || fail "down of the second real node failed"
echo "teardown: a killed real node (shims and a container still running) left nothing after down; the next one started ($((SECONDS - t0))s)"
