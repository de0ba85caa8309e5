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
)

// heldHandler provisions a handler on srv with one zone of 4 requests in
// flight per client IP, whose slots are leases of lease.
func heldHandler(tb testing.TB, srv *redistest.Server, lease time.Duration) *Handler {
	tb.Helper()
	z := Zone{Concurrency: 4, ConcurrencyLease: caddy.Duration(lease)}
	h := &Handler{
		RateLimits: map[string]*Zone{"held": &z},
		StorageRaw: json.RawMessage(`{"module": "redis", "addresses": ["` + srv.Addr + `"], "timeout": "10s"}`),
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

// heldCost holds reqs, first straight at the next handler, then through
// h, and returns what each request held through h costs beyond the first:
// goroutines and bytes (heap and stacks in use, after a collection).
func heldCost(tb testing.TB, h *Handler, reqs []*http.Request) (goroutines, bytes float64, end func()) {
	tb.Helper()
	inUse := func() (int, uint64) {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return runtime.NumGoroutine(), m.HeapInuse + m.StackInuse
	}
	g0, b0 := inUse()
	endBare := holdRequests(tb, nil, reqs)
	g1, b1 := inUse()
	endBare()
	g2, b2 := inUse()
	end = holdRequests(tb, h, reqs)
	g3, b3 := inUse()
	n := float64(len(reqs))
	return (float64(g3-g2) - float64(g1-g0)) / n, (float64(b3-b2) - float64(b1-b0)) / n, end
}

// TestHeldRequestsShareOneRenewal: requests holding Redis leases cost no
// goroutine each, and their leases are renewed in a few batched calls,
// not one a lease: 200 held requests with a lease of 1s (renewed every
// third of it) make a handful of script calls a second, and every lease
// is still held after more than a lease. Before, each held request ran a
// goroutine and a ticker of its own, and renewed its lease with a script
// of its own: 200 goroutines, about 600 calls a second.
func TestHeldRequestsShareOneRenewal(t *testing.T) {
	srv := redistest.Start(t)
	h := heldHandler(t, srv, time.Second)
	const n = 200
	reqs := benchRequests(n)
	goroutines, _, end := heldCost(t, h, reqs)
	defer end()
	if goroutines > 0.1 {
		t.Errorf("%.2f goroutines a held request, want none (one renewal loop for all)", goroutines)
	}
	c := srv.Client()
	scripts := func() int64 { return redistest.Calls(t, c, "evalsha", "eval", "fcall") }
	before := scripts()
	time.Sleep(1200 * time.Millisecond) // more than a lease: renewals alone keep the slots
	calls := scripts() - before
	t.Logf("%d held requests with a lease of 1s: %d script calls in 1.2s", n, calls)
	if calls > n/10 {
		t.Errorf("%d script calls in 1.2s for %d held leases, want a few (one a tick)", calls, n)
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

// BenchmarkHeldRequests measures what requests holding Redis concurrency
// slots cost while they run, at the default lease (30s, renewed every
// 10s): bytes per held request (heap and stacks, beyond the same requests
// held without the handler), goroutines per held request, and the script
// calls Redis runs a second to keep them (INFO commandstats of the test's
// own Redis, over one renewal period). Run it once per count:
//
//	flock /tmp/bench.lock go test -run '^$' -bench BenchmarkHeldRequests -benchtime 1x -count 3 .
func BenchmarkHeldRequests(b *testing.B) {
	for _, n := range []int{50_000} {
		b.Run("held="+strconv.Itoa(n), func(b *testing.B) {
			srv := redistest.Start(b)
			h := heldHandler(b, srv, defaultLease)
			reqs := benchRequests(n)
			c := srv.Client()
			for range b.N {
				goroutines, bytes, end := heldCost(b, h, reqs)
				before := redistest.Calls(b, c, "evalsha", "eval", "fcall")
				window := defaultLease / 3
				time.Sleep(window)
				calls := redistest.Calls(b, c, "evalsha", "eval", "fcall") - before
				end()
				b.ReportMetric(bytes, "B/held")
				b.ReportMetric(goroutines, "goroutines/held")
				b.ReportMetric(float64(calls)/window.Seconds(), "calls/s")
			}
		})
	}
}
