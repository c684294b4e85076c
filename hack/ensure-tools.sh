#!/usr/bin/env bash
# What a fresh machine needs before anything builds: rustfmt and clippy for the Rust
# toolchain, Go for the control plane, openssl/curl/python3 for its start-up, and for the
# database-bridge tests a PostgreSQL server (hack/postgres.sh) and the sqlite3 CLI, and Node.js
# >= 20 with npm for Manager's provider (integrations/manager; hack/test.sh installs its
# packages with `npm ci`) and Manager itself (hack/manager-e2e.sh, with Debian's chromium for its UI test and openssh-client for its agent test). Installs what is missing; does nothing when all is there.
set -euo pipefail
log() { printf '[tools] %s\n' "$*" >&2; }

if ! command -v cargo >/dev/null; then
  log "Rust is required: install it with rustup (https://rustup.rs)"; exit 1
fi
if command -v rustup >/dev/null; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || { log "adding $c"; rustup component add "$c"; }
  done
fi

missing=()
command -v go >/dev/null || missing+=(golang-go)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
for t in openssl curl python3 sqlite3; do command -v "$t" >/dev/null || missing+=("$t"); done
# Server binaries (initdb, pg_ctl, postgres; psql comes along), not only a client or libpq-dev.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
# The CA bundle the operator's image carries (hack/image.py).
[ -s /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
# The headless browser of Manager's UI test (hack/manager-e2e.sh drives it with playwright-core,
# which downloads no browser).
[ -x /usr/bin/chromium ] || missing+=(chromium)
# The agent test's SSH client (ssh, ssh-keygen).
command -v ssh-keygen >/dev/null || missing+=(openssh-client)
if ((${#missing[@]})); then
  log "installing ${missing[*]} from Debian's packages"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if [ "${go_minor:-0}" -lt 21 ]; then
  # From Go 1.21 on, the go command fetches the Go 1.26 toolchain that Kubernetes v1.36 needs
  # from the module proxy by itself (go.mod's `go` line); older ones cannot.
  log "Go $(go env GOVERSION) is too old to build Kubernetes v1.36; install Go 1.21 or newer"; exit 1
fi
node_major=$(node --version | sed -E 's/^v([0-9]+).*/\1/')
if [ "${node_major:-0}" -lt 20 ]; then
  # @kubernetes/client-node 1.x and `node --test` need Node.js 20 or newer.
  log "Node.js $(node --version) is too old for integrations/manager and Manager; install Node.js 20 or newer"; exit 1
fi
