# bench_redis_server.sh is sourced by this directory's benchmark scripts:
# it checks that redis-server, redis-cli and redis-benchmark are installed,
# starts a redis-server of its own on a random free loopback port (never an
# existing one) with its files in a new temporary directory, and sets dir,
# pid and port; on exit the server is stopped and the directory removed.
# load_library loads a function library built from Lua files as the Go
# store builds its own.
for bin in redis-server redis-cli redis-benchmark; do
	command -v "$bin" >/dev/null || { echo "$bin not installed: apt-get install redis-server" >&2; exit 1; }
done

dir=$(mktemp -d)
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
}
trap cleanup EXIT

# Start on a random free port, checking that the server that answers is the
# one started here.
for attempt in 1 2 3 4 5 6 7 8 9 10; do
	port=$((20000 + RANDOM % 20000))
	redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
		--daemonize no --protected-mode no --logfile "$dir/redis.log" &
	pid=$!
	for _ in $(seq 50); do
		if ! kill -0 "$pid" 2>/dev/null; then break; fi
		if [ "$(redis-cli -p "$port" INFO server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')" = "$pid" ]; then
			break 2
		fi
		sleep 0.1
	done
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	pid=
done
[ -n "$pid" ] || { echo "could not start redis-server" >&2; exit 1; }

# load_library name dir: loads, as library name, the Lua files of dir as the
# Go store builds its library (common.lua without its replicate_commands
# call, every algorithm's file, single.lua's and batch.lua's main parts as
# the bodies of functions name_single and name_batch). It fails on a server
# without functions (before Redis 7).
load_library() {
	local name=$1 src=$2
	redis-cli -p "$port" FUNCTION LOAD REPLACE "#!lua name=$name
$(sed '/^if redis.replicate_commands then$/,/^end$/d' "$src/common.lua")
$(cd "$src" && cat $bench_algorithms)
redis.register_function('${name}_single', function(KEYS, ARGV)
$(cat "$src/single.lua")
end)
redis.register_function('${name}_batch', function(KEYS, ARGV)
$(cat "$src/batch.lua")
end)" >/dev/null 2>&1
}

# bench_algorithms is every algorithm's file, as scripts.go's allAlgorithmsLua.
bench_algorithms="bucket.lua gcra.lua fixed_window.lua sliding_window.lua sliding_log.lua concurrency.lua ban.lua"
