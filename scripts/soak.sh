#!/usr/bin/env bash
# The soak test: a 10-million-key flood of the memory store, a flood of
# distinct keys through a real Caddy, and three Caddy instances sharing one
# Redis while Redis is quiet, the cores are busy, Redis is stopped and
# restarted, paused (SIGSTOP) and stalled (DEBUG SLEEP). It prints a table
# of its figures and fails on any 5xx, on memory that grows past max_keys,
# or when the default on_storage_error admits more than 5% over b + r*t
# while Redis answers. Needs Go and redis-server; takes about two minutes.
#
# Longer or shorter runs: SOAK_KEYS (default 10000000), SOAK_HTTP_KEYS
# (200000), SOAK_PHASE_SECONDS (4).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
go test -tags soak -count=1 -run Soak -v -timeout 30m ./internal/soak/ >"$out" 2>&1 || status=$?
grep -E '^(--- |FAIL|ok|PASS)|soak_test.go' "$out" || true
echo
echo "== soak figures"
grep '^SOAK ' "$out" | sed 's/^SOAK //'
exit "$status"
