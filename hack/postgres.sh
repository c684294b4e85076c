#!/usr/bin/env bash
# A throw-away PostgreSQL server for the bridge tests: Debian's `postgresql` binaries (the
# highest version installed), loopback TCP only, password (SCRAM) auth and TLS with its own
# CA, so clients can test sslmode=verify-full. Data lives in $RUN_ROOT/pg-NAME and goes away
# with `down`; the server log stays in target/postgres/NAME/.
#
#   hack/postgres.sh up   [NAME]          start a server (idempotent; prints nothing)
#   hack/postgres.sh down [NAME]          stop it and remove its files (ok if not running)
#   hack/postgres.sh status [NAME]        exit 0 when it is up and accepts connections
#   hack/postgres.sh pause [NAME]         stop the server but keep its data and port (fault tests)
#   hack/postgres.sh resume [NAME]        start a paused server again, same data, same port
#   hack/postgres.sh url  [NAME] [DBNAME] postgres://mw@127.0.0.1:PORT/DBNAME (no password)
#   hack/postgres.sh password-file [NAME] path of the file holding mw's password (0600)
#   hack/postgres.sh ca   [NAME]          path of the CA certificate that signed the server's cert
#   hack/postgres.sh log-dir [NAME]       where the server logs
#   hack/postgres.sh psql [NAME] [ARGS]   psql as superuser mw over TLS (verify-full);
#                                         ARGS go to psql, e.g. -d mydb -v ON_ERROR_STOP=1 -f x.sql
#
# NAME defaults to "default". Superuser role: mw. Override the binaries with MW_PG_BINDIR.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
RUN_ROOT="${MW_RUN_DIR:-${TMPDIR:-/tmp}/mw-operator}"
LOG_ROOT="${MW_PG_LOG_DIR:-$REPO/target/postgres}"
ADMIN=mw

log() { printf '[postgres] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

check_name() {
  [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "bad NAME '$1' (letters, digits, _ . - only)"
}

# The highest PostgreSQL version whose server binaries are installed.
bindir() {
  if [ -n "${MW_PG_BINDIR:-}" ]; then
    [ -x "$MW_PG_BINDIR/initdb" ] || die "MW_PG_BINDIR=$MW_PG_BINDIR has no initdb"
    echo "$MW_PG_BINDIR"; return 0
  fi
  local d candidates=() best="" best_v="" v
  command -v pg_config >/dev/null && candidates+=("$(pg_config --bindir 2>/dev/null || true)")
  for d in /usr/lib/postgresql/*/bin; do candidates+=("$d"); done
  for d in "${candidates[@]}"; do
    if ! [ -x "$d/initdb" ] || ! [ -x "$d/pg_ctl" ] || ! [ -x "$d/postgres" ]; then continue; fi
    v=$("$d/postgres" --version | awk '{print $3}')
    if [ -z "$best" ] || [ "$(printf '%s\n%s\n' "$best_v" "$v" | sort -V | tail -1)" = "$v" ]; then
      best=$d; best_v=$v
    fi
  done
  [ -n "$best" ] || die "no PostgreSQL server binaries (initdb) found; run hack/ensure-tools.sh (apt-get install postgresql)"
  echo "$best"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# PostgreSQL refuses to run as root: as root, its programs run as the `postgres` system user
# (Debian's package creates it); as anyone else, as that user.
PG_USER=""
setup_user() {
  if [ "$(id -u)" != 0 ]; then PG_USER=$(id -un); return 0; fi
  PG_USER=postgres
  if ! id -u "$PG_USER" >/dev/null 2>&1; then
    log "creating system user $PG_USER"
    useradd --system --user-group --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin "$PG_USER"
  fi
}

# Run a short-lived command as $PG_USER, from / (the caller's directory may not be
# searchable by that user), without the lock's fd.
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    (cd / && setpriv --reuid="$PG_USER" --regid="$PG_USER" --init-groups -- "$@" 9>&-)
  else
    (cd / && "$@" 9>&-)
  fi
}

# Serialise up/down of one NAME (parallel tests may race to start the same server).
lock() {
  mkdir -p "$RUN_ROOT/.pg-locks"
  exec 9>"$RUN_ROOT/.pg-locks/$1"
  flock -w 180 9 || die "timed out waiting for the lock on postgres '$1'"
}

state_dir() { echo "$RUN_ROOT/pg-$1"; }

# The recorded PID still runs a PostgreSQL server binary (not a reused PID).
recorded_pid() {
  local state=$1 pid exe
  [ -f "$state/postgres.pid" ] || return 1
  pid=$(cat "$state/postgres.pid")
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  case "$exe" in
    */bin/postgres|*/bin/postgres\ \(deleted\)) echo "$pid" ;;
    *) return 1 ;;
  esac
}

psql_env() {
  local state=$1 db=${2:-postgres}
  PGHOST=127.0.0.1 PGPORT=$(cat "$state/port") PGUSER=$ADMIN PGDATABASE=$db \
  PGSSLMODE=verify-full PGSSLROOTCERT="$state/ca.crt" PGPASSWORD=$(cat "$state/password") \
  PGCONNECT_TIMEOUT=5 PGAPPNAME=mw-hack-postgres
  export PGHOST PGPORT PGUSER PGDATABASE PGSSLMODE PGSSLROOTCERT PGPASSWORD PGCONNECT_TIMEOUT PGAPPNAME
}

healthy() {
  local state=$1 bin
  [ -f "$state/port" ] && [ -f "$state/password" ] && [ -f "$state/ca.crt" ] || return 1
  recorded_pid "$state" >/dev/null || return 1
  bin=$(bindir)
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$(cat "$state/port")" -t 3 || return 1
  ( psql_env "$state"; "$bin/psql" -X -q -tAc 'select 1' >/dev/null 2>&1 )
}

gen_certs() {
  local state=$1 data=$2
  local pki="$state/pki"
  mkdir -p "$pki"
  (
    cd "$pki"
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
      -subj "/CN=mw-operator-test-postgres-ca" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
      -keyout ca.key -out ca.crt 2>/dev/null
    # 10.88.0.1: where the real node's Pods reach this server (hack/realnode.sh, node-expose).
    cat >server.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1,IP:10.88.0.1
EXT
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
      -keyout server.key -out server.csr 2>/dev/null
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
      -extfile server.ext -out server.crt 2>/dev/null
  )
  install -m 0644 "$pki/ca.crt" "$state/ca.crt"
  # The server's key must belong to the server's user and be 0600.
  install -m 0600 -o "$PG_USER" -g "$(id -gn "$PG_USER")" "$pki/server.key" "$data/server.key"
  install -m 0644 -o "$PG_USER" -g "$(id -gn "$PG_USER")" "$pki/server.crt" "$data/server.crt"
  rm -rf "$pki" # nothing else is signed with this CA
}

stop_server() {
  local state=$1 bin pid
  bin=$(bindir 2>/dev/null) || bin=""
  if [ -n "$bin" ] && [ -f "$state/data/postmaster.pid" ]; then
    as_pg "$bin/pg_ctl" -D "$state/data" stop -m fast -w -t 30 >/dev/null 2>&1 || true
  fi
  pid=$(recorded_pid "$state") || return 0
  # pg_ctl did not do it (wrong binaries, broken data dir): SIGINT is a fast shutdown, then
  # SIGKILL to the process group (setsid made the postmaster its leader; backends share it).
  kill -INT "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 20))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "postgres (pid $pid) did not stop; killing it"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
}

# Start the server of STATE on PORT, appending to LOGFILE, and wait (60 s at most) until it
# accepts connections: 0 when it does, 1 when it exited, 2 when it is still not accepting.
launch() {
  local bin=$1 state=$2 port=$3 logfile=$4 pid
  local cmd=("$bin/postgres" -D "$state/data" -p "$port")
  [ "$(id -u)" != 0 ] || cmd=(setpriv --reuid="$PG_USER" --regid="$PG_USER" --init-groups -- "${cmd[@]}")
  (
    cd "$state"
    # setsid: the server outlives the shell that started it and is not hit by Ctrl-C;
    # teardown is by PID. setsid and setpriv exec, so $! is the postmaster's PID. fd 9
    # (the lock) is closed or the server would hold it for its whole life.
    setsid "${cmd[@]}" >>"$logfile" 2>&1 </dev/null 9>&- &
    echo $! >"$state/postgres.pid"
  )
  pid=$(cat "$state/postgres.pid")
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || return 1
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 2 && return 0
    sleep 0.2
  done
  return 2
}

cmd_up() {
  local name=$1
  local state logs; state=$(state_dir "$name"); logs="$LOG_ROOT/$name"
  setup_user
  lock "$name"
  if healthy "$state"; then
    log "postgres '$name' is already up on 127.0.0.1:$(cat "$state/port")"
    return 0
  fi
  # Whatever a crashed or killed earlier run left behind goes first.
  stop_server "$state"
  rm -rf "$state"

  local bin; bin=$(bindir)
  local t0=$SECONDS
  mkdir -p "$state" "$logs"
  local logfile="$logs/postgres.log"
  [ ! -s "$logfile" ] || mv -f "$logfile" "$logs/postgres.previous.log" # e.g. a crashed run's
  : >"$logfile"
  chown "$PG_USER:$(id -gn "$PG_USER")" "$state"
  chmod 0755 "$state"
  as_pg test -w "$state" ||
    die "user $PG_USER cannot reach $state (a parent directory is not searchable); set MW_RUN_DIR"

  # mw's password: random, readable by the invoking user only.
  (umask 077; openssl rand -hex 24 >"$state/password")
  local pwfile="$state/.initdb-pw"
  (umask 077; cat "$state/password" >"$pwfile")
  chown "$PG_USER" "$pwfile"

  local data="$state/data"
  log "initdb ($("$bin/postgres" --version)) in $data"
  if ! (as_pg "$bin/initdb" -D "$data" -U "$ADMIN" --pwfile="$pwfile" \
          -E UTF8 --locale=C.UTF-8 --auth-local=scram-sha-256 --auth-host=scram-sha-256 \
          --no-sync >>"$logfile" 2>&1); then
    rm -rf "$state"
    die "initdb failed; see $logfile"
  fi
  rm -f "$pwfile"

  gen_certs "$state" "$data"
  cat >>"$data/postgresql.conf" <<CONF

# ---- hack/postgres.sh: throw-away test server ----
listen_addresses = '127.0.0.1'
unix_socket_directories = '$state'
password_encryption = 'scram-sha-256'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
# Nothing here needs to survive a crash.
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
  cat >"$data/pg_hba.conf" <<HBA
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 scram-sha-256
host    all       all   127.0.0.1/32  scram-sha-256
# The real node's Pods (the chart's bridge in tests/release.rs), which reach this loopback
# server through the node's DNAT at 10.88.0.1 (hack/realnode.sh, node-expose).
host    all       all   10.88.0.0/24  scram-sha-256
HBA

  # The chosen port may be taken by the time postgres binds it: retry with another.
  local port started=0 rc
  for _ in 1 2 3; do
    port=$(free_port)
    echo "$port" >"$state/port"
    rc=0; launch "$bin" "$state" "$port" "$logfile" || rc=$?
    ((rc == 0)) && { started=1; break; }
    if ((rc == 2)); then
      log "postgres did not accept connections within 60s; see $logfile"
      stop_server "$state"; rm -rf "$state"; return 1
    fi
    if grep -q 'could not bind\|Address already in use' "$logfile"; then
      log "port $port was taken; retrying with another"
      continue
    fi
    log "postgres exited during start-up; see $logfile"; tail -n 20 "$logfile" >&2
    rm -rf "$state"; return 1
  done
  ((started)) || { log "could not find a free port"; stop_server "$state"; rm -rf "$state"; return 1; }

  if ! healthy "$state"; then
    log "postgres is up but a TLS + password login as $ADMIN failed; see $logfile"
    stop_server "$state"; rm -rf "$state"; return 1
  fi
  log "postgres '$name' up in $((SECONDS - t0))s on 127.0.0.1:$port (TLS, user $ADMIN)"
  log "url:      $(cmd_url "$name" postgres)?sslmode=verify-full&sslrootcert=$state/ca.crt"
  log "password: $state/password; logs: $logs/"
}

cmd_down() {
  local name=$1
  local state; state=$(state_dir "$name")
  setup_user
  lock "$name"
  [ -d "$state" ] || { log "postgres '$name' is not running"; return 0; }
  stop_server "$state"
  rm -rf "$state"
  log "postgres '$name' stopped; log kept in $LOG_ROOT/$name/"
}

# A database outage for the fault tests: the server stops, its data, port, password and
# certificates stay, and `resume` brings the same server back on the same port.
cmd_pause() {
  local name=$1 state; state=$(state_dir "$name")
  setup_user
  lock "$name"
  [ -f "$state/port" ] || die "postgres '$name' is not up"
  stop_server "$state"
  log "postgres '$name' paused (data kept)"
}

cmd_resume() {
  local name=$1 state; state=$(state_dir "$name")
  setup_user
  lock "$name"
  [ -f "$state/port" ] || die "postgres '$name' was never started"
  if healthy "$state"; then log "postgres '$name' is already up"; return 0; fi
  local port; port=$(cat "$state/port")
  launch "$(bindir)" "$state" "$port" "$LOG_ROOT/$name/postgres.log" ||
    die "postgres '$name' did not come back within 60s; see $LOG_ROOT/$name/postgres.log"
  log "postgres '$name' resumed on port $port"
}

require_up() {
  local state; state=$(state_dir "$1")
  [ -f "$state/port" ] || die "postgres '$1' is not up (hack/postgres.sh up $1)"
}

cmd_url() {
  local name=$1 db=${2:-postgres}
  require_up "$name"
  echo "postgres://$ADMIN@127.0.0.1:$(cat "$(state_dir "$name")/port")/$db"
}

cmd_psql() {
  local name=$1; shift
  require_up "$name"
  local bin; bin=$(bindir)
  psql_env "$(state_dir "$name")"
  exec "$bin/psql" -X "$@"
}

cmd_status() {
  local name=$1 state; state=$(state_dir "$name")
  if healthy "$state"; then
    log "postgres '$name' is up: $(cmd_url "$name")"
  else
    log "postgres '$name' is not up"; return 1
  fi
}

main() {
  local sub=${1:-} name=${2:-default}
  case "$sub" in
    up|down|status|pause|resume|url|password-file|ca|log-dir|psql) check_name "$name" ;;
  esac
  case "$sub" in
    up) cmd_up "$name" >&2 ;; # nothing on stdout
    down) cmd_down "$name" >&2 ;;
    status) cmd_status "$name" ;;
    pause) cmd_pause "$name" >&2 ;;
    resume) cmd_resume "$name" >&2 ;;
    url) cmd_url "$name" "${3:-postgres}" ;;
    password-file) require_up "$name"; echo "$(state_dir "$name")/password" ;;
    ca) require_up "$name"; echo "$(state_dir "$name")/ca.crt" ;;
    log-dir) echo "$LOG_ROOT/$name" ;;
    psql) shift $(($# < 2 ? $# : 2)); cmd_psql "$name" "$@" ;;
    *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
}

# One line, so bash has read it whole before running it (editing this file while it runs).
main "$@"; exit $?
