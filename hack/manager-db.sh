#!/usr/bin/env bash
# A Manager database for the demo and the benchmarks, built from the schema Manager's own
# migrations leave (tests/fixtures/manager-schema/, see its README) plus its sample rows and
# the system env defaults Manager's migration seeds:
#
#   hack/manager-db.sh sqlite PATH     create PATH (replacing it) as a SQLite Manager database
#
# The sample rows put three containers (team-wiki, pg-analytics, akumar-dev) on Manager node
# `k8s-lab-1`, of nodeType 'kubernetes'.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FIXTURES="$HERE/../tests/fixtures/manager-schema"

# Manager's migration seeds these keys (with placeholder values) into Settings; the bridge
# puts them, like every env value, into each workload's Secret.
DEFAULT_ENV='[{"key":"WAZUH_MANAGER","value":"wazuh.lab.internal","description":"Wazuh manager address"},{"key":"WAZUH_REGISTRATION_PASSWORD","value":"change-me","description":"Wazuh agent registration password"},{"key":"SSSD_LDAP_URI","value":"ldaps://ldap.lab.internal","description":"LDAP server for SSSD"}]'
NOW=$(date -u +'%Y-%m-%d %H:%M:%S.000 +00:00')

case "${1:-}" in
  sqlite)
    db=${2:?PATH}
    command -v sqlite3 >/dev/null || { echo "sqlite3 is missing: run hack/ensure-tools.sh" >&2; exit 1; }
    mkdir -p "$(dirname "$db")"
    rm -f "$db"
    {
      # sqlite_sequence is SQLite's own table and cannot be created by hand (fixtures README).
      grep -vx 'CREATE TABLE sqlite_sequence(name,seq);' "$FIXTURES/sqlite.sql"
      echo 'PRAGMA foreign_keys=ON;'
      cat "$FIXTURES/sample-rows.sql"
      # Their containerIds name namespace default, where an earlier install ran them; here
      # they are new containers (the bridge holds a row whose containerId names another
      # namespace than its node's as node_moved: docs/bridge.md).
      echo 'UPDATE "Containers" SET "containerId" = NULL;'
      printf "INSERT INTO \"Settings\" (key, value, \"createdAt\", \"updatedAt\") VALUES ('default_container_env_vars', '%s', '%s', '%s');\n" \
        "$DEFAULT_ENV" "$NOW" "$NOW"
    } | sqlite3 -bail "$db"
    echo "$db"
    ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
