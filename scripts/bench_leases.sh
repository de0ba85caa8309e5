#!/usr/bin/env bash
# bench_leases.sh measures quota leases through a real Caddy with wrk, every
# route in one Caddy process and one run, so that the ratios compare like
# with like: a token_bucket zone (1,000,000/s a key, never over) on the
# memory store, the same zone on Redis (leases on, the default), and on
# Redis with `lease off`, first with 100 hot keys (one of 100 at random a
# request), then with 10,000 cold keys. It starts its own redis-server on a
# free loopback port, and reports requests/s per route, the ratios, the CPU
# time Caddy spent per request (/proc) and Redis's (INFO cpu, user + sys)
# on each route, the share of requests decided from a lease (the
# lease_decisions_total metric) and the script calls Redis ran a request.
#
# Usage: scripts/bench_leases.sh [seconds per route, default 10] [connections, default 64] [rounds, default 1]
#
# With several rounds, every route runs once per round, in turn (each round
# one further along), and the medians of each round's ratios are printed
# last. Needs Go, wrk and redis-server (apt-get install wrk redis-server).
set -euo pipefail
secs=${1:-10}
conns=${2:-64}
rounds=${3:-1}
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
for _ in $(seq 50); do redis-cli -p "$rport" PING >/dev/null 2>&1 && break; sleep 0.1; done

go build -o "$dir/caddy" ./cmd/caddy
aport=$(freeport)
declare -A port
for r in memory lease off; do port[$r]=$(freeport); done
rate() { printf '\t\t\trate 1000000/s%s' "${1:-}"; }
redis=$(printf '\t\tstorage redis {\n\t\t\taddresses 127.0.0.1:%s\n\t\t}' "$rport")
{
	printf '{\n\tadmin localhost:%s\n\tauto_https off\n\tmetrics\n\tlog {\n\t\toutput discard\n\t}\n}\n' "$aport"
	site "${port[memory]}" "$(zone mem "$(rate)")"
	site "${port[lease]}" "$(zone leased "$(rate)" "$redis")"
	site "${port[off]}" "$(zone unleased "$(rate "$(printf '\n\t\t\tlease off')")" "$redis")"
} >"$dir/Caddyfile"
"$dir/caddy" run --config "$dir/Caddyfile" --adapter caddyfile >"$dir/caddy.out" 2>&1 &
pids+=($!)
cpid=$!
waitport "${port[memory]}"

keys() { # file n: each request carries X-Key, one of n keys at random
	cat >"$dir/$1" <<EOF
request = function()
	wrk.headers["X-Key"] = "client-" .. math.random($2)
	return wrk.format(nil)
end
EOF
}
keys hot.lua 100
keys cold.lua 10000

hz=$(getconf CLK_TCK)
rcpu() { redis-cli -p "$rport" INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
leased() { curl -s "http://localhost:$aport/metrics" | awk '/^caddy_http_rate_limit_lease_decisions_total / {printf "%.0f", $2}'; }
# scripts is how many script and function calls Redis ran (EVALSHA, EVAL,
# FCALL: a call of the batch function decides several requests).
scripts() { redis-cli -p "$rport" INFO commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_(eval|evalsha|fcall):/ {n += $3} END {print n+0}'; }
# run prints a route's requests/s, Caddy's and Redis's CPU time per
# request in µs, and the share of its requests decided from a lease.
run() { # route script -> "requests/s caddy-µs redis-µs leased-share scripts-a-request"
	local c0 r0 l0 s0 rps
	c0=$(cpu "$cpid") r0=$(rcpu) l0=$(leased) s0=$(scripts)
	rps=$(wrk -t2 -c"$conns" -d"${secs}s" -s "$dir/$2" "http://127.0.0.1:${port[$1]}/" | awk '/Requests\/sec/ {print $2}')
	python3 -c "n = $rps * $secs; print('$rps', f'{($(cpu "$cpid") - $c0) * 1e6 / $hz / n:.1f}', f'{($(rcpu) - $r0) * 1e6 / n:.2f}', f'{($(leased) - $l0) / n:.3f}', f'{($(scripts) - $s0) / n:.4f}')"
}
ratio() { python3 -c "print(f'{float(\"$1\")/max(float(\"$2\"), 1e-9):.2f}')"; }
median() { python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.2f}')" "$@"; }
row() { printf "  %-30s %12s %8s %10s %10s %8s %8s\n" "$@"; }

run memory hot.lua >/dev/null # warm up
# Redis's own CPU while no request comes (its cron, the idle clients), for
# as long as a route runs: a share of what the leased route's Redis CPU
# a request counts, printed beside it.
r0=$(rcpu)
sleep "$secs"
idle=$(python3 -c "print(f'{($(rcpu) - $r0) * 1e6:.0f}')")
echo "wrk -c$conns, ${secs}s per route, one Caddy (a site a route), redis-server on 127.0.0.1:$rport, $rounds round(s)"
echo "Redis's CPU while idle for ${secs}s: $idle µs"
h_lease=() h_off=() h_leaseoff=() h_cpu=() h_rcpu_l=() h_rcpu_o=() c_leaseoff=()
for round in $(seq "$rounds"); do
	for i in 0 1 2; do
		case $(((i + round) % 3)) in
		0) read -r mem mem_c _ _ _ <<<"$(run memory hot.lua)" ;;
		1) read -r lea lea_c lea_r lea_s lea_k <<<"$(run lease hot.lua)" ;;
		2) read -r off off_c off_r off_s off_k <<<"$(run off hot.lua)" ;;
		esac
	done
	for i in 0 1; do
		case $(((i + round) % 2)) in
		0) read -r clea clea_c clea_r clea_s clea_k <<<"$(run lease cold.lua)" ;;
		1) read -r coff coff_c coff_r _ coff_k <<<"$(run off cold.lua)" ;;
		esac
	done
	h_lease+=("$(ratio "$lea" "$mem")") h_off+=("$(ratio "$off" "$mem")") h_leaseoff+=("$(ratio "$lea" "$off")")
	h_rcpu_l+=("$lea_r") h_rcpu_o+=("$off_r") h_cpu+=("$(ratio "$off_r" "$lea_r")")
	c_leaseoff+=("$(ratio "$clea" "$coff")")
	echo "round $round"
	row route requests/s ratio "caddy µs" "redis µs" leased scripts
	row "memory, 100 hot keys" "$mem" 1.00 "$mem_c" - - -
	row "redis, 100 hot keys" "$lea" "$(ratio "$lea" "$mem")" "$lea_c" "$lea_r" "$lea_s" "$lea_k"
	row "redis lease off, 100 hot keys" "$off" "$(ratio "$off" "$mem")" "$off_c" "$off_r" "$off_s" "$off_k"
	row "redis, 10,000 cold keys" "$clea" "$(ratio "$clea" "$coff")" "$clea_c" "$clea_r" "$clea_s" "$clea_k"
	row "redis lease off, 10,000 cold" "$coff" 1.00 "$coff_c" "$coff_r" - "$coff_k"
done
echo "medians over $rounds round(s):"
echo "  hot, redis (leases) / memory:      $(median "${h_lease[@]}")"
echo "  hot, redis lease off / memory:     $(median "${h_off[@]}")"
echo "  hot, redis (leases) / lease off:   $(median "${h_leaseoff[@]}")"
echo "  hot, Redis CPU a request: leases $(median "${h_rcpu_l[@]}") µs, lease off $(median "${h_rcpu_o[@]}") µs: $(median "${h_cpu[@]}")x less"
echo "  cold, redis (leases) / lease off:  $(median "${c_leaseoff[@]}")"
