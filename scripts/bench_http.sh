#!/usr/bin/env bash
# bench_http.sh measures Tollgate through a real Caddy with wrk, every route
# in one Caddy process and one run, so that the ratios compare like with
# like: a bare `respond` route (the reference), a zone on the memory store
# allowing every request (10,000 keys from a header, default ietf headers),
# the same zone on Redis, and one hot key always over its limit on the
# memory store and on Redis (the reject path). It starts its own
# redis-server on a free loopback port, and reports requests/s per route,
# the ratios, how many scripts Redis ran for the hot key's rejections, and
# the CPU time Caddy and Redis spent per request on each route. A route
# where Caddy's own header directive sets the same two headers that the
# memory zone sends (no limiting) shows about the least that one more
# handler writing those two headers costs Caddy: the floor of a rate
# limiter that sends them.
#
# Usage: scripts/bench_http.sh [seconds per route, default 10] [connections, default 64] [rounds, default 1] [routes: all (default), allowed or follow] [keys, default 10000]
#
# With several rounds, every route runs once per round, in turn, and the
# medians of each round's ratios are printed last: on shared cores the
# throughput drifts from minute to minute, and a ratio within one round
# compares routes measured seconds apart. `allowed` runs only the bare,
# header and memory routes, and the memory zone with `headers none`, so
# that many short rounds fit in a few minutes: the more rounds, the closer
# their median comes to the ratio that the machine's drift hides in any
# one round. keys is how many distinct keys the allowed routes' requests
# carry: with few, the store's memory stays in the processor's caches.
# `follow` runs the memory zone and the Redis zone twice, with
# on_storage_error local (the default: each decision also seeds the local
# copy a timed-out decision goes on from) and allow (no local copy): the
# cost of keeping the copy, measured side by side.
# Needs Go, wrk and redis-server (apt-get install wrk redis-server).
set -euo pipefail
secs=${1:-10}
conns=${2:-64}
rounds=${3:-1}
routes=${4:-all}
nkeys=${5:-10000}
case $nkeys in
'' | *[!0-9]* | 0) echo "keys: want a positive whole number, got $nkeys" >&2; exit 2 ;;
esac
case $routes in
all | allowed | follow) ;;
*) echo "routes: want all, allowed or follow, got $routes" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
for bin in wrk redis-server redis-cli; do
	command -v "$bin" >/dev/null || { echo "$bin not installed: apt-get install wrk redis-server" >&2; exit 1; }
done

# shellcheck source=scripts/benchlib.sh
. scripts/benchlib.sh

rport=$(freeport)
redis-server --port "$rport" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
	--daemonize no --protected-mode no --logfile "$dir/redis.log" &
pids+=($!)
rpid=$!
for _ in $(seq 50); do redis-cli -p "$rport" PING >/dev/null 2>&1 && break; sleep 0.1; done

go build -o "$dir/caddy" ./cmd/caddy
aport=$(freeport)
# A site a route (see globals in benchlib.sh): every route is reached the
# same way, and only what its handlers do differs.
declare -A port
for r in bare header memory memory-none redis redis-allow memory-hot redis-hot; do port[$r]=$(freeport); done
rate() { printf '\t\t\trate %s' "$1"; }
redis=$(printf '\t\tstorage redis {\n\t\t\taddresses 127.0.0.1:%s\n\t\t}' "$rport")
{
	globals "$aport"
	site "${port[bare]}" ""
	site "${port[header]}" "$(printf '\theader RateLimit-Policy "\\"mem\\";q=1000000;w=1"\n\theader RateLimit "\\"mem\\";r=999999;t=1"')"
	site "${port[memory]}" "$(zone mem "$(rate 1000000/s)")"
	site "${port[memory-none]}" "$(zone memnone "$(rate 1000000/s)" "$(printf '\t\theaders none')")"
	site "${port[redis]}" "$(zone red "$(rate 1000000/s)" "$redis")"
	site "${port[redis-allow]}" "$(zone redallow "$(rate 1000000/s)$(printf '\n\t\t\ton_storage_error allow')" "$redis")"
	site "${port[memory-hot]}" "$(zone memhot "$(rate 1/h)")"
	site "${port[redis-hot]}" "$(zone redhot "$(rate 1/h)" "$redis")"
} >"$dir/Caddyfile"
"$dir/caddy" run --config "$dir/Caddyfile" --adapter caddyfile >"$dir/caddy.out" 2>&1 &
pids+=($!)
cpid=$!
waitport "${port[bare]}"

# nkeys keys, one per request at random; a hot key for the reject routes.
writekeys "$nkeys"
cat >"$dir/hot.lua" <<'EOF'
wrk.headers["X-Key"] = "hot"
EOF

hz=$(getconf CLK_TCK)
# run prints a route's requests/s, and Caddy's and Redis's CPU time per
# request in µs (process CPU time over the run, divided by its requests):
# on shared cores the throughput drifts with the neighbours' load, the CPU
# a request costs much less so.
run() { # route script -> "requests/s caddy-µs redis-µs"
	local c0 r0 rps
	c0=$(cpu "$cpid") r0=$(cpu "$rpid")
	rps=$(wrk -t2 -c"$conns" -d"${secs}s" -s "$dir/$2" "http://127.0.0.1:${port[$1]}/" | awk '/Requests\/sec/ {print $2}')
	python3 -c "n = $rps * $secs; print('$rps', f'{($(cpu "$cpid") - $c0) * 1e6 / $hz / n:.1f}', f'{($(cpu "$rpid") - $r0) * 1e6 / $hz / n:.1f}')"
}
curl -s -H 'X-Key: hot' "http://127.0.0.1:${port[memory-hot]}/" >/dev/null
curl -s -H 'X-Key: hot' "http://127.0.0.1:${port[redis-hot]}/" >/dev/null
run bare keys.lua >/dev/null # warm up
# The floor route must send what the memory zone sends, byte for byte.
ratelimit() { curl -si -H "X-Key: floor-check" "http://127.0.0.1:${port[$1]}/" | tr -d '\r' | grep -i '^ratelimit' | sort; }
if [ "$(ratelimit header)" != "$(ratelimit memory)" ]; then
	echo "the header route's RateLimit headers differ from the memory zone's:" >&2
	ratelimit header >&2; ratelimit memory >&2
	exit 1
fi
scripts() { redis-cli -p "$rport" INFO commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_(eval|evalsha|fcall):/ {n += $3} END {print n+0}'; }
ratio() { python3 -c "print(f'{float(\"$1\")/float(\"$2\"):.2f}')"; }
median() { python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.2f}')" "$@"; }
echo "wrk -c$conns, ${secs}s per route, one Caddy (a site a route), redis-server on 127.0.0.1:$rport, $rounds round(s)"
r_hdr=() r_memhdr=() c_hdr=() r_mem=() r_red=() r_memhot=() r_redhot=() ran=0 rejected=0
c_bare=() c_mem=() c_red=() c_redis=() r_memnone=() c_memnone=()
r_redal=() r_follow=() c_redal=() c_redisal=()
row() { printf "  %-34s %12s %8s %10s %10s\n" "$@"; }
for round in $(seq "$rounds"); do
	if [ "$routes" = follow ]; then
		for i in 0 1 2; do
			case $(((i + round) % 3)) in
			0) read -r mem mem_c _ <<<"$(run memory keys.lua)" ;;
			1) read -r red red_c red_r <<<"$(run redis keys.lua)" ;;
			2) read -r redal redal_c redal_r <<<"$(run redis-allow keys.lua)" ;;
			esac
		done
		r_red+=("$(ratio "$red" "$mem")") r_redal+=("$(ratio "$redal" "$mem")") r_follow+=("$(ratio "$red" "$redal")")
		c_red+=("$red_c") c_redis+=("$red_r") c_redal+=("$redal_c") c_redisal+=("$redal_r")
		echo "round $round"
		row route requests/s ratio "caddy µs" "redis µs"
		row "memory zone, allowed (ietf)" "$mem" 1.00 "$mem_c" -
		row "redis zone, on_storage_error local" "$red" "$(ratio "$red" "$mem")" "$red_c" "$red_r"
		row "redis zone, on_storage_error allow" "$redal" "$(ratio "$redal" "$mem")" "$redal_c" "$redal_r"
		continue
	fi
	# Each round starts its routes one further along, so that no route
	# is always the first one measured after the Redis routes.
	for i in 0 1 2 3; do
		case $(((i + round) % 4)) in
		0) read -r bare bare_c _ <<<"$(run bare keys.lua)" ;;
		1) read -r hdr hdr_c _ <<<"$(run header keys.lua)" ;;
		2) read -r mem mem_c _ <<<"$(run memory keys.lua)" ;;
		3)
			if [ "$routes" = all ]; then
				read -r red red_c red_r <<<"$(run redis keys.lua)"
			else
				read -r memnone memnone_c _ <<<"$(run memory-none keys.lua)"
			fi
			;;
		esac
	done
	for i in 0 1 2; do
		[ "$routes" = all ] || break
		case $(((i + round) % 3)) in
		0) read -r bare2 bare2_c _ <<<"$(run bare hot.lua)" ;;
		1) read -r memhot memhot_c _ <<<"$(run memory-hot hot.lua)" ;;
		2)
			before=$(scripts)
			read -r redhot redhot_c redhot_r <<<"$(run redis-hot hot.lua)"
			ran=$((ran + $(scripts) - before))
			;;
		esac
	done
	r_hdr+=("$(ratio "$hdr" "$bare")") r_memhdr+=("$(ratio "$mem" "$hdr")") c_hdr+=("$hdr_c")
	r_mem+=("$(ratio "$mem" "$bare")") c_bare+=("$bare_c") c_mem+=("$mem_c")
	echo "round $round"
	row route requests/s ratio "caddy µs" "redis µs"
	row "bare respond ($nkeys keys)" "$bare" 1.00 "$bare_c" -
	row "header directive, same headers" "$hdr" "$(ratio "$hdr" "$bare")" "$hdr_c" -
	row "memory zone, allowed (ietf)" "$mem" "$(ratio "$mem" "$bare")" "$mem_c" -
	if [ "$routes" != all ]; then
		r_memnone+=("$(ratio "$memnone" "$bare")") c_memnone+=("$memnone_c")
		row "memory zone, allowed (no headers)" "$memnone" "$(ratio "$memnone" "$bare")" "$memnone_c" -
		continue
	fi
	rejected=$(python3 -c "print($rejected + int(float('$redhot') * $secs))")
	r_red+=("$(ratio "$red" "$mem")") r_memhot+=("$(ratio "$memhot" "$bare2")") r_redhot+=("$(ratio "$redhot" "$memhot")")
	c_red+=("$red_c") c_redis+=("$red_r")
	row "redis zone, allowed (ietf)" "$red" "$(ratio "$red" "$bare")" "$red_c" "$red_r"
	row "bare respond (hot key)" "$bare2" 1.00 "$bare2_c" -
	row "memory zone, hot key rejected" "$memhot" "$(ratio "$memhot" "$bare2")" "$memhot_c" -
	row "redis zone, hot key rejected" "$redhot" "$(ratio "$redhot" "$bare2")" "$redhot_c" "$redhot_r"
done
if [ "$routes" = follow ]; then
	echo "medians over $rounds round(s):"
	echo "  redis, local / memory:      $(median "${r_red[@]}")"
	echo "  redis, allow / memory:      $(median "${r_redal[@]}")"
	echo "  redis, local / allow:       $(median "${r_follow[@]}")   (the cost of the local copy)"
	echo "CPU per request, medians (µs of Caddy's process + Redis's):"
	echo "  redis, local: $(median "${c_red[@]}") + $(median "${c_redis[@]}")   redis, allow: $(median "${c_redal[@]}") + $(median "${c_redisal[@]}")"
	exit 0
fi
echo "medians over $rounds round(s):"
echo "  memory allowed / bare:      $(median "${r_mem[@]}")"
echo "  header directive / bare:    $(median "${r_hdr[@]}")   (the floor for a handler writing the two headers)"
echo "  memory allowed / header:    $(median "${r_memhdr[@]}")"
if [ "$routes" != all ]; then
	echo "  memory, headers none / bare: $(median "${r_memnone[@]}")"
fi
if [ "$routes" = all ]; then
	echo "  redis allowed / memory:     $(median "${r_red[@]}")"
	echo "  memory rejected / bare:     $(median "${r_memhot[@]}")"
	echo "  redis rejected / memory:    $(median "${r_redhot[@]}")"
	echo "scripts Redis ran for about $rejected hot-key rejections: $ran"
fi
echo "CPU per request, medians (µs of Caddy's process; Redis's for the Redis route):"
cpuline="  bare: $(median "${c_bare[@]}")   header directive: $(median "${c_hdr[@]}")   memory allowed: $(median "${c_mem[@]}")"
if [ "$routes" != all ]; then
	cpuline+="   memory, headers none: $(median "${c_memnone[@]}")"
else
	cpuline+="   redis allowed: $(median "${c_red[@]}") + Redis $(median "${c_redis[@]}")"
fi
echo "$cpuline"
