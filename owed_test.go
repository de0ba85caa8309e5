package tollgate

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// owedSite is a zone of 2 failed logins an hour (count_response status
// 401) on Redis at addr with the given timeout, and zone options extra.
func owedSite(up, addr, timeout, extra string) string {
	return globalOptions + `
	localhost:9080 {
		rate_limit {
			zone owed {
				key {http.request.header.X-Client}
				rate 2/h
				count_response status 401
				` + extra + `
			}
			storage redis {
				addresses ` + addr + `
				timeout ` + timeout + `
			}
		}
		reverse_proxy ` + up + `
	}`
}

// bothFree reports, for waitFor, whether zone owed has both events of
// client's key free, as the admin API shows it: a fresh state, which Redis
// need not hold, or one with 2 remaining.
func bothFree(client string) func() bool {
	return func() bool {
		resp, err := http.Get(adminBase + "/rate_limit/zones/owed/keys/" + client)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 404 || strings.Contains(string(body), `"remaining":2,`)
	}
}

// holdLogins starts n successful logins for client, which the upstream
// holds until it is released, and waits until all have reached it (each
// reserved its event). The returned wait returns once all have ended,
// failing the test unless each got a 200.
func holdLogins(t *testing.T, tester *caddytest.Tester, up *loginUpstream, client string, n int) (wait func()) {
	t.Helper()
	before := up.reached.Load()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, base+"/login", nil)
			req.Header.Set("X-Client", client)
			resp, err := tester.Client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("held login: status %d, want 200", resp.StatusCode)
			}
		}()
	}
	waitFor(t, "the held logins to reach the upstream", func() bool { return up.reached.Load()-before == int64(n) })
	return func() {
		t.Helper()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}

// TestReloadKeepsSettlementsInFlight: two successful logins reserve both
// events of a key and are held; a reload changes the Redis timeout (a new
// client, the old one retired) while they run. Once they end (200: not
// counted), their reservations are given back on Redis: the next two
// logins get 200 200. Before, the retired client was closed at once and
// both give-backs failed with "redis: client is closed": 429 429.
func TestReloadKeepsSettlementsInFlight(t *testing.T) {
	srv := redistest.Start(t)
	up := newLoginUpstream(t, true)
	tester := caddytest.NewTester(t)
	extra := "on_storage_error deny"
	tester.InitServer(owedSite(up.addr(), srv.Addr, testTimeout, extra), "caddyfile")
	old := liveRedisClient(t)
	wait := holdLogins(t, tester, up, "reload", 2)
	reload(t, owedSite(up.addr(), srv.Addr, "9s", extra))
	if liveRedisClient(t) == old {
		t.Fatal("the reload kept the client: the test changes nothing")
	}
	close(up.release) // and every login after
	wait()
	if got, want := statuses(t, tester, 2, []string{"/login"}, "X-Client: reload"), "200 200 "; got != want {
		t.Fatalf("after the held logins ended: %q, want %q (both given back on Redis)", got, want)
	}
	waitFor(t, "the retired client closed once its settlements were made", func() bool {
		return old.Client().Ping(t.Context()).Err() != nil
	})
}

// TestSettlementKeptThroughOutage: Redis (keeping its data in an
// append-only file) is killed while two successful logins hold both
// events of a key; they end while it is down. When it is back, their
// give-backs reach it: the next two logins get 200 200, and Redis says
// so. Before, a settlement that met an unreachable Redis was applied to
// the local copy only, and Redis refused the key for the rest of its
// window: 429 429.
func TestSettlementKeptThroughOutage(t *testing.T) {
	srv := redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "always")
	up := newLoginUpstream(t, true)
	tester := caddytest.NewTester(t)
	tester.InitServer(owedSite(up.addr(), srv.Addr, testTimeout, "algorithm fixed_window\n\t\t\t\ton_storage_error deny"), "caddyfile")
	pending0, applied0, _ := shared.Settlements()
	wait := holdLogins(t, tester, up, "outage", 2)
	srv.Stop()
	close(up.release) // and every login after
	wait()
	// The metrics' counts: both give-backs kept.
	if pending, _, _ := shared.Settlements(); pending-pending0 != 2 {
		t.Errorf("settlements pending: %d more, want the 2 give-backs", pending-pending0)
	}
	srv.Restart() // from its append-only file: both reservations held
	// The store's view, through the admin API: both events free again
	// once the kept give-backs reach it.
	waitFor(t, "the kept give-backs to reach Redis", bothFree("outage"))
	waitFor(t, "the kept give-backs counted as applied", func() bool {
		pending, applied, _ := shared.Settlements()
		return pending == pending0 && applied-applied0 == 2
	})
	if got, want := statuses(t, tester, 2, []string{"/login"}, "X-Client: outage"), "200 200 "; got != want {
		t.Fatalf("after Redis came back: %q, want %q", got, want)
	}
	// Each give-back was applied once: two failures count, the third is
	// refused.
	if got, want := statuses(t, tester, 3, []string{"/login"}, "X-Client: outage", "X-Password: wrong"), "401 401 429 "; got != want {
		t.Fatalf("failures after Redis came back: %q, want %q", got, want)
	}
}

// TestOwnGiveBackClearsDenyCache: a login holds the key's one event; a
// second is refused by Redis (and the refusal cached); the first ends
// with 200, given back. The next login is admitted at once. Before, the
// deny cache kept refusing the key for up to a second after this
// instance's own give-back.
func TestOwnGiveBackClearsDenyCache(t *testing.T) {
	srv := redistest.Start(t)
	up := newLoginUpstream(t, true)
	tester := caddytest.NewTester(t)
	site := owedSite(up.addr(), srv.Addr, testTimeout, "on_storage_error deny")
	tester.InitServer(strings.Replace(site, "rate 2/h", "rate 1/h", 1), "caddyfile")
	wait := holdLogins(t, tester, up, "deny", 1)
	resp, _ := get(t, tester, "/login", "X-Client: deny")
	check(t, "a second while the first holds the event", resp, "", want{status: 429})
	close(up.release)
	wait()
	resp, _ = get(t, tester, "/login", "X-Client: deny")
	check(t, "after the first was given back", resp, "", want{status: 200})
}

// holdUpstream holds each request until release is closed, then answers
// with the X-Usage its X-Actual asks for, and 401 for X-Fail.
type holdUpstream struct {
	*httptest.Server
	arrived atomic.Int64
	release chan struct{}
}

func newHoldUpstream(t *testing.T) *holdUpstream {
	u := &holdUpstream{release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.arrived.Add(1)
		select {
		case <-u.release:
		case <-r.Context().Done():
		}
		if a := r.Header.Get("X-Actual"); a != "" {
			w.Header().Set("X-Usage", a)
		}
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(http.StatusUnauthorized)
		}
		fmt.Fprint(w, "done")
	}))
	t.Cleanup(u.Close)
	return u
}

// settleSites are two instances (ports 9080 and 9081, their Redis clients
// apart: pool sizes differ) of a zone that settles a request's cost from
// X-Usage (estimate X-Est) and one that counts only 401s, 100 events an
// hour each, on Redis at addr with the given timeout.
func settleSites(up, addr, timeout string) string {
	cfg := globalOptions
	for i := range 2 {
		cfg += fmt.Sprintf(`
	http://localhost:%d {
		rate_limit {
			zone spend {
				match {
					path /cost
				}
				key {http.request.header.X-Client}
				algorithm fixed_window
				events 100
				window 1h
				cost {http.request.header.X-Est}
				cost_response {http.response.header.X-Usage}
				on_storage_error deny
			}
			zone fails {
				match {
					path /login
				}
				key {http.request.header.X-Client}
				algorithm fixed_window
				events 100
				window 1h
				count_response status 401
				on_storage_error deny
			}
			storage redis {
				addresses %s
				timeout %s
				pool_size %d
			}
		}
		reverse_proxy %s
	}`, 9080+i, addr, timeout, 4+i, strings.TrimPrefix(up, "http://"))
	}
	return cfg
}

// liveRedisClients are the Redis clients of the live handlers.
func liveRedisClients(t *testing.T) []*shared.Pool {
	t.Helper()
	live.mu.Lock()
	defer live.mu.Unlock()
	var out []*shared.Pool
	for _, h := range live.handlers {
		if h.redis != nil && h.redis.client != nil && !slices.Contains(out, h.redis.client) {
			out = append(out, h.redis.client)
		}
	}
	return out
}

// TestSettlementsReachRedisOnce: requests on two instances reserve on
// Redis (which keeps its data in an append-only file) and are held; a
// reload retires both instances' clients, then Redis is killed, then the
// requests end: their settlements (give-backs, owed excesses, logins
// that did not fail) meet no Redis, through clients no configuration
// uses. When Redis is back, every settlement reaches it exactly once:
// what the key used is the sum of the actual costs, and of the failed
// logins, and the retired clients close once they have nothing left to
// settle.
func TestSettlementsReachRedisOnce(t *testing.T) {
	srv := redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "always")
	up := newHoldUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(settleSites(up.URL, srv.Addr, testTimeout), "caddyfile")
	old := liveRedisClients(t)
	if len(old) != 2 {
		t.Fatalf("%d Redis clients, want 2 (one an instance)", len(old))
	}
	type held struct {
		port          int
		path, headers string
	}
	reqs := []held{
		{9080, "/cost", "X-Est: 5|X-Actual: 0"}, {9080, "/cost", "X-Est: 5|X-Actual: 2"}, {9080, "/cost", "X-Est: 5|X-Actual: 9"},
		{9081, "/cost", "X-Est: 5|X-Actual: 1"}, {9081, "/cost", "X-Est: 5|X-Actual: 3"}, {9081, "/cost", "X-Est: 5|X-Actual: 7"},
		{9080, "/login", "X-Fail: 1"}, {9081, "/login", "X-Fail: 1"}, {9080, "/login", ""}, {9081, "/login", ""},
	}
	var wg sync.WaitGroup
	for _, h := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://localhost:%d%s", h.port, h.path), nil)
			req.Header.Set("X-Client", "once")
			for _, kv := range strings.Split(h.headers, "|") {
				if name, value, ok := strings.Cut(kv, ":"); ok {
					req.Header.Set(name, strings.TrimSpace(value))
				}
			}
			resp, err := tester.Client.Do(req)
			if err != nil {
				t.Errorf("%s on %d: %v", h.path, h.port, err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	waitFor(t, "every request reserved and held", func() bool { return up.arrived.Load() == int64(len(reqs)) })
	reload(t, settleSites(up.URL, srv.Addr, "9s"))
	srv.Stop()
	close(up.release)
	wg.Wait()
	srv.Restart() // from its append-only file: every reservation held
	waitFor(t, "the retired clients to close once their kept settlements reached Redis", func() bool {
		for _, p := range old {
			if p.Client().Ping(t.Context()).Err() == nil {
				return false
			}
		}
		return true
	})
	for _, c := range []struct {
		zone string
		used int64
	}{{"spend", 0 + 2 + 9 + 1 + 3 + 7}, {"fails", 2}} {
		var st adminapi.KeyState
		if code := adminDo(t, http.MethodGet, "/rate_limit/zones/"+c.zone+"/keys/once", &st); code != 200 || st.Remaining != 100-c.used {
			t.Errorf("zone %s: status %d, %d remaining; want 200, %d (each settlement applied once)", c.zone, code, st.Remaining, 100-c.used)
		}
	}
	for _, p := range old {
		if n := p.Runtime().Owed.Dropped(); n != 0 {
			t.Errorf("a retired client dropped %d settlements, want 0", n)
		}
	}
}

// TestSettlementThatMayHaveRunCountedDropped: two successful logins hold
// both events of a key; Redis stalls (DEBUG SLEEP, past the zone's
// 300ms timeout) as they end, so their give-backs time out once sent.
// Such a give-back may have run (the stalled Redis runs it as it wakes):
// it is not kept, so never applied twice, and counted as dropped
// (settlements_dropped_total), as a kept one is whose later try may have
// run. Before, it was counted nowhere: neither operators nor the
// interaction test, which excuses a step by these counts, could see it.
// Redis then applies both: the next two logins get 200 200.
func TestSettlementThatMayHaveRunCountedDropped(t *testing.T) {
	srv := redistest.StartWith(t, "--enable-debug-command", "yes")
	up := newLoginUpstream(t, true)
	tester := caddytest.NewTester(t)
	tester.InitServer(owedSite(up.addr(), srv.Addr, "300ms", "algorithm fixed_window\n\t\t\t\ton_storage_error deny"), "caddyfile")
	pending0, _, dropped0 := shared.Settlements()
	wait := holdLogins(t, tester, up, "stalled", 2)
	c := srv.Client()
	defer c.Close()
	slept := make(chan error, 1)
	go func() { slept <- c.Do(t.Context(), "DEBUG", "SLEEP", "1.5").Err() }()
	time.Sleep(100 * time.Millisecond) // the stall under way
	close(up.release)
	wait()
	if err := <-slept; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	if pending, _, dropped := shared.Settlements(); pending != pending0 || dropped-dropped0 != 2 {
		t.Errorf("settlements pending %d more, dropped %d more; want 0 (not kept: they may have run), 2", pending-pending0, dropped-dropped0)
	}
	waitFor(t, "the stalled Redis to run both give-backs", bothFree("stalled"))
	if got, want := statuses(t, tester, 2, []string{"/login"}, "X-Client: stalled"), "200 200 "; got != want {
		t.Fatalf("after the stall: %q, want %q", got, want)
	}
}
