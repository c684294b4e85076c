#!/usr/bin/env bash
# Manager itself on the operator: copies Manager's tree (MANAGER_SRC, v2026.7.4), applies
# integrations/manager/patches/manager-v2026.7.4.patch, installs it and the provider package,
# builds its web client, starts Manager's server.js and job-runner.js on a throwaway PostgreSQL,
# and runs integrations/manager/e2e/manager.e2e.js, which drives Manager's REST API as a user
# would, then, on a fresh database, integrations/manager/e2e/ui.e2e.js, which drives Manager's
# web UI in a headless Chromium (Debian's /usr/bin/chromium, through playwright-core), and, on
# another, integrations/manager/e2e/agent.e2e.js, which reaches containers on the real node
# through Manager's agent (its image: hack/systemd-image.sh agent). The "pages" suite, asked for
# by name only, is a benchmark: integrations/manager/e2e/pages.bench.js times Manager's container
# list with 100 and 1,000 containers on a kubernetes node against a dummy node (`make bench`
# runs it; docs/performance.md).
#
#   MW_TEST_KUBECONFIG=<admin kubeconfig> hack/manager-e2e.sh
#
# Needs a control plane with the CRD installed and the operator running (hack/test.sh's, or
# `hack/controlplane.sh up NAME && install-operator NAME && start-operator NAME BIN`).
#   MANAGER_SRC        Manager's tree (default: ../shared/manager/opensource-server beside the repo)
#   MW_MANAGER_E2E_PG  the PostgreSQL's name for hack/postgres.sh (default: manager-e2e)
#   MW_MANAGER_E2E_KEEP=1  keep the work directory and its logs
#   MW_MANAGER_E2E_SUITES  which suites: "rest ui agent" (the default), or any of them, or "pages"
#   MW_BENCH_PAGES_SIZES, MW_BENCH_PAGES_LISTS, MW_BENCH_PAGES_CONCURRENCY, MW_BENCH_OUT  the
#                      pages benchmark's sizes (100,1000), lists per node and size (100), create
#                      jobs in flight (8), and where its Markdown table goes (and .json beside it)
#   MW_TEST_REAL_NODE=1 and MW_TEST_CLUSTER (default: test): the control plane's real node, for
#                      the real-node cases and the agent suite (which skips itself without one)
#   MW_CHROMIUM        the browser for the UI suite (default: /usr/bin/chromium; hack/ensure-tools.sh)
#   MW_TEST_LOG_DIR    the control plane's logs, where the pages benchmark reads the audit log
#                      (default: `hack/controlplane.sh log-dir $MW_TEST_CLUSTER`); it reads the
#                      API server's PID beside MW_TEST_KUBECONFIG, as hack/controlplane.sh keeps it
# Exit status: 0 passed, 1 failed, 3 not run (no Manager tree at MANAGER_SRC, or the pages
# benchmark without root: CI reports that as "not run", never as passed).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
NOT_RUN=3
MANAGER_SRC=${MANAGER_SRC:-$REPO/../shared/manager/opensource-server}
if [ ! -f "$MANAGER_SRC/create-a-container/server.js" ]; then
  echo "manager-e2e: NOT RUN: no Manager tree at MANAGER_SRC=$MANAGER_SRC (set MANAGER_SRC to a checkout of v2026.7.4)"
  exit "$NOT_RUN"
fi
: "${MW_TEST_KUBECONFIG:?MW_TEST_KUBECONFIG: the admin kubeconfig of a control plane with the operator running}"
PG=${MW_MANAGER_E2E_PG:-manager-e2e}
SUITES=${MW_MANAGER_E2E_SUITES:-rest ui agent}
CLUSTER=${MW_TEST_CLUSTER:-test}
CHROMIUM=${MW_CHROMIUM:-/usr/bin/chromium}
case " $SUITES " in
  *" ui "*)
    [ -x "$CHROMIUM" ] || { echo "manager-e2e: no browser at MW_CHROMIUM=$CHROMIUM (hack/ensure-tools.sh installs Debian's chromium)" >&2; exit 1; }
    [ -d "$REPO/integrations/manager/node_modules/playwright-core" ] ||
      { echo "manager-e2e: run \`npm ci\` in integrations/manager (playwright-core)" >&2; exit 1; } ;;
esac
case " $SUITES " in
  *" pages "*)
    # The dummy node's registry (pages.bench.js) listens on port 443: its image's host has no port.
    if [ "$(id -u)" != 0 ]; then
      echo "manager-e2e: NOT RUN: the pages benchmark serves a registry on localhost:443, which needs root"
      exit "$NOT_RUN"
    fi ;;
esac
PATCH="$REPO/integrations/manager/patches/manager-v2026.7.4.patch"
AGENT_SUITE=
case " $SUITES " in *" agent "*) [ "${MW_TEST_REAL_NODE:-}" = 1 ] && AGENT_SUITE=1 ;; esac

log() { printf '[manager-e2e] %s\n' "$*" >&2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mw-manager-e2e.XXXXXX")
PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  bash "$HERE/postgres.sh" down "$PG" >/dev/null 2>&1 || true
  if [ "$rc" != 0 ] || [ -n "${MW_MANAGER_E2E_KEEP:-}" ]; then
    log "Manager's logs: $WORK/*/server.log, $WORK/*/job-runner.log; the UI's screenshots: $WORK/ui/*.png"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "$AGENT_SUITE" ]; then
  # Manager's agent image builds (a minute, cached) while the other suites run.
  MANAGER_SRC="$MANAGER_SRC" bash "$HERE/systemd-image.sh" agent >"$WORK/agent-image.path" 2>"$WORK/agent-image.log" &
  AGENT_IMAGE_PID=$!
fi

log "Manager from $MANAGER_SRC, patched"
cp -r "$MANAGER_SRC" "$WORK/manager"
(cd "$WORK/manager" && git apply --check "$PATCH" && git apply "$PATCH")
APP="$WORK/manager/create-a-container"

log "npm ci (Manager), and the provider package as Manager's administrator installs it"
(cd "$APP" && npm ci --omit=dev --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1) ||
  { cat "$WORK/npm.log" >&2; exit 1; }
PACKAGE=$(cd "$WORK" && npm pack --silent "$REPO/integrations/manager")
(cd "$APP" && npm install --no-save --omit=dev --no-audit --no-fund --loglevel=error "$WORK/$PACKAGE" >>"$WORK/npm.log" 2>&1) ||
  { cat "$WORK/npm.log" >&2; exit 1; }
case " $SUITES " in
  *" ui "*)
    # The web client app.js serves from client/dist, with the patch's UI: built as Manager's
    # release builds it (its own lockfile, from the npm registry only).
    log "the web client: npm ci, npm run build"
    (cd "$APP/client" && npm ci --no-audit --no-fund --loglevel=error && npm run build) >"$WORK/client-build.log" 2>&1 ||
      { cat "$WORK/client-build.log" >&2; exit 1; } ;;
esac

log "PostgreSQL '$PG'"
bash "$HERE/postgres.sh" down "$PG" >/dev/null 2>&1 || true
bash "$HERE/postgres.sh" up "$PG"
PG_URL=$(bash "$HERE/postgres.sh" url "$PG")
PG_PORT=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.urlparse(sys.argv[1]).port)' "$PG_URL")
# The suite makes this StorageClass (claims bind to hostPath volumes on kwok); Manager's jobs
# read its name from the environment, as the provider's settings come in production.
STORAGE_CLASS="manager-e2e-$$-sc"
# server.js listens on every address at port 3000; a preload moves it to loopback and a free
# port, so that two runs (or a Manager already on 3000) never meet.
cat >"$WORK/port.js" <<'EOF'
const http = require('http');
const listen = http.Server.prototype.listen;
http.Server.prototype.listen = function (port, ...rest) {
  if (port !== 3000) return listen.call(this, port, ...rest);
  return listen.call(this, Number(process.env.MANAGER_PORT), '127.0.0.1', ...rest);
};
EOF
# The pages benchmark's dummy node looks its image up in a registry over HTTPS: the benchmark
# serves one on localhost:443 with this certificate, which Manager's jobs trust.
REGISTRY_ENV=()
case " $SUITES " in
  *" pages "*)
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
      -addext 'subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1' \
      -keyout "$WORK/registry.key" -out "$WORK/registry.crt" 2>/dev/null
    REGISTRY_ENV=(NODE_EXTRA_CA_CERTS="$WORK/registry.crt") ;;
esac
# Manager on a database of its own (each suite starts with no users: its first one to register
# is the administrator), its logs in $WORK/NAME. The job runner claims a job per poll: the
# pages benchmark's thousands of create jobs get a shorter poll.
start_manager() {
  local name=$1 poll=500
  [ "$name" = pages ] && poll=100
  DB="cluster_manager_$name"
  LOGS="$WORK/$name"
  mkdir -p "$LOGS"
  bash "$HERE/postgres.sh" psql "$PG" -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB" >/dev/null
  PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$APP/.env" <<EOF
DATABASE_DIALECT=postgres
POSTGRES_HOST=127.0.0.1
POSTGRES_PORT=$PG_PORT
POSTGRES_USER=mw
POSTGRES_PASSWORD=$(cat "$(bash "$HERE/postgres.sh" password-file "$PG")")
POSTGRES_DATABASE=$DB
JOB_RUNNER_POLL_MS=$poll
MW_ROOTFS_STORAGE_CLASS=$STORAGE_CLASS
# Manager's default container (4 cores, 4 GiB) requests a tenth of that: the real node has
# 2 cores (its test asks for the default), as an administrator over-commits a small cluster.
MW_REQUESTS_PERCENT=10
EOF

  log "server.js on :$PORT, job-runner.js"
  (cd "$APP" && MANAGER_PORT=$PORT exec node -r "$WORK/port.js" server.js >"$LOGS/server.log" 2>&1) &
  PIDS+=($!)
  # Up once it answers at all (it migrates first).
  up=
  for _ in $(seq 1 240); do
    if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then up=1; break; fi
    kill -0 "${PIDS[0]}" 2>/dev/null || { cat "$LOGS/server.log" >&2; exit 1; }
    sleep 0.5
  done
  [ -n "$up" ] || { log "server.js did not answer within 2 minutes"; cat "$LOGS/server.log" >&2; exit 1; }
  # The job runner after the server: the server applies the migrations.
  (cd "$APP" && exec env "${REGISTRY_ENV[@]}" node job-runner.js >"$LOGS/job-runner.log" 2>&1) &
  PIDS+=($!)
}
stop_manager() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}

failed=0
FAILED_SUITES=()
for suite in $SUITES; do
  case "$suite" in
    rest) file=manager.e2e.js ;;
    ui) file=ui.e2e.js ;;
    agent) file=agent.e2e.js ;;
    pages) file=pages.bench.js ;;
    *) log "unknown suite '$suite' (MW_MANAGER_E2E_SUITES: rest, ui, agent, pages)"; exit 1 ;;
  esac
  start_manager "$suite"
  AGENT_MANAGER_URL=
  if [ "$suite" = agent ] && [ -n "$AGENT_SUITE" ]; then
    wait "$AGENT_IMAGE_PID" || { cat "$WORK/agent-image.log" >&2; exit 1; }
    log "Manager's agent image into the real node"
    bash "$HERE/controlplane.sh" node-import "$CLUSTER" "$(cat "$WORK/agent-image.path")"
    # The agent's Pod reaches this loopback-only Manager at the node's bridge address.
    AGENT_MANAGER_URL="http://$(bash "$HERE/controlplane.sh" node-expose "$CLUSTER" "$PORT")"
  fi
  if [ "$suite" = pages ]; then
    # A benchmark, not a test: it prints its figures. The server's PID is the provider's
    # process; the API server's PID and audit log are the control plane's.
    log "the pages benchmark (node e2e/$file)"
    MANAGER_URL="http://127.0.0.1:$PORT" MANAGER_LOGS="$LOGS" MANAGER_PID="${PIDS[0]}" MW_E2E_STORAGE_CLASS="$STORAGE_CLASS" \
      MW_BENCH_AUDIT_DIR="${MW_TEST_LOG_DIR:-$(bash "$HERE/controlplane.sh" log-dir "$CLUSTER")}" \
      MW_BENCH_APISERVER_PID_FILE="$(dirname "$MW_TEST_KUBECONFIG")/pids/kube-apiserver.pid" \
      MW_BENCH_REGISTRY_KEY="$WORK/registry.key" MW_BENCH_REGISTRY_CERT="$WORK/registry.crt" \
      node "$REPO/integrations/manager/e2e/$file" || failed=1
    stop_manager
    continue
  fi
  log "the $suite suite (node --test e2e/$file)"
  MANAGER_URL="http://127.0.0.1:$PORT" MANAGER_LOGS="$LOGS" MW_E2E_STORAGE_CLASS="$STORAGE_CLASS" MW_CHROMIUM="$CHROMIUM" \
    MW_AGENT_MANAGER_URL="$AGENT_MANAGER_URL" \
    node --test --test-reporter=spec "$REPO/integrations/manager/e2e/$file" 2>&1 | tee "$WORK/$suite.out" || {
      failed=1
      FAILED_SUITES+=("$suite")
    }
  stop_manager
done
# A failed suite's reasons again at the end, where a CI log that keeps only its tail shows them.
for suite in "${FAILED_SUITES[@]}"; do
  log "the $suite suite failed; its failing tests:"
  sed -n '/failing tests:/,$p' "$WORK/$suite.out" | head -n 120 >&2
done
exit "$failed"
