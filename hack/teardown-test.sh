#!/usr/bin/env bash
# Teardown never loses a process (issue 8, item 7), checked at the shell level:
#   1. a recorded process that runs something other than its recorded binary is reported, not
#      stopped, keeps its PID file, and `down` exits non-zero; one that does match is stopped
#      and really gone;
#   2. the scenario a new user hit: a control plane started with MW_CACHE_DIR set and stopped
#      without it leaves nothing running.
# Run by hack/test.sh; needs the control-plane binaries built (hack/controlplane.sh build).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CP="$HERE/controlplane.sh"
tmp=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
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
MW_CACHE_DIR="$cache" bash "$CP" up cachedir >/dev/null 2>&1 || fail "up with MW_CACHE_DIR failed (logs: $MW_LOG_DIR/cachedir)"
recorded=()
for f in "$MW_RUN_DIR/cachedir/pids/"*.pid; do recorded+=("$(cat "$f")"); done
((${#recorded[@]} == 5)) || fail "expected 5 recorded components, found ${#recorded[@]}"
out=$(env -u MW_CACHE_DIR bash "$CP" down cachedir 2>&1) || fail "down without MW_CACHE_DIR failed: $out"
for p in "${recorded[@]}"; do
  runs "$p" && fail "pid $p is still running after down reported success: $out"
done
[ -d "$MW_RUN_DIR/cachedir" ] && fail "down reported success but kept the run state"
echo "teardown: up with MW_CACHE_DIR, down without: all ${#recorded[@]} components gone ($((SECONDS - t0))s)"
