package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// redisSite is a site whose zones keep their state in the Redis at addr,
// with a decision timeout (testTimeout) that a loaded machine does not
// reach: a timed-out decision follows on_storage_error, which is not what
// these tests look at.
func redisSite(addr, zones string) string {
	return redisSiteWithTimeout(addr, testTimeout, zones)
}

// testTimeout is the Redis decision timeout of the tests that assert exact
// decisions. The default (100ms) is reached on a shared CI machine under
// load, and a decision that times out is decided by on_storage_error
// (local, by default: this instance's local copy of the shared state, which
// does not know what other instances took since its last decision).
const testTimeout = "10s"

// redisSiteWithTimeout is redisSite with the given decision timeout.
func redisSiteWithTimeout(addr, timeout, zones string) string {
	return globalOptions + `
	localhost:9080 {
		rate_limit {
` + zones + `
			storage redis {
				addresses ` + addr + `
				timeout ` + timeout + `
			}
		}
		respond "ok"
	}`
}

func TestRedisStorageSharesStateAcrossHandlers(t *testing.T) {
	srv := redistest.Start(t)
	// Two routes, two handlers, one zone name and one Redis: one limit, as
	// two Caddy instances behind a load balancer would share it.
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		route /a {
			rate_limit {
				zone shared {
					key {http.request.header.X-Client}
					rate 4/h
				}
				storage redis {
					addresses `+srv.Addr+`
					timeout `+testTimeout+`
				}
			}
			respond "a"
		}
		route /b {
			rate_limit {
				zone shared {
					key {http.request.header.X-Client}
					rate 4/h
				}
				storage redis {
					addresses `+srv.Addr+`
					pool_size 4
					timeout `+testTimeout+`
				}
			}
			respond "b"
		}
	}`, "caddyfile")
	if got, want := statuses(t, tester, 6, []string{"/a", "/b"}, "X-Client: shared"), "200 200 200 200 429 429 "; got != want {
		t.Fatalf("statuses %q, want %q: the two handlers must share one limit", got, want)
	}
	keys, err := srv.Client().Keys(context.Background(), "tollgate:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("redis keys %v (%v), want one tollgate: key", keys, err)
	}
	ttl := srv.Client().PTTL(context.Background(), keys[0]).Val()
	if ttl <= 0 || ttl > time.Hour {
		t.Errorf("PTTL %s = %s, want a TTL of at most the refill time (1h)", keys[0], ttl)
	}
}

func TestRedisOnStorageError(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSite(srv.Addr, `
			zone fail_open {
				match {
					path /allow
				}
				key {http.request.header.X-Client}
				rate 2/h
				on_storage_error allow
			}
			zone by_default {
				match {
					path /default
				}
				key {http.request.header.X-Client}
				rate 2/h
			}
			zone fail_closed {
				match {
					path /deny
				}
				key {http.request.header.X-Client}
				rate 2/h
				on_storage_error deny
			}
			zone fail_local {
				match {
					path /local
				}
				key {http.request.header.X-Client}
				rate 2/h
				on_storage_error local
			}`), "caddyfile")

	// Healthy: Redis decides.
	resp, _ := get(t, tester, "/allow", "X-Client: up")
	check(t, "healthy", resp, "", want{200, map[string]string{"RateLimit": `"fail_open";r=1;t=1800`}, ""})

	srv.Stop()
	for i := 0; i < 4; i++ {
		// allow: fail open, the zone does not apply (no headers for it).
		resp, body := get(t, tester, "/allow", "X-Client: down")
		check(t, fmt.Sprintf("allow %d", i), resp, body, want{200, map[string]string{"RateLimit": ""}, "ok"})
		// deny: 503 with Retry-After: 1.
		resp, _ = get(t, tester, "/deny", "X-Client: down")
		check(t, fmt.Sprintf("deny %d", i), resp, "", want{503, map[string]string{"Retry-After": "1"}, ""})
	}
	// local: the zone is enforced from this instance's memory.
	if got, want := statuses(t, tester, 3, []string{"/local"}, "X-Client: down"), "200 200 429 "; got != want {
		t.Fatalf("local while Redis is down: %q, want %q", got, want)
	}
	// local is the default.
	if got, want := statuses(t, tester, 3, []string{"/default"}, "X-Client: down"), "200 200 429 "; got != want {
		t.Fatalf("no on_storage_error while Redis is down: %q, want %q (local)", got, want)
	}

	// Redis comes back (empty: no persistence): decisions go back to it.
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, _ := get(t, tester, "/local", "X-Client: back")
		n, _ := srv.Client().DBSize(context.Background()).Result()
		if resp.StatusCode == 200 && n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after restart: status %d, %d keys in Redis; want decisions back on Redis", resp.StatusCode, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRedisSlowOrHungIsBoundedByTimeout(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSiteWithTimeout(srv.Addr, "100ms", `
			zone hung {
				key {http.request.header.X-Client}
				rate 100/h
				on_storage_error local
			}`), "caddyfile")
	get(t, tester, "/", "X-Client: warm") // connect

	before := runtime.NumGoroutine()
	srv.Pause() // SIGSTOP: connections stay open, nothing answers
	var wg sync.WaitGroup
	var worst atomic.Int64
	var errs atomic.Int64
	for c := 0; c < 16; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				start := time.Now()
				req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
				req.Header.Set("X-Client", "hung")
				resp, err := tester.Client.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				resp.Body.Close()
				if resp.StatusCode >= 500 {
					errs.Add(1)
				}
				el := int64(time.Since(start))
				for {
					w := worst.Load()
					if el <= w || worst.CompareAndSwap(w, el) {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	srv.Resume()
	if n := errs.Load(); n != 0 {
		t.Errorf("%d requests failed or got a 5xx while Redis hung, want none", n)
	}
	// The timeout is 100ms; a request waits for at most one. The bound here
	// is loose on purpose (shared CI machines): it catches a request that
	// waits for Redis instead of the timeout, not a slow machine.
	if w := time.Duration(worst.Load()); w > 3*time.Second {
		t.Errorf("slowest request while Redis hung took %s, want it bounded by the 100ms timeout", w)
	}
	// Nothing leaks: the connections stay within the pool, and the
	// goroutines come back down once Redis answers.
	redisClients.Range(func(_, v any) bool {
		st := v.(*shared.Pool).Client().PoolStats()
		if max := uint32(10 * runtime.GOMAXPROCS(0)); st.TotalConns > max {
			t.Errorf("redis connections: %d open, want at most the pool size %d", st.TotalConns, max)
		}
		return true
	})
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+10 {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d before the hang, %d after, want no leak", before, runtime.NumGoroutine())
		}
		get(t, tester, "/", "X-Client: after")
		time.Sleep(100 * time.Millisecond)
	}
}

func TestRedisValidation(t *testing.T) {
	site := func(storage string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\trate 5/s\n\t\t}\n\t\t" + storage + "\n\t}\n}\n"
	}
	for _, c := range []struct{ name, storage, want string }{
		{"url and addresses", "storage redis {\n url redis://localhost:1/0\n addresses localhost:2\n}", "url and addresses: give one or the other"},
		{"bad url keeps password secret", "storage redis {\n url http://user:hunter2@localhost:1/0\n}", `url "http://user:xxxxx@localhost:1/0"`},
		{"bad address", "storage redis {\n addresses localhost\n}", `addresses: want host:port, got "localhost"`},
		{"negative db", "storage redis {\n db -1\n}", "db: must not be negative, got -1"},
		{"cluster db", "storage redis {\n addresses a:1 b:2\n db 3\n}", "db: a Redis Cluster has only database 0, got 3"},
		{"negative timeout", "storage redis {\n timeout -1s\n}", "timeout: must not be negative"},
		{"unknown option", "storage redis {\n flavour x\n}", "storage redis: unrecognized subdirective 'flavour'"},
		{"option twice", "storage redis {\n db 1\n db 2\n}", "storage redis: option 'db' given twice"},
		{"bad pipeline", "storage redis {\n pipeline maybe\n}", "storage redis: pipeline: must be on or off, got 'maybe'"},
		{"bad functions", "storage redis {\n functions eval\n}", "storage redis: functions: must be on or off, got 'eval'"},
		{"cluster db", "storage redis {\n addresses a:1\n cluster\n db 2\n}", "db: a Redis Cluster has only database 0, got 2"},
		{"cluster with an argument", "storage redis {\n cluster yes\n}", "wrong argument count"},
		{"cluster and sentinel", "storage redis {\n addresses a:1\n cluster\n sentinel_master m\n}", "cluster and sentinel_master: a Sentinel-managed Redis is not a Cluster"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := validate(site(c.storage))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("validate = %v, want an error containing %q", err, c.want)
			}
			if strings.Contains(fmt.Sprint(err), "hunter2") {
				t.Fatalf("validate error %q reveals the password", err)
			}
		})
	}
}

// TestRedisMultiZoneOneScript: with two zones on one Redis, a request is
// decided by one script, all or nothing. On a rejection the wide zone was
// only checked, never charged, so its RateLimit item shows the quota it
// really has (r=4); deciding zone by zone would show it charged (r=3)
// before the give-back.
func TestRedisMultiZoneOneScript(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSite(srv.Addr, `
			zone multi_wide {
				key {http.request.header.X-Client}
				rate 5/h
			}
			zone multi_narrow {
				match {
					path /narrow/*
				}
				key {http.request.header.X-Client}
				rate 1/h
			}`), "caddyfile")

	resp, _ := get(t, tester, "/narrow/a", "X-Client: m")
	check(t, "first", resp, "", want{200, map[string]string{"RateLimit": `"multi_wide";r=4;t=720, "multi_narrow";r=0;t=3600`}, ""})
	for i := 0; i < 3; i++ {
		resp, _ := get(t, tester, "/narrow/a", "X-Client: m")
		if resp.StatusCode != 429 {
			t.Fatalf("narrow %d: status %d, want 429", i, resp.StatusCode)
		}
		if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, `"multi_wide";r=4;`) || !strings.Contains(got, `"multi_narrow";r=0;t=`) {
			t.Fatalf("narrow %d: RateLimit %q, want the wide zone uncharged (r=4) beside the rejecting narrow zone", i, got)
		}
	}
	resp, _ = get(t, tester, "/other", "X-Client: m")
	if got := resp.Header.Get("RateLimit"); resp.StatusCode != 200 || !strings.HasPrefix(got, `"multi_wide";r=3;`) {
		t.Fatalf("wide after rejections: %d %q, want 200 with r=3 (the rejected requests charged nothing)", resp.StatusCode, got)
	}
	// Redis down: each zone's on_storage_error (local, the default)
	// applies: both zones are decided together on this instance's memory,
	// which starts afresh.
	// (A fresh client: m's rejection is in the deny cache for a second,
	// which answers it whether Redis is up or not.)
	srv.Stop()
	resp, _ = get(t, tester, "/narrow/a", "X-Client: m2")
	check(t, "redis down", resp, "", want{200, map[string]string{"RateLimit": `"multi_wide";r=4;t=720, "multi_narrow";r=0;t=3600`}, ""})
	resp, _ = get(t, tester, "/narrow/a", "X-Client: m2")
	check(t, "redis down, narrow spent", resp, "", want{429, map[string]string{"RateLimit": `"multi_wide";r=4;t=720, "multi_narrow";r=0;t=3600`, "Retry-After": "3600"}, ""})
}

// TestRedisDenyOutageLogsOnce: with on_storage_error deny, an outage under
// load writes a handful of error lines (the outage, the zone's throttled
// store error), not one per 503; and handle_errors can still shape the 503.
func TestRedisDenyOutageLogsOnce(t *testing.T) {
	srv := redistest.Start(t)
	opts, logFile := loggingTo(t)
	site := func(errors string) string {
		return opts + `
	localhost:9080 {
		rate_limit {
			zone closed {
				key {http.request.header.X-Client}
				rate 100/s
				on_storage_error deny
			}
			storage redis {
				addresses ` + srv.Addr + `
				timeout ` + testTimeout + `
			}
		}
		respond "ok"
		` + errors + `
	}`
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(site(""), "caddyfile")
	resp, _ := get(t, tester, "/", "X-Client: a")
	check(t, "healthy", resp, "", want{200, nil, ""})

	srv.Stop()
	for i := 0; i < 300; i++ {
		resp, _ := get(t, tester, "/", "X-Client: a")
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("request %d while Redis is down: status %d, Retry-After %q; want 503 and 1", i, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	raw, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var errorLines []string
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, `"level":"error"`) {
			errorLines = append(errorLines, line)
		}
	}
	// The outage (once per client) and the zone's store error (once per
	// zone per 10s): a few lines, whatever the load.
	if len(errorLines) > 3 {
		t.Fatalf("300 requests during an outage logged %d error lines, want at most 3; first: %s", len(errorLines), errorLines[0])
	}

	tester.InitServer(site(`handle_errors 503 {
			respond "store down: {err.status_code}" 503
		}`), "caddyfile")
	resp, body := get(t, tester, "/", "X-Client: a")
	check(t, "handle_errors", resp, body, want{503, map[string]string{"Retry-After": "1"}, "store down: 503"})
}

// TestRedisFunctionsRefusedWarnsOnce: a Redis whose ACL denies FUNCTION
// LOAD gets one warning in the log, and every decision by EVALSHA, exact
// as ever.
func TestRedisFunctionsRefusedWarnsOnce(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	srv.AddUser("noload", "pw", "-function|load")
	opts, logFile := loggingTo(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(opts+`
	localhost:9080 {
		rate_limit {
			zone refused {
				key {http.request.header.X-Client}
				rate 5/h
			}
			storage redis {
				addresses `+srv.Addr+`
				username noload
				password pw
			}
		}
		respond "ok"
	}`, "caddyfile")
	for i := range 8 {
		resp, _ := get(t, tester, "/", "X-Client: a")
		if want := map[bool]int{true: 200, false: 429}[i < 5]; resp.StatusCode != want {
			t.Fatalf("request %d: status %d, want %d", i, resp.StatusCode, want)
		}
		time.Sleep(20 * time.Millisecond) // time for the load to be refused
	}
	raw, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), "refused Tollgate's function library"); n != 1 || !strings.Contains(string(raw), "NOPERM") {
		t.Errorf("%d warnings of the refusal (want 1, with NOPERM) in:\n%s", n, raw)
	}
	if n := redistest.Calls(t, admin, "fcall"); n != 0 {
		t.Errorf("%d FCALLs on a Redis that refused the library", n)
	}
}
