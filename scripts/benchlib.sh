# benchlib.sh is sourced by the benchmark scripts: a temporary directory,
# $dir, removed on exit with every process whose pid is in pids, and two
# helpers.

dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT

# freeport prints a free TCP port on the loopback.
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# cpu prints a process's CPU time (user + system) in clock ticks.
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# waitport waits up to 10s for an HTTP answer on a loopback port.
waitport() {
	for _ in $(seq 100); do curl -s "http://127.0.0.1:$1/" >/dev/null 2>&1 && return; sleep 0.1; done
}

# writekeys writes $dir/keys.lua, for wrk: each request carries X-Key, one
# of n keys at random.
writekeys() {
	cat >"$dir/keys.lua" <<EOF
request = function()
	wrk.headers["X-Key"] = "client-" .. math.random($1)
	return wrk.format(nil)
end
EOF
}
