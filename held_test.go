package tollgate

import (
	"context"
	"encoding/json"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
)

// heldHandler provisions a handler with one zone of 4 requests in flight
// per client IP, on srv, whose slots are leases of lease, or, with srv
// nil, in memory.
func heldHandler(tb testing.TB, srv *redistest.Server, lease time.Duration) *Handler {
	tb.Helper()
	z := Zone{Concurrency: 4}
	h := &Handler{RateLimits: map[string]*Zone{"held": &z}}
	if srv != nil {
		z.ConcurrencyLease = caddy.Duration(lease)
		h.StorageRaw = json.RawMessage(`{"module": "redis", "addresses": ["` + srv.Addr + `"], "timeout": "10s"}`)
	}
	provisionBench(tb, h)
	return h
}

// holdRequests sends each of reqs through h on a goroutine of its own (as
// Caddy's server would), or, with h nil, straight to the next handler,
// and returns once every one is held there, with a function that ends
// them all and waits for them (once; later calls only wait). It fails tb if h does not admit one.
func holdRequests(tb testing.TB, h *Handler, reqs []*http.Request) (end func()) {
	tb.Helper()
	var arrived, ended sync.WaitGroup
	var refused atomic.Int64
	gate := make(chan struct{})
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		arrived.Done()
		<-gate
		return nil
	})
	arrived.Add(len(reqs))
	ended.Add(len(reqs))
	for _, r := range reqs {
		go func() {
			defer ended.Done()
			w := &nopWriter{h: make(http.Header)}
			if h == nil {
				_ = next.ServeHTTP(w, r)
				return
			}
			reached := false
			err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				reached = true
				return next.ServeHTTP(w, r)
			}))
			if !reached {
				refused.Add(1)
				arrived.Done()
			}
			_ = err
		}()
	}
	arrived.Wait()
	if n := refused.Load(); n > 0 {
		close(gate)
		ended.Wait()
		tb.Fatalf("%d of %d requests refused, want every one held", n, len(reqs))
	}
	var once sync.Once
	return func() {
		once.Do(func() { close(gate) })
		ended.Wait()
	}
}

// heldCost is what each request held through a handler costs beyond the
// same request held straight at the next handler: goroutines, and bytes
// of heap and of goroutine stacks in use (after two collections, which
// also shrink the stacks that can be).
type heldCost struct {
	goroutines, heap, stack float64
}

// measureHeld holds reqs, first straight at the next handler, then through
// h, and returns what each request held through h costs beyond the first,
// and a function that ends them.
func measureHeld(tb testing.TB, h *Handler, reqs []*http.Request) (heldCost, func()) {
	tb.Helper()
	type use struct {
		g           int
		heap, stack uint64
	}
	inUse := func() use {
		runtime.GC()
		runtime.GC() // what sync.Pools held is gone after two
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return use{runtime.NumGoroutine(), m.HeapInuse, m.StackInuse}
	}
	u0 := inUse()
	endBare := holdRequests(tb, nil, reqs)
	u1 := inUse()
	endBare()
	u2 := inUse()
	end := holdRequests(tb, h, reqs)
	u3 := inUse()
	n := float64(len(reqs))
	diff := func(a, b, c, d uint64) float64 { return (float64(d) - float64(c) - (float64(b) - float64(a))) / n }
	return heldCost{
		goroutines: (float64(u3.g-u2.g) - float64(u1.g-u0.g)) / n,
		heap:       diff(u0.heap, u1.heap, u2.heap, u3.heap),
		stack:      diff(u0.stack, u1.stack, u2.stack, u3.stack),
	}, end
}

// TestHeldRequestsShareOneRenewal: requests holding Redis leases cost no
// goroutine each, and their leases are renewed in a few batched calls,
// not one a lease: 200 held requests with a lease of 2s (renewed about
// every third of it) make a handful of script calls in 2.4s, and every
// lease is still held after more than a lease. Before, each held request
// ran a goroutine and a ticker of its own, and renewed its lease with a
// script of its own: 200 goroutines, 158 calls in 1.2s with a lease of
// 1s (renewals made at once share a call of the batch function).
func TestHeldRequestsShareOneRenewal(t *testing.T) {
	srv := redistest.Start(t)
	h := heldHandler(t, srv, 2*time.Second)
	const n = 200
	reqs := benchRequests(n)
	cost, end := measureHeld(t, h, reqs)
	defer end()
	if cost.goroutines > 0.1 {
		t.Errorf("%.2f goroutines a held request, want none (one renewal loop for all)", cost.goroutines)
	}
	c := srv.Client()
	scripts := func() int64 { return redistest.Calls(t, c, "evalsha", "eval", "fcall") }
	before := scripts()
	time.Sleep(2400 * time.Millisecond) // more than a lease: renewals alone keep the slots
	calls := scripts() - before
	t.Logf("%d held requests with a lease of 2s: %d script calls in 2.4s", n, calls)
	if calls > 10 { // a tick every third of a second, one call each at most
		t.Errorf("%d script calls in 2.4s for %d held leases, want a few (one a tick)", calls, n)
	}
	// Every request still holds its slot.
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(context.Background(), "tollgate:*:held:cc").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != n {
		t.Fatalf("%d slot keys in Redis, want %d", len(keys), n)
	}
	for _, k := range keys {
		live, err := c.ZCount(context.Background(), k, "("+strconv.FormatInt(now.UnixMicro(), 10), "+inf").Result()
		if err != nil {
			t.Fatal(err)
		}
		if live != 1 {
			t.Fatalf("%s: %d live leases, want 1: a lease was not renewed", k, live)
		}
	}
	end()
	keys, err = c.Keys(context.Background(), "tollgate:*:held:cc").Result()
	if err != nil || len(keys) != 0 {
		t.Errorf("after the requests ended: %d slot keys (%v), want none", len(keys), err)
	}
}

// BenchmarkHeldRequests measures what requests holding concurrency slots
// cost while they run, at the default lease (30s, renewed every 10s):
// goroutines, heap and stack bytes per held request (beyond the same
// requests held without the handler), and the script calls Redis runs a
// second to keep them, and the leases those renew (INFO commandstats of
// the test's own Redis, over two renewal periods). The memory store, which keeps no leases, is the
// reference for what a held request costs the handler without them (its
// stack, mostly: the handler's frames under the next handler's). Run it
// once per count:
//
//	flock /tmp/bench.lock go test -run '^$' -bench BenchmarkHeldRequests -benchtime 1x -count 3 .
func BenchmarkHeldRequests(b *testing.B) {
	for _, store := range []string{"memory", "redis"} {
		b.Run("held=50000/store="+store, func(b *testing.B) {
			var srv *redistest.Server
			if store == "redis" {
				srv = redistest.Start(b)
			}
			h := heldHandler(b, srv, zoneconf.DefaultLease)
			reqs := benchRequests(50_000)
			for range b.N {
				cost, end := measureHeld(b, h, reqs)
				if srv != nil {
					c := srv.Client()
					before := redistest.Calls(b, c, "evalsha", "eval", "fcall")
					renewed := redistest.Calls(b, c, "zadd") // a renewal is a ZADD XX in a script
					window := 2 * zoneconf.DefaultLease / 3  // two renewals of each lease
					time.Sleep(window)
					calls := redistest.Calls(b, c, "evalsha", "eval", "fcall") - before
					renewed = redistest.Calls(b, c, "zadd") - renewed
					b.ReportMetric(float64(calls)/window.Seconds(), "calls/s")
					b.ReportMetric(float64(renewed)/window.Seconds(), "renewals/s")
				}
				end()
				b.ReportMetric(cost.goroutines, "goroutines/held")
				b.ReportMetric(cost.heap, "heapB/held")
				b.ReportMetric(cost.stack, "stackB/held")
			}
		})
	}
}
