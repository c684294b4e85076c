#!/usr/bin/env bash
# Prints the path of a helm binary at the pinned version, building it from the Go module proxy
# into the same cache as the control plane the first time (no prebuilt downloads here).
set -euo pipefail
HELM_VERSION=v4.3.2
CACHE_ROOT="${MW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mw-operator}"
dir="$CACHE_ROOT/bin/helm-$HELM_VERSION"
if [ ! -x "$dir/helm" ]; then
  printf '[helm] building helm %s into %s\n' "$HELM_VERSION" "$dir" >&2
  tmp="$dir.partial.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOBIN="$tmp" \
    go install -ldflags "-s -w" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
  rm -rf "$dir"; mv "$tmp" "$dir"
fi
echo "$dir/helm"
