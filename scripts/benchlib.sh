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

# The Caddyfiles: the global options (admin on port $1, no HTTPS, no
# logs), then a site a route. Each route is a site of its own, on its own
# port: Caddy tries a site's routes in turn (the Caddyfile sorts them by
# path length), so routes in one site would not cost the same to reach,
# and that difference (about 1% of a request here, for four routes) would
# count for or against a route.
globals() {
	printf '{\n\tadmin localhost:%s\n\tauto_https off\n\tlog {\n\t\toutput discard\n\t}\n}\n' "$1"
}

# site prints a site on port $1: the handlers $2, then respond "ok".
site() {
	printf 'http://:%s {\n%s\n\trespond "ok"\n}\n' "$1" "$2"
}

# zone prints a rate_limit handler with zone $1 keyed by X-Key: lines $2
# in the zone, then lines $3 (optional) after it.
zone() {
	printf '\trate_limit {\n\t\tzone %s {\n\t\t\tkey {http.request.header.X-Key}\n%s\n\t\t}\n%s\n\t}' "$1" "$2" "${3:-}"
}
