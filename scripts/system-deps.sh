#!/usr/bin/env bash
# Installs the system components the test suite runs for real when they are missing:
# Prometheus + promtool (rules and dashboard queries), Chromium (page tests), kubectl (kustomize
# render of deploy/), PostgreSQL server binaries (DuckLake catalog). Idempotent; Debian; root or sudo.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v kubectl >/dev/null 2>&1 || need+=(kubectl)
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
if [ ${#need[@]} -eq 0 ]; then
  echo "system-deps: prometheus, chromium, kubectl and postgresql already present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "system-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The Debian prometheus package may start a service on :9090; the tests start their own on a
# free port of 127.0.0.1, so a stray one is stopped, never used.
$SUDO systemctl stop prometheus >/dev/null 2>&1 || true
$SUDO service prometheus stop >/dev/null 2>&1 || true
