#!/usr/bin/env bash
# Installs the system components the test suite runs for real (Prometheus/promtool, Chromium,
# PostgreSQL server binaries) when they are missing. Idempotent; needs root (or sudo) and Debian.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
if [ ${#need[@]} -eq 0 ]; then
  echo "system-deps: prometheus, chromium and postgresql already present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "system-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The Debian prometheus package starts a service on :9090 where an init system runs; the tests
# start their own on 127.0.0.1 with a free port, so a stray one is only stopped, never needed.
$SUDO systemctl stop prometheus >/dev/null 2>&1 || true
$SUDO service prometheus stop >/dev/null 2>&1 || true
