# bench_redis_server.sh is sourced by this directory's benchmark scripts:
# it checks that redis-server, redis-cli and redis-benchmark are installed,
# starts a redis-server of its own on a random free loopback port (never an
# existing one) with its files in a new temporary directory, and sets dir,
# pid and port; on exit the server is stopped and the directory removed.
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
