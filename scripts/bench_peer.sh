#!/usr/bin/env bash
# bench_peer.sh measures Tollgate's memory zone beside mholt/caddy-ratelimit
# v0.1.0 (our users' previous module) through a real Caddy with wrk. The two
# register the same module ID, so they cannot share one binary: the script
# builds one Caddy of each (the same Caddy version, from this checkout's
# go.mod), and runs a Caddy a route, all at once, on free loopback ports.
# Each round measures every route in turn, with the same keys:
#   - with Tollgate: a bare `respond` route, a memory zone allowing every
#     request with the default ietf headers, the same zone with
#     `headers none`, and the zone as mholt's users write it (`events 100`,
#     `window 1s`: a sliding_log), with the default headers and with
#     `headers none`;
#   - with mholt's module: a bare `respond` route, and a zone allowing every
#     request (mholt sends no rate-limit headers; its state is a ring of
#     `events` times per key, so its events are kept small: 100 per second).
# Each route's throughput is divided by its own module's bare route in
# the same round, and the medians over the rounds are printed last, with
# the CPU a request each route costs its Caddy beyond its bare one, the
# garbage collections a 1000 requests on each route, and, round by round,
# Tollgate's throughput over mholt's.
#
# Both modules get the same treatment: the same Caddy version and build,
# the same global options (no logs, no metrics, admin on), a Caddy of its
# own for every route, holding only its own zone's state (a bare route's
# Caddy holds none), the same keys in the same spread, and every route a
# turn before the rounds (its keys are created, its Caddy's heap holds its
# zone's state: mholt's 10,000 rings of 100 times are about 24 MB, which
# makes its Caddy collect about a fifth as often as Tollgate's, each
# collection marking them all). Each round takes the routes in a random
# order, and the round after it in the reverse order, so that no route
# always follows another (with a fixed rotation, mholt's zone always came
# right after its own bare route): SEED=<n> repeats a run's orders.
#
# CADDY_ENV="<VAR=value> ..." is every Caddy's environment: e.g.
# CADDY_ENV="GOGC=off GOMEMLIMIT=256MiB" gives each the same room before
# it collects, whatever its zone's state holds.
#
# Usage: [PROFILE=<seconds>] [SEED=<n>] [CADDY_ENV=...] scripts/bench_peer.sh [seconds per route, default 3] [connections, default 64] [rounds, default 10] [keys, default 10000]
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

# A Caddy a route: each holds only its own zone's state, and each bare
# route is a Caddy that holds none, so that a route's ratio carries what
# its zone costs the Caddy, the collection of its state included, and
# nothing of the other zones'. (With one Caddy a module, every route paid
# for the collection of every zone's state: Tollgate's bare route for
# four zones', mholt's for its 24 MB of rings or, after its sweep, for
# none.)
names=(tollgate-bare memory memory-none memory-log memory-log-none mholt-bare mholt)
bins=(tollgate tollgate tollgate tollgate tollgate mholt mholt)
zones=(
	""
	"$(zone mem $'\t\t\trate 1000000/s')"
	"$(zone memnone $'\t\t\trate 1000000/s' $'\t\theaders none')"
	"$(zone memlog $'\t\t\tevents 100\n\t\t\twindow 1s')"
	"$(zone memlognone $'\t\t\tevents 100\n\t\t\twindow 1s' $'\t\theaders none')"
	""
	"$(zone mh $'\t\t\tevents 100\n\t\t\twindow 1s')"
)
routes=()
for i in "${!names[@]}"; do
	port=$(freeport) admin=$(freeport)
	{
		globals "$admin"
		site "$port" "${zones[$i]}"
	} >"$dir/Caddyfile.${names[$i]}"
	# shellcheck disable=SC2086
	env ${CADDY_ENV:-} "$dir/caddy-${bins[$i]}" run --config "$dir/Caddyfile.${names[$i]}" --adapter caddyfile >"$dir/${names[$i]}.out" 2>&1 &
	pids+=($!)
	routes+=("$! $port $admin")
done
for r in "${routes[@]}"; do
	read -r _ port _ <<<"$r"
	waitport "$port"
done
writekeys "$nkeys"
hz=$(getconf CLK_TCK)
gcs() { # admin-port -> the Caddy's collections so far
	curl -s "http://127.0.0.1:$1/debug/vars" | python3 -c 'import json, sys; print(json.load(sys.stdin)["memstats"]["NumGC"])'
}
run() { # pid port admin-port -> "requests/s µs-of-CPU-a-request collections-a-1000-requests"
	local c0 g0 rps out
	g0=$(gcs "$3")
	c0=$(cpu "$1")
	out=$(wrk -t2 -c"$conns" -d"${secs}s" -s "$dir/keys.lua" "http://127.0.0.1:$2/")
	# Every route admits every request: a 429 would measure another path.
	if grep -q 'Non-2xx' <<<"$out"; then echo "port $2: $(grep 'Non-2xx' <<<"$out")" >&2; exit 1; fi
	rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
	python3 -c "print('$rps', f'{($(cpu "$1") - $c0) * 1e6 / $hz / ($rps * $secs):.2f}', f'{($(gcs "$3") - $g0) * 1000 / ($rps * $secs):.3f}')"
}

# Every route once before the rounds: its keys are created, and its
# Caddy's heap holds its zone's state, before anything is measured.
for i in "${!routes[@]}"; do
	# shellcheck disable=SC2086
	run ${routes[$i]} >/dev/null
done

# The order of the routes: a random one each odd round, and its reverse
# the round after, so that over each pair of rounds every route has the
# same mean place, and no route always follows another (its own Caddy's
# bare route, or the other Caddy's turns, which leave its Caddy idle).
seed=${SEED:-$RANDOM}
orders=$(python3 - "$seed" "$rounds" "${#routes[@]}" <<'PY'
import random, sys
seed, rounds, n = map(int, sys.argv[1:])
rng = random.Random(seed)
for r in range(rounds):
    if r % 2 == 0:
        order = list(range(n))
        rng.shuffle(order)
    else:
        order.reverse()
    print(" ".join(map(str, order)))
PY
)
echo "wrk -c$conns, ${secs}s per route, $nkeys keys, $rounds rounds (SEED=$seed); ratios to the same module's bare route in the same round"
round=0
while read -r order; do
	round=$((round + 1))
	for j in $order; do
		# shellcheck disable=SC2086
		res=$(run ${routes[$j]}) # a failed run stops the script here
		echo "$round ${names[$j]} $res"
	done
done <<<"$orders" >"$dir/runs"
if [ -n "${RUNS:-}" ]; then cp "$dir/runs" "$RUNS"; fi # RUNS=<file> keeps every turn's figures
python3 - "$dir/runs" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, name, rps, us, gc = line.split()
    d[r][name] = (float(rps), float(us), float(gc))
def ratios(name, bare):
    return [d[r][name][0] / d[r][bare][0] for r in d]
def show(label, name, bare):
    rs = ratios(name, bare)
    extra = [d[r][name][1] - d[r][bare][1] for r in d]
    gc = statistics.median(d[r][name][2] for r in d)
    print(f"  {label:<40} {statistics.median(rs):.3f}  ({min(rs):.3f}-{max(rs):.3f})   CPU {statistics.median(extra):+.2f} µs a request, {gc:.3f} collections a 1000")
print("medians (range) of the rounds' ratios to bare:")
show("Tollgate memory zone, ietf headers", "memory", "tollgate-bare")
show("Tollgate memory zone, headers none", "memory-none", "tollgate-bare")
show("Tollgate as mholt's users write it", "memory-log", "tollgate-bare")
show("  the same, headers none", "memory-log-none", "tollgate-bare")
show("mholt/caddy-ratelimit v0.1.0", "mholt", "mholt-bare")
for caddy in ("tollgate", "mholt"):
    b = f"{caddy}-bare"
    print(f"  {b:<40} {statistics.median(d[r][b][0] for r in d):.0f} requests/s, {statistics.median(d[r][b][1] for r in d):.2f} µs of CPU a request, {statistics.median(d[r][b][2] for r in d):.3f} collections a 1000")
# The comparison the script is for, round by round: Tollgate's route
# over mholt's, each in a Caddy of its own, both measured in the same
# round; and the two bare Caddies, which differ only in the module
# compiled in and not used, for the noise a quotient carries.
def quotients(label, a, b):
    q = [d[r][a][0] / d[r][b][0] for r in d]
    print(f"  {label:<40} {statistics.median(q):.3f}  ({min(q):.3f}-{max(q):.3f})")
print("requests/s over mholt's zone's, round by round (median, range):")
quotients("Tollgate as mholt's users write it", "memory-log", "mholt")
quotients("  the same, headers none", "memory-log-none", "mholt")
quotients("Tollgate token_bucket, ietf headers", "memory", "mholt")
quotients("bare Tollgate build over bare mholt's", "tollgate-bare", "mholt-bare")
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
read -r _ tl ta <<<"${routes[3]}"
read -r _ mm ma <<<"${routes[6]}"
profile "Tollgate as mholt's users write it" "$tl" "$ta" "$dir/caddy-tollgate" '/tollgate\.\(\*Handler\)\.ServeHTTP'
profile "mholt/caddy-ratelimit v0.1.0" "$mm" "$ma" "$dir/caddy-mholt" '/caddy-ratelimit\.Handler\.ServeHTTP'
