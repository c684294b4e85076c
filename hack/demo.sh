#!/usr/bin/env bash
# `make demo`: start the local control plane, install the CRD and RBAC, run the operator
# against it, apply config/samples/ and show the workloads reaching Running. Everything stays
# up afterwards so you can try kubectl on it; `make demo-down` (or `make cluster-down`) stops it.
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
step "local control plane (first run builds Kubernetes from source: expect ~20 minutes on 2 cores)"
bash "$CP" up "$NAME"
KCFG=$("$CP" kubeconfig "$NAME")
LOGS=$("$CP" log-dir "$NAME")
KUBECTL=("$("$CP" bin-dir)/kubectl" --kubeconfig "$KCFG")

step "operator build"
cargo build --locked --bin mw-operator

step "CRD and RBAC"
bash "$CP" install-operator "$NAME"

step "operator (logs: $LOGS/operator.log)"
bash "$CP" start-operator "$NAME" "$REPO/target/debug/mw-operator" >/dev/null

step "samples"
"${KUBECTL[@]}" apply -f config/samples/
if ! "${KUBECTL[@]}" wait --for=condition=Ready managedworkloads --all --timeout=120s; then
  echo "the samples did not become Ready; operator log: $LOGS/operator.log" >&2
  "${KUBECTL[@]}" get managedworkloads -o yaml >&2
  exit 1
fi
"${KUBECTL[@]}" get managedworkloads -o wide
"${KUBECTL[@]}" get deployments,pods -o wide

cat <<MSG

The demo is running. Point kubectl at it:
  export KUBECONFIG=$KCFG
  alias kubectl=$("$CP" bin-dir)/kubectl     # the matching v1.36 client, if you have none
  kubectl get mw
  kubectl patch mw nginx --type merge -p '{"spec":{"state":"Stopped"}}'
Logs: $LOGS/   Stop everything: make demo-down
MSG
