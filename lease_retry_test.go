package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// TestLeaseRetryAfterThroughCaddy: three Caddy instances on one Redis
// (leasedInstances, with jitter 1) and a fixed_window key of 1,000 an
// hour. A burst on instance 1 makes the key hot there: it takes a lease
// and, the burst over, holds what is left of it until its sweep returns
// it. Meanwhile instance 2 is sent a request of one event more than the
// key has left on Redis: refused, and, as the lease holds that event, its
// Retry-After, and RateLimit's t, are at most the time until the lease is
// back (its back on Redis, read before the request) spread by the jitter,
// ceil(wait × 2): 1 or 2 s, where the window's end, the answer without
// the lease, is most of an hour away. Each try reads the
// key's state on Redis before and after the request, and counts only
// those it saw unchanged with a lease out for the whole request.
func TestLeaseRetryAfterThroughCaddy(t *testing.T) {
	const n = 1000
	srv := redistest.Start(t)
	c := srv.Client()
	tester := caddytest.NewTester(t)
	cfg := strings.ReplaceAll(leasedInstances(srv.Addr, fmt.Sprintf("algorithm fixed_window\n\t\t\t\tevents %d\n\t\t\t\twindow 1h\n\t\t\t\tcost {http.request.header.X-Cost}", n)),
		"\t\t\tstorage redis {", "\t\t\tjitter 1\n\t\t\tstorage redis {")
	tester.InitServer(cfg, "caddyfile")
	store := redisstore.New(c, redisstore.DefaultPrefix)
	hour := func() int64 { return time.Now().Unix() / 3600 }
	start := hour()

	ctx := context.Background()
	send := func(port int, key string, cost int64) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://localhost:%d/", port), nil)
		req.Header.Set("X-Client", key)
		req.Header.Set("X-Cost", strconv.FormatInt(cost, 10))
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	// state reads the key's count (events), its leases' back and leased
	// (see storage/redis/common.lua) and Redis's clock.
	type state struct{ level, back, leased int64 }
	read := func(rkey string) (state, int64) {
		t.Helper()
		v, err := c.HMGet(ctx, rkey, "level", "back", "leased").Result()
		if err != nil {
			t.Fatal(err)
		}
		var st state
		for i, p := range []*int64{&st.level, &st.back, &st.leased} {
			if s, ok := v[i].(string); ok {
				*p, _ = strconv.ParseInt(s, 10, 64)
			}
		}
		st.level /= algorithms.Milli
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return st, tm.UnixMicro()
	}

	leased, tries := 0, 0
	for ; leased < 3 && tries < 40; tries++ {
		key := fmt.Sprintf("retry-%d", tries)
		rkey := store.Key("leased", algorithms.FixedWindow, key)
		for range 20 { // hot at 8 requests in 250 ms, noted first
			send(9081, key, 1)
		}
		before, t0 := read(rkey)
		if before.back == 0 || before.leased == 0 {
			continue // no lease taken (a slow machine: not hot)
		}
		resp := send(9082, key, n-before.level+1)
		after, t1 := read(rkey)
		if resp.StatusCode != http.StatusTooManyRequests || after != before || after.back <= t1 {
			continue // the lease came back, or may have, meanwhile
		}
		leased++
		ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
		if err != nil {
			t.Fatalf("try %d: Retry-After %q: %v", tries, resp.Header.Get("Retry-After"), err)
		}
		// jitter 1: ceil(wait × (1 + u)), u < 1, wait at most back - t0.
		if bound := (2*(after.back-t0) + 999_999) / 1_000_000; ra > bound {
			t.Errorf("try %d: a request of one event more than the key had left (%d), refused while %d were leased out until %dµs after it: Retry-After %d, want at most %d (the wait until the lease is back, spread by jitter 1)",
				tries, n-after.level, after.leased, after.back-t1, ra, bound)
		}
		if rl, want := resp.Header.Get("RateLimit"), fmt.Sprintf(";t=%d", ra); !strings.HasSuffix(rl, want) {
			t.Errorf("try %d: RateLimit %q, want its t to be Retry-After's %d", tries, rl, ra)
		}
	}
	if hour() != start {
		t.Skip("the hour ended during the test")
	}
	if leased == 0 {
		t.Fatalf("no try of %d was refused while a lease was out on the key, unchanged: the test tests nothing", tries)
	}
	t.Logf("%d tries, %d refused while a lease was out", tries, leased)
}
