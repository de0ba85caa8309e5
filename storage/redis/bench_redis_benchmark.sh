#!/usr/bin/env bash
# bench_redis_benchmark.sh measures the token-bucket script with
# redis-benchmark, the ceiling BenchmarkRedisTake can be compared with: it
# starts its own redis-server on a free loopback port (never an existing
# one), loads common.lua + bucket.lua + single.lua (the script the Go store
# runs for token_bucket) with SCRIPT LOAD, and runs EVALSHA from 1, 16 and
# 64 clients without pipelining over 10,000 keys, with the arguments the Go
# store passes for 100 events per second; then, on Redis 7 and later, the
# same code as a function of a library built as the Go store builds its
# own (common.lua without its replicate_commands call, every algorithm's
# file, single.lua as the body of the function it calls), by FCALL.
#
# Usage: storage/redis/bench_redis_benchmark.sh [requests per run, default 100000]
set -euo pipefail

n=${1:-100000}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench_redis_server.sh
. "$here/bench_redis_server.sh" # sets dir, pid and port, and cleans up on exit

# -x sends stdin byte for byte, so that the SHA is the one the Go store uses.
sha=$(cat "$here/common.lua" "$here/bucket.lua" "$here/single.lua" | redis-cli -p "$port" -x SCRIPT LOAD)

# ARGV as the store passes them for token_bucket, 100 events per second,
# cost 1: op, now (-1: the server's clock), TTL slack, inc(cost) = Unit,
# ta and tr (for undo only), the algorithm's code, Tau, Unit, max delay,
# scale. redis-benchmark replaces __rand_int__ with 12 digits, so the
# resolved key is 19 bytes long.
key='tollgate:{19:client-__rand_int__}5:bench:tb'
args=(t -1 0 10000 0 0 tb 1000000 10000 0 1)
redis-cli -p "$port" EVALSHA "$sha" 1 "${key/__rand_int__/000000000000}" "${args[@]}" >/dev/null

echo "redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on 127.0.0.1:$port, EVALSHA $sha, $n requests per run"
bench() { # clients pipeline command...
	local c=$1 p=$2
	shift 2
	printf "%-7s clients=%-3s pipeline=%-3s " "$1" "$c" "$p"
	redis-benchmark -p "$port" -c "$c" -P "$p" -n "$n" -r 10000 -q "$@" 1 "$key" "${args[@]}" |
		tr '\r' '\n' | grep -o '[0-9.]* requests per second.*' | tail -1
}
for run in "1 1" "16 1" "64 1" "64 16"; do
	bench $run EVALSHA "$sha"
done

if ! load_library tollgate_bench "$here"; then
	echo "no functions on this server (Redis 7 has them): FCALL not measured"
	exit 0
fi
for run in "1 1" "16 1" "64 1" "64 16"; do
	bench $run FCALL tollgate_bench_single
done
