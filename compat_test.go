package tollgate

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// closedPort returns a local address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestRedisUnreachableAtStartIsAWarning: a Redis that cannot be reached
// when the config loads does not fail the start; it is logged once at
// warning level, naming each zone and what its on_storage_error does, and
// the zones then follow on_storage_error. A Redis that answers logs
// nothing.
func TestRedisUnreachableAtStartIsAWarning(t *testing.T) {
	const msg = "redis storage unreachable at start: each zone's on_storage_error applies until it answers"
	up := redistest.Start(t)
	for _, c := range []struct {
		name, addr string
		warned     bool
	}{
		{"unreachable", closedPort(t), true},
		{"reachable", up.Addr, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts, logFile := loggingTo(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(opts+`
	localhost:9080 {
		rate_limit {
			zone start_local {
				key {http.request.header.X-Client}
				rate 1/h
			}
			zone start_deny {
				match {
					path /deny
				}
				rate 1/h
				on_storage_error deny
			}
			storage redis {
				addresses `+c.addr+`
				key_prefix `+strings.ReplaceAll(t.Name(), "/", "_")+`:
			}
		}
		respond "ok"
	}`, "caddyfile")

			var warnings []map[string]any
			for _, l := range logLines(t, logFile, "http.handlers.rate_limit") {
				if l["msg"] == msg {
					warnings = append(warnings, l)
				}
			}
			if !c.warned {
				if len(warnings) != 0 {
					t.Fatalf("warned %v, want no warning: Redis answers", warnings)
				}
				return
			}
			if len(warnings) != 1 {
				t.Fatalf("%d warnings %q, want 1", len(warnings), msg)
			}
			w := warnings[0]
			if w["level"] != "warn" {
				t.Errorf("level %v, want warn", w["level"])
			}
			if e, _ := w["error"].(string); !strings.Contains(e, "refused") {
				t.Errorf("error %q, want the connection refused", e)
			}
			var zones []string
			for _, z := range w["zones"].([]any) {
				zones = append(zones, z.(string))
			}
			wantZones := []string{
				"start_local: on_storage_error local: the limit is enforced from this instance's memory",
				"start_deny: on_storage_error deny: every request gets a 503 with Retry-After: 1",
			}
			if !slices.Equal(zones, wantZones) {
				t.Errorf("zones %q, want %q", zones, wantZones)
			}
			// The zones follow on_storage_error: local enforces the limit
			// from memory; deny answers 503.
			for i, s := range []struct {
				path, client string
				status       int
			}{{"/", "a", 200}, {"/", "a", 429}, {"/", "b", 200}, {"/deny", "c", 503}} {
				resp, _ := get(t, tester, s.path, "X-Client: "+s.client)
				if resp.StatusCode != s.status {
					t.Errorf("request %d: GET %s as %s: status %d, want %d", i, s.path, s.client, resp.StatusCode, s.status)
				}
			}
		})
	}
}

// TestDisableMetrics: disable_metrics keeps a handler's zones out of
// Caddy's metrics while another handler's zones are counted.
func TestDisableMetrics(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(withGlobal("metrics")+`
	localhost:9080 {
		route /off {
			rate_limit {
				zone dm_off {
					rate 2/h
				}
				disable_metrics
			}
		}
		route /on {
			rate_limit {
				zone dm_on {
					rate 2/h
				}
			}
		}
		respond "ok"
	}`, "caddyfile")
	advance(time.Hour)
	for _, path := range []string{"/off", "/off", "/off", "/on"} {
		get(t, tester, path)
	}
	got := scrape(t)
	checkSeries(t, "after 3 requests to /off and 1 to /on", got, map[string]float64{
		requests("dm_on", "allowed"):                1,
		requests("dm_off", "allowed"):               -1,
		requests("dm_off", "rejected"):              -1,
		`caddy_http_rate_limit_keys{zone="dm_off"}`: -1,
		`caddy_http_rate_limit_keys{zone="dm_on"}`:  1,
	})
}

// TestSeveralMatchBlocks: a zone with several match blocks applies to a
// request that any of them matches, as in mholt/caddy-ratelimit.
func TestSeveralMatchBlocks(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone several_match {
				match {
					path /a
				}
				match {
					header X-Limit yes
				}
				key static
				rate 1/h
			}
		}
		respond "ok"
	}`, "caddyfile")
	advance(time.Hour)
	for i, s := range []struct {
		path, header string
		status       int
	}{
		{"/a", "X-Other: 1", 200},
		{"/a", "X-Other: 1", 429},   // the first match block
		{"/b", "X-Limit: yes", 429}, // the second one: the same zone and key
		{"/b", "X-Limit: no", 200},  // neither
		{"/b", "X-Limit: no", 200},
	} {
		resp, _ := get(t, tester, s.path, s.header)
		if resp.StatusCode != s.status {
			t.Errorf("request %d: GET %s with %s: status %d, want %d", i, s.path, s.header, resp.StatusCode, s.status)
		}
	}
}

// TestRedisPingedOncePerConfigLoad: the PING at start is one per Redis
// client and config load, whatever the number of handlers that use it.
// Each used to send its own, in turn: against a Redis that does not
// answer (a network that drops packets, a host that is down), a config of
// many sites took a PING timeout per site to load, one second each.
func TestRedisPingedOncePerConfigLoad(t *testing.T) {
	const msg = "redis storage unreachable at start: each zone's on_storage_error applies until it answers"
	// A Redis that takes connections and never answers: each PING ends
	// at its timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()

	const sites = 4
	var cfg strings.Builder
	for i := range sites {
		fmt.Fprintf(&cfg, `
	localhost:%d {
		rate_limit {
			zone site%d {
				rate 1/h
			}
			storage redis {
				addresses %s
				timeout 50ms
			}
		}
		respond "ok"
	}`, 9080+i, i, ln.Addr())
	}
	opts, logFile := loggingTo(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(opts+cfg.String(), "caddyfile")
	dialed := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
	if n := dialed(); n != 1 {
		t.Errorf("Redis was dialed %d times while %d handlers loaded, want once", n, sites)
	}
	// A later load checks again: Redis may answer by then.
	tester.InitServer(opts+strings.ReplaceAll(cfg.String(), `"ok"`, `"reloaded"`), "caddyfile")
	if n := dialed(); n != 2 {
		t.Errorf("Redis was dialed %d times after a second config load, want twice", n)
	}
	// Each handler still warns, naming its own zones, at each load.
	var zones []string
	for _, l := range logLines(t, logFile, "http.handlers.rate_limit") {
		if l["msg"] == msg {
			for _, z := range l["zones"].([]any) {
				zones = append(zones, strings.SplitN(z.(string), ":", 2)[0])
			}
		}
	}
	slices.Sort(zones)
	if want := []string{"site0", "site0", "site1", "site1", "site2", "site2", "site3", "site3"}; !slices.Equal(zones, want) {
		t.Errorf("warnings name zones %q, want %q", zones, want)
	}
}
