#!/usr/bin/env bash
# bench_lua_cpu.sh measures what the function library costs Redis: its CPU
# time (INFO cpu, user + system) per token-bucket decision, made one per
# FCALL of the single function and twelve per FCALL of the batch function
# (about what a pipeline carries under load, see batch.go), each over
# 10,000 keys whose state has expired by their next decision (100 a
# second: a state lasts 10 ms; scripts/bench_http.sh's zones are the same
# in that) and over keys that last (1 a minute, a burst of 10). It starts its own redis-server on a free
# loopback port (never an existing one), and loads the library as the Go
# store builds it (common.lua without its replicate_commands call, every
# algorithm's file, single.lua's and batch.lua's main parts as the bodies
# of two functions).
#
# With a git revision, it also loads that revision's library under another
# name and runs both in turn, round after round, so that before and after
# are measured side by side on the same server; it prints every round and
# the medians.
#
# Usage: storage/redis/bench_lua_cpu.sh [rounds, default 5] [git revision to compare with]
# Needs redis-server 7 or later and redis-benchmark (apt-get install redis-server).
set -euo pipefail

rounds=${1:-5}
rev=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench_redis_server.sh
. "$here/bench_redis_server.sh" # sets dir, pid and port, and cleans up on exit

# load name dir: loads the library of dir's Lua files as name.
load() {
	load_library "$1" "$2" || { echo "FUNCTION LOAD of $2 failed (Redis 7 or later has functions)" >&2; exit 1; }
}
# The batch function's ARGV: since profiles (see batch.lua), a decision's
# op, x and profile number, then the profiles; before, each decision's 11
# ARGV as single.lua takes them.
declare -A profiles
libs=(now)
load now "$here"
profiles[now]=$(grep -c 'profile' "$here/batch.lua" || true)
if [ -n "$rev" ]; then
	mkdir "$dir/before"
	for f in common.lua single.lua batch.lua $bench_algorithms; do
		git -C "$here" show "$rev:storage/redis/$f" >"$dir/before/$f"
	done
	load before "$dir/before"
	profiles[before]=$(grep -c 'profile' "$dir/before/batch.lua" || true)
	libs=(before now)
fi

# ARGV of one decision as the store passes them (see single.lua): op, now
# (-1: the server's clock), TTL slack, inc(cost), ta, tr, the algorithm's
# code and its constants (token bucket: Tau, Unit, max delay, scale).
fresh=(t -1 0 10000 0 0 tb 1000000 10000 0 1)           # 100/s: a key lasts 10 ms
lasting=(t -1 0 60000000 0 0 tb 600000000 60000000 0 1) # 1/min, burst 10: a key lasts minutes
n=20000 # calls per measurement

cpu() { redis-cli -p "$port" INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
# measure lib decisions-per-call keys-kind: prints Redis's CPU µs per decision.
measure() {
	local lib=$1 per=$2 kind=$3 keys=() args=() fn c0 c1
	local -n a=$kind
	for _ in $(seq "$per"); do
		keys+=("tollgate:{19:client-__rand_int__}5:$lib-$kind:tb")
		if [ "$per" -gt 1 ] && [ "${profiles[$lib]}" -gt 0 ]; then
			args+=("${a[0]}" "${a[3]}" 1)
		else
			args+=("${a[@]}")
		fi
	done
	if [ "$per" -gt 1 ] && [ "${profiles[$lib]}" -gt 0 ]; then
		args+=("${a[1]}" "${a[2]}" "${a[4]}" "${a[5]}" "${a[@]:6}")
	fi
	fn=${lib}_batch
	[ "$per" = 1 ] && fn=${lib}_single
	# One call first: a reply that is an error stops the run (redis-benchmark
	# would count errors as calls).
	if redis-cli -p "$port" FCALL "$fn" "$per" "${keys[@]//__rand_int__/000000000000}" "${args[@]}" | grep -q -i err; then
		echo "FCALL $fn fails:" >&2
		redis-cli -p "$port" FCALL "$fn" "$per" "${keys[@]//__rand_int__/000000000000}" "${args[@]}" >&2
		exit 1
	fi
	c0=$(cpu)
	redis-benchmark -p "$port" -c 8 -n "$n" -r 10000 -q FCALL "$fn" "$per" "${keys[@]}" "${args[@]}" >/dev/null
	c1=$(cpu)
	python3 -c "print(f'{($c1 - $c0) * 1e6 / ($n * $per):.2f}')"
}

echo "redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on 127.0.0.1:$port; Redis CPU µs per decision, $n calls a measurement"
cases=("1 fresh" "12 fresh" "1 lasting" "12 lasting")
declare -A all
for r in $(seq "$rounds"); do
	line="round $r:"
	for c in "${cases[@]}"; do
		for lib in "${libs[@]}"; do
			v=$(measure "$lib" $c)
			all["$lib $c"]+=" $v"
			line+=" $lib/${c// /\/} $v"
		done
	done
	echo "$line"
done
echo "medians:"
for c in "${cases[@]}"; do
	line="  $(printf '%-2s decision(s) a call, %-7s keys:' $c)"
	for lib in "${libs[@]}"; do
		line+=" $lib $(python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.2f}')" ${all["$lib $c"]})"
	done
	echo "$line"
done
