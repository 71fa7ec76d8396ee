#!/usr/bin/env bash
# Runs the whole suite; "no tests collected" (pytest exit 5) is a failure, never a pass.
set -uo pipefail
BIN=${VENV:-.venv}/bin
mkdir -p artifacts
"$BIN/python" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
