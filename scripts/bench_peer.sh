#!/usr/bin/env bash
# bench_peer.sh measures Tollgate's memory zone beside mholt/caddy-ratelimit
# v0.1.0 (our users' previous module) through a real Caddy with wrk. The two
# register the same module ID, so they cannot share one binary: the script
# builds one Caddy of each (the same Caddy version, from this checkout's
# go.mod), runs both at once on free loopback ports, and each round measures
# in turn, with the same keys:
#   - Tollgate's Caddy: a bare `respond` route, a memory zone allowing every
#     request with the default ietf headers, the same zone with
#     `headers none`, and the zone as mholt's users write it (`events 100`,
#     `window 1s`: a sliding_log), with the default headers and with
#     `headers none`;
#   - mholt's Caddy: a bare `respond` route, and a zone allowing every
#     request (mholt sends no rate-limit headers; its state is a ring of
#     `events` times per key, so its events are kept small: 100 per second).
# Each route's throughput is divided by its own Caddy's bare route in the
# same round, and the medians over the rounds are printed last, with the
# CPU a request each route costs its Caddy beyond its bare route.
#
# Usage: [PROFILE=<seconds>] scripts/bench_peer.sh [seconds per route, default 3] [connections, default 64] [rounds, default 10] [keys, default 10000]
# With PROFILE, it ends with the handler's own CPU a request on both
# Caddies, from CPU profiles (see the end of the script).
# Needs Go (the module proxy must serve github.com/mholt/caddy-ratelimit
# v0.1.0), wrk and python3.
set -euo pipefail
secs=${1:-3}
conns=${2:-64}
rounds=${3:-10}
nkeys=${4:-10000}
for v in "seconds:$secs" "connections:$conns" "rounds:$rounds" "keys:$nkeys"; do
	case ${v#*:} in
	'' | *[!0-9]* | 0) echo "${v%%:*}: want a positive whole number, got ${v#*:}" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
for bin in wrk python3; do
	command -v "$bin" >/dev/null || { echo "$bin not installed" >&2; exit 1; }
done

# shellcheck source=scripts/benchlib.sh
. scripts/benchlib.sh

echo "building Caddy with Tollgate, and Caddy with mholt/caddy-ratelimit v0.1.0"
go build -o "$dir/caddy-tollgate" ./cmd/caddy
mkdir "$dir/peer"
cp go.mod go.sum "$dir/peer/"
cat >"$dir/peer/main.go" <<'EOF'
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-ratelimit"
)

func main() { caddycmd.Main() }
EOF
(
	cd "$dir/peer"
	go mod edit -module peercaddy
	go get github.com/mholt/caddy-ratelimit@v0.1.0 >/dev/null 2>&1 ||
		{ echo "go get github.com/mholt/caddy-ratelimit@v0.1.0 failed" >&2; exit 1; }
	GOFLAGS=-mod=mod go build -o "$dir/caddy-mholt" .
)

# A site a route (see globals in benchlib.sh).
tb=$(freeport) tm=$(freeport) tn=$(freeport) tl=$(freeport) tq=$(freeport) ta=$(freeport)
mb=$(freeport) mm=$(freeport) ma=$(freeport)
{
	globals "$ta"
	site "$tb" ""
	site "$tm" "$(zone mem $'\t\t\trate 1000000/s')"
	site "$tn" "$(zone memnone $'\t\t\trate 1000000/s' $'\t\theaders none')"
	site "$tl" "$(zone memlog $'\t\t\tevents 100\n\t\t\twindow 1s')"
	site "$tq" "$(zone memlognone $'\t\t\tevents 100\n\t\t\twindow 1s' $'\t\theaders none')"
} >"$dir/Caddyfile.tollgate"
{
	globals "$ma"
	site "$mb" ""
	site "$mm" "$(zone mh $'\t\t\tevents 100\n\t\t\twindow 1s')"
} >"$dir/Caddyfile.mholt"
"$dir/caddy-tollgate" run --config "$dir/Caddyfile.tollgate" --adapter caddyfile >"$dir/tollgate.out" 2>&1 &
tpid=$!
pids+=($tpid)
"$dir/caddy-mholt" run --config "$dir/Caddyfile.mholt" --adapter caddyfile >"$dir/mholt.out" 2>&1 &
mpid=$!
pids+=($mpid)
waitport "$tb"
waitport "$mb"
writekeys "$nkeys"
hz=$(getconf CLK_TCK)
run() { # pid port -> "requests/s µs-of-CPU-a-request"
	local c0 rps out
	c0=$(cpu "$1")
	out=$(wrk -t2 -c"$conns" -d"${secs}s" -s "$dir/keys.lua" "http://127.0.0.1:$2/")
	# Every route admits every request: a 429 would measure another path.
	if grep -q 'Non-2xx' <<<"$out"; then echo "port $2: $(grep 'Non-2xx' <<<"$out")" >&2; exit 1; fi
	rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
	python3 -c "print('$rps', f'{($(cpu "$1") - $c0) * 1e6 / $hz / ($rps * $secs):.2f}')"
}
run "$tpid" "$tb" >/dev/null # warm up
run "$mpid" "$mb" >/dev/null

echo "wrk -c$conns, ${secs}s per route, $nkeys keys, $rounds rounds; ratios to the same Caddy's bare route in the same round"
routes=("$tpid $tb" "$tpid $tm" "$tpid $tn" "$tpid $tl" "$tpid $tq" "$mpid $mb" "$mpid $mm")
names=(tollgate-bare memory memory-none memory-log memory-log-none mholt-bare mholt)
for round in $(seq "$rounds"); do
	for i in "${!routes[@]}"; do
		j=$(((i + round) % ${#routes[@]}))
		# shellcheck disable=SC2086
		res=$(run ${routes[$j]}) # a failed run stops the script here
		echo "$round ${names[$j]} $res"
	done
done >"$dir/runs"
python3 - "$dir/runs" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, name, rps, us = line.split()
    d[r][name] = (float(rps), float(us))
def show(label, name, bare):
    ratios = [d[r][name][0] / d[r][bare][0] for r in d]
    extra = [d[r][name][1] - d[r][bare][1] for r in d]
    print(f"  {label:<40} {statistics.median(ratios):.3f}  ({min(ratios):.3f}-{max(ratios):.3f})   CPU +{statistics.median(extra):.2f} µs a request")
print("medians (range) of the rounds' ratios to bare:")
show("Tollgate memory zone, ietf headers", "memory", "tollgate-bare")
show("Tollgate memory zone, headers none", "memory-none", "tollgate-bare")
show("Tollgate as mholt's users write it", "memory-log", "tollgate-bare")
show("  the same, headers none", "memory-log-none", "tollgate-bare")
show("mholt/caddy-ratelimit v0.1.0", "mholt", "mholt-bare")
print(f"  bare requests/s, medians: Tollgate's Caddy {statistics.median(d[r]['tollgate-bare'][0] for r in d):.0f}, mholt's Caddy {statistics.median(d[r]['mholt-bare'][0] for r in d):.0f}")
EOF

# With PROFILE=<seconds>, the handler's own CPU a request, from each
# Caddy's CPU profile (/debug/pprof/profile on its admin endpoint) taken
# under wrk on the zone as mholt's users write it: the samples under the
# rate_limit handler, less those of the handlers after it (the
# `respond`), over the requests served meanwhile. Unlike the ratios, it
# leaves out what the machine's other work does to both Caddies.
[ -n "${PROFILE:-}" ] || exit 0
case $PROFILE in '' | *[!0-9]* | 0) echo "PROFILE: want a positive whole number of seconds, got $PROFILE" >&2; exit 2 ;; esac
profile() { # name port admin-port binary handler-function
	local out rps own
	(sleep 1; curl -s -o "$dir/profile.cpu" "http://127.0.0.1:$3/debug/pprof/profile?seconds=$PROFILE") &
	out=$(wrk -t2 -c"$conns" -d"$((PROFILE + 2))s" -s "$dir/keys.lua" "http://127.0.0.1:$2/")
	wait $!
	if grep -q 'Non-2xx' <<<"$out"; then echo "port $2: $(grep 'Non-2xx' <<<"$out")" >&2; exit 1; fi
	rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
	own=$(go tool pprof -top -cum -nodecount=5000 -ignore 'StaticResponse' "$4" "$dir/profile.cpu" 2>/dev/null | grep -E "$5\$" | awk '{print $4}' | head -1)
	python3 - "$1" "${own:-0s}" "$rps" "$PROFILE" <<'PY'
import sys
name, own, rps, secs = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
s = float(own[:-2]) / 1000 if own.endswith("ms") else float(own.rstrip("s"))
print(f"  {name:<40} {s * 1e6 / (rps * secs):.2f} µs a request  ({own} of samples, {rps:.0f} requests/s)")
PY
}
echo "the rate_limit handler's own CPU a request (${PROFILE}s profiles under wrk):"
profile "Tollgate as mholt's users write it" "$tl" "$ta" "$dir/caddy-tollgate" '/tollgate\.\(\*Handler\)\.ServeHTTP'
profile "mholt/caddy-ratelimit v0.1.0" "$mm" "$ma" "$dir/caddy-mholt" '/caddy-ratelimit\.Handler\.ServeHTTP'
