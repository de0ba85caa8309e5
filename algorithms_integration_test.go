package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/storage/memory"
)

// alignClock moves the fake clock to 10 minutes past the next whole hour,
// so that aligned windows give known waits.
func alignClock() {
	hour := int64(3600 * microsPerSecond)
	now := fakeNow.Load()
	fakeNow.Store(now - now%hour + hour + 600*microsPerSecond)
}

func TestEveryAlgorithmThroughCaddy(t *testing.T) {
	cases := []struct {
		alg        string
		retryAfter string // of the third request, 2/h having been used
		thirdT     string
	}{
		{"token_bucket", "1800", "1800"},
		{"gcra", "1800", "1800"},
		{"leaky_bucket", "1800", "1800"},
		{"sliding_log", "3600", "3600"},
		// At 10 min into the window: the next window starts in 50 min.
		{"fixed_window", "3000", "3000"},
		// Next window in 50 min, then this window's 2 events weigh
		// 2 × (1 − e/W) events, exactly, and one more fits once that is
		// <= 1: at e = 30 min. 50 min + 30 min.
		{"sliding_window", "4800", "4800"},
	}
	config := globalOptions + `
	localhost:9080 {`
	for _, c := range cases {
		config += fmt.Sprintf(`
		handle /%[1]s {
			rate_limit {
				zone %[1]s {
					key {http.request.header.X-Client}
					algorithm %[1]s
					rate 2/h
				}
			}
			respond "ok"
		}`, c.alg)
	}
	config += "\n\t}"
	tester := caddytest.NewTester(t)
	tester.InitServer(config, "caddyfile")
	alignClock()
	for _, c := range cases {
		t.Run(c.alg, func(t *testing.T) {
			for i, w := range []want{
				{200, map[string]string{"RateLimit-Policy": fmt.Sprintf(`"%s";q=2;w=3600`, c.alg)}, "ok"},
				{200, map[string]string{"Retry-After": ""}, "ok"},
				{429, map[string]string{"Retry-After": c.retryAfter, "RateLimit": fmt.Sprintf(`"%s";r=0;t=%s`, c.alg, c.thirdT)}, ""},
			} {
				resp, body := get(t, tester, "/"+c.alg, "X-Client: alg")
				check(t, fmt.Sprintf("%s step %d", c.alg, i), resp, body, w)
			}
		})
	}
}

func TestCostFromHeaderAndQuery(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		handle /header {
			rate_limit {
				zone by_header {
					key {http.request.header.X-Client}
					rate 10/h
					cost {http.request.header.X-Weight}
					default_cost 1
				}
			}
			respond "ok"
		}
		handle /query {
			rate_limit {
				zone by_query {
					key {http.request.header.X-Client}
					rate 10/h
					cost {http.request.uri.query.weight}
					default_cost 2
				}
			}
			respond "ok"
		}
	}`, "caddyfile")

	steps := []struct {
		path, weight string
		status       int
		ratelimit    string
		retryAfter   string
	}{
		{"/header", "4", 200, `"by_header";r=6;t=1440`, ""},
		{"/header", "abc", 200, `"by_header";r=5;t=1800`, ""},          // default_cost 1
		{"/header", "0.5", 200, `"by_header";r=4;t=1980`, ""},          // 4.5 left
		{"/header", "-3", 200, `"by_header";r=3;t=2340`, ""},           // default_cost 1
		{"/header", "1e999", 200, `"by_header";r=2;t=2700`, ""},        // default_cost 1
		{"/header", "11", 429, `"by_header";r=2;t=2700`, ""},           // above capacity: no Retry-After
		{"/header", "3", 429, `"by_header";r=2;t=180`, "180"},          // needs 0.5 more: 180s
		{"/query?weight=3", "", 200, `"by_query";r=7;t=1080`, ""},      // query cost
		{"/query?weight=NaN", "", 200, `"by_query";r=5;t=1800`, ""},    // default_cost 2
		{"/query", "", 200, `"by_query";r=3;t=2520`, ""},               // empty: default_cost 2
		{"/query?weight=0", "", 200, `"by_query";r=3;t=2520`, ""},      // free
		{"/query?weight=100000", "", 429, `"by_query";r=3;t=2520`, ""}, // above capacity
	}
	for i, s := range steps {
		headers := []string{"X-Client: cost"}
		if s.weight != "" {
			headers = append(headers, "X-Weight: "+s.weight)
		}
		resp, body := get(t, tester, s.path, headers...)
		check(t, fmt.Sprintf("step %d (%s %s)", i, s.path, s.weight), resp, body, want{s.status, map[string]string{"RateLimit": s.ratelimit, "Retry-After": s.retryAfter}, ""})
	}

	// A 10 KB header is not a cost: default_cost applies.
	big := make([]byte, 10<<10)
	for i := range big {
		big[i] = '9'
	}
	resp, _ := get(t, tester, "/header", "X-Client: big", "X-Weight: "+string(big))
	check(t, "10 KB weight", resp, "", want{200, map[string]string{"RateLimit": `"by_header";r=9;t=360`}, ""})
}

func TestShapingWithConcurrentClients(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone shaper {
				key {http.request.header.X-Client}
				algorithm leaky_bucket
				rate 10/s
				burst 1
				max_delay 500ms
			}
		}
		respond "ok"
	}`, "caddyfile")

	// One event drains every 100ms. With the fake clock standing still, the
	// first request passes at once and each later one queues 100ms behind
	// the one before: delays 0, 100, ..., 500ms for six; the seventh would
	// wait 600ms > max_delay and is rejected at once.
	const n = 7
	type outcome struct {
		status  int
		elapsed time.Duration
	}
	var mu sync.Mutex
	var out []outcome
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
			req.Header.Set("X-Client", "shaped")
			resp, err := sendUnread(t, tester.Client, req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			out = append(out, outcome{resp.StatusCode, time.Since(start)})
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].elapsed < out[j].elapsed })
	var ok, rejected int
	for _, o := range out {
		switch o.status {
		case 200:
			ok++
		case 429:
			rejected++
		}
	}
	if ok != 6 || rejected != 1 {
		t.Fatalf("got %d × 200 and %d × 429 (%v), want 6 and 1", ok, rejected, out)
	}
	// Timers never fire early: the last admitted request waited its 500ms.
	if last := out[len(out)-1]; last.status != 200 || last.elapsed < 500*time.Millisecond {
		t.Errorf("slowest request: %v, want a 200 delayed at least 500ms", last)
	}
}

func TestShapedClientThatLeavesGivesItsPlaceBack(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone leaver {
				key {http.request.header.X-Client}
				algorithm leaky_bucket
				rate 1/s
				burst 1
				max_delay 10s
			}
		}
		respond "ok"
	}`, "caddyfile")

	resp, _ := get(t, tester, "/", "X-Client: leaver")
	check(t, "first", resp, "", want{200, map[string]string{"RateLimit": `"leaver";r=0;t=1`}, ""})

	// The second would wait 1s; its client gives up after 100ms.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
	req.Header.Set("X-Client", "leaver")
	if resp, err := tester.Client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("second request: status %d, want the client to time out", resp.StatusCode)
	}

	// Once the server has seen the client go, its reservation is given
	// back: the key's debt is the first request's 1s again, not 2s. Poll
	// the store itself, which charges nothing.
	store := memoryStoreOf(t, "leaver")
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, ok, _ := store.Peek(context.Background(), "leaver", fakeNow.Load())
		if ok && d.Reset == microsPerSecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservation not given back: Peek = %+v, %v; want Reset 1s", d, ok)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A third request queues 1s behind the first (t=2), not 2s (t=3).
	resp, _ = get(t, tester, "/", "X-Client: leaver")
	check(t, "third", resp, "", want{200, map[string]string{"RateLimit": `"leaver";r=0;t=2`}, ""})
}

// memoryStoreOf returns the live memory store of the zone named name.
func memoryStoreOf(t *testing.T, name string) *memory.Store {
	t.Helper()
	var s *memory.Store
	memoryZones.Range(func(k, v any) bool {
		if strings.HasPrefix(k.(string), name+"/") {
			s = v.(pooledStore).Store
			return false
		}
		return true
	})
	if s == nil {
		t.Fatalf("no memory store for zone %s", name)
	}
	return s
}

func TestSweeperForgetsFreshKeys(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone swept {
				key {http.request.header.X-Client}
				rate 10/m
			}
			sweep_interval 20ms
		}
		respond "ok"
	}`, "caddyfile")
	for i := 0; i < 5; i++ {
		get(t, tester, "/", fmt.Sprintf("X-Client: s%d", i))
	}
	store := memoryStoreOf(t, "swept")
	if n := store.Len(); n != 5 {
		t.Fatalf("keys held: %d, want 5", n)
	}
	// Every bucket is full again a minute later: the sweeper forgets them.
	advance(time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for store.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("keys held a minute later: %d, want 0 (swept)", store.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
