package tollgate

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// nopWriter is a ResponseWriter whose header map is reused across requests.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

var nextOK = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

// provisionBench provisions a handler with one zone built by zone, and
// returns it with its cleanup.
func provisionBench(b testing.TB, h *Handler) {
	b.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Cleanup() })
}

// benchRequests returns n prepared requests, each from its own client IP,
// as Caddy's server would hand them to the handler.
func benchRequests(n int) []*http.Request {
	reqs := make([]*http.Request, n)
	for i := range reqs {
		r := httptest.NewRequest(http.MethodGet, "/api/x?weight=2", nil)
		r.Header.Set("X-API-Key", "key-"+strconv.Itoa(i))
		repl := caddy.NewReplacer()
		r = caddyhttp.PrepareRequest(r, repl, nil, nil)
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "10.1."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256))
		reqs[i] = r
	}
	return reqs
}

// BenchmarkServeHTTP measures the handler's own overhead on the allowed
// path: key resolution, the decision on the memory store, and the headers;
// with metrics=on also the counters and the store latency histogram, which
// must add no allocation.
func BenchmarkServeHTTP(b *testing.B) {
	cases := []struct {
		name    string
		zone    Zone
		hdrs    []string
		metrics bool
	}{
		{"key=client_ip/headers=ietf", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}, nil, false},
		{"key=client_ip/headers=ietf/metrics=on", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}, nil, true},
		{"key=client_ip/headers=none", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}, []string{"none"}, false},
		{"key=client_ip/headers=none/metrics=on", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}, []string{"none"}, true},
		{"key=header/headers=ietf", Zone{Key: "{http.request.header.X-API-Key}", Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}, nil, false},
		{"key=header/cost=query/headers=ietf", Zone{Key: "{http.request.header.X-API-Key}", Algorithm: "token_bucket", Cost: "{http.request.uri.query.weight}", Events: 1 << 30, Window: caddy.Duration(3600e9)}, nil, false},
		// The same zone with each of the other limits: what they cost.
		{"key=client_ip/headers=ietf/ban", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), Ban: caddy.Duration(3600e9)}, nil, false},
		{"key=client_ip/headers=ietf/concurrency", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), Concurrency: 1 << 20}, nil, false},
		{"key=client_ip/headers=ietf/tier", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), TierKey: "{http.request.header.X-API-Key}",
			Tiers: map[string]*Tier{"key-0": {Events: 1 << 30, Window: caddy.Duration(7200e9)}}}, nil, false},
		// A zone as mholt/caddy-ratelimit's users write it: events and
		// window, a sliding_log (few events, so that every key's log
		// holds some), on many keys: one key would be refused.
		{"key=client_ip/headers=ietf/sliding_log", Zone{Events: 100, Window: caddy.Duration(1e9)}, nil, false},
		// concurrency adaptive beside the rate, and alone (one key: a
		// controller is 1.3 KB a key).
		{"key=client_ip/headers=ietf/adaptive", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), ConcurrencyAdaptive: &Adaptive{Max: 1 << 20}}, nil, false},
		{"key=client_ip/headers=ietf/adaptive_alone", Zone{ConcurrencyAdaptive: &Adaptive{Max: 1 << 20}}, nil, false},
	}
	for _, c := range cases {
		for _, keys := range []int{1, 100_000} {
			if keys > 1 && c.zone.ConcurrencyAdaptive != nil {
				continue
			}
			if keys == 1 && c.zone.Events < 1<<20 {
				continue // a small limit refuses one key's flood
			}
			b.Run(c.name+"/keys="+strconv.Itoa(keys), func(b *testing.B) {
				z := c.zone
				h := &Handler{RateLimits: map[string]*Zone{"bench": &z}, Headers: c.hdrs}
				if c.metrics {
					metricsEnabled = func(caddy.Context) bool { return true }
					defer func() { metricsEnabled = httpMetricsEnabled }()
				}
				provisionBench(b, h)
				if c.metrics && h.zones[0].metrics == nil {
					b.Fatal("metrics=on: the zone has no metrics")
				}
				reqs := benchRequests(keys)
				w := &nopWriter{h: make(http.Header)}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					clear(w.h)
					if err := h.ServeHTTP(w, reqs[i%keys], nextOK); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestAllowedPathAllocations pins the handler's allocations on an allowed
// request (a count and a size, not a timing), each request with a fresh
// replacer as Caddy gives it: two small ones with headers off (the
// request's placeholders and their provider), two more with the IETF
// headers (the RateLimit value and one slice for both headers' values),
// with metrics on or off, and whatever a zone's limit. A change that makes
// the request's results escape to the heap, a metric that allocates, or
// placeholders put in the replacer's own map (about 280 bytes a request)
// fails here.
func TestAllowedPathAllocations(t *testing.T) {
	for _, c := range []struct {
		name    string
		events  int64
		hdrs    []string
		metrics bool
		allocs  float64
		bytes   float64
	}{
		// {http.rate_limit.remaining}, above 255 here, is boxed only
		// when read.
		{"headers=none", 1 << 30, []string{"none"}, false, 2, 64},
		{"headers=none/metrics=on", 1 << 30, []string{"none"}, true, 2, 64},
		{"headers=ietf", 1 << 30, nil, false, 4, 128},
		{"headers=ietf/metrics=on", 1 << 30, nil, true, 4, 128},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.metrics {
				metricsEnabled = func(caddy.Context) bool { return true }
				defer func() { metricsEnabled = httpMetricsEnabled }()
			}
			z := Zone{Algorithm: "token_bucket", Events: c.events, Window: caddy.Duration(3600e9)}
			h := &Handler{RateLimits: map[string]*Zone{"allocs": &z}, Headers: c.hdrs}
			provisionBench(t, h)
			servePrepared(t, h, 1) // the key's first request creates it
			gotAllocs, gotBytes := servePrepared(t, h, 400)
			if gotAllocs > c.allocs || gotBytes > c.bytes {
				t.Errorf("an allowed request allocates %v times, %v bytes; want at most %v, %v bytes", gotAllocs, gotBytes, c.allocs, c.bytes)
			}
			t.Logf("%v allocations, %v bytes a request", gotAllocs, gotBytes)
		})
	}
}

// servePrepared serves n allowed requests of one key through h, and
// returns what each allocated and how many bytes, the least over a few
// runs. Each request is prepared afresh, with a replacer of its own, as
// Caddy's server does; what that costs is measured alone and taken off.
func servePrepared(t *testing.T, h *Handler, n int) (allocs, bytes float64) {
	t.Helper()
	req := benchRequests(1)[0]
	w := &nopWriter{h: make(http.Header)}
	reqs := make([]*http.Request, n)
	fresh := func() {
		for i := range reqs {
			reqs[i] = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), nil, nil)
		}
	}
	serve := func() {
		for _, r := range reqs {
			clear(w.h)
			if err := h.ServeHTTP(w, r, nextOK); err != nil {
				t.Fatal(err)
			}
		}
	}
	all, allBytes := allocated(func() { fresh(); serve() })
	prep, prepBytes := allocated(fresh)
	return (all - prep) / float64(n), (allBytes - prepBytes) / float64(n)
}

// allocated returns how many allocations f made, and how many bytes, the
// least over a few runs (another goroutine may allocate meanwhile).
func allocated(f func()) (allocs, bytes float64) {
	allocs, bytes = math.Inf(1), math.Inf(1)
	for range 5 {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		f()
		runtime.ReadMemStats(&m1)
		allocs = min(allocs, float64(m1.Mallocs-m0.Mallocs))
		bytes = min(bytes, float64(m1.TotalAlloc-m0.TotalAlloc))
	}
	return allocs, bytes
}

// TestDecisionAsksTheReplacerNothing: deciding a request whose key needs
// no placeholder (the client IP, one header), admitted or rejected, asks
// none of its replacer's providers for anything: Caddy's HTTP provider,
// the largest of them, has a stack frame that made request goroutines
// grow their stacks again, as the placeholders' lookup through the
// replacer once did.
func TestDecisionAsksTheReplacerNothing(t *testing.T) {
	for _, key := range []string{"", "{http.request.header.X-API-Key}"} {
		z := Zone{Key: key, Algorithm: "token_bucket", Events: 1, Window: caddy.Duration(3600e9)}
		h := &Handler{RateLimits: map[string]*Zone{"asks": &z}}
		provisionBench(t, h)
		for i, status := range []int{200, 429} {
			repl := caddy.NewReplacer()
			r := caddyhttp.PrepareRequest(benchRequests(1)[0], repl, nil, nil)
			caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "10.9.9.9")
			var asked []string
			repl.Map(func(key string) (any, bool) {
				asked = append(asked, key)
				return nil, false
			})
			err := h.ServeHTTP(&nopWriter{h: make(http.Header)}, r, nextOK)
			var herr caddyhttp.HandlerError
			if got := 200; err != nil {
				if errors.As(err, &herr) {
					got = herr.StatusCode
				}
				if got != status {
					t.Fatalf("key %q, request %d: %v, want %d", key, i, err, status)
				}
			} else if status != 200 {
				t.Fatalf("key %q, request %d: admitted, want %d", key, i, status)
			}
			if len(asked) > 0 {
				t.Errorf("key %q, request %d (%d): the replacer's providers were asked for %q", key, i, status, asked)
			}
		}
	}
}

// TestAdmittedRequestGoesOnFromServeHTTP: an admitted request goes on down
// the handler chain from ServeHTTP's small frame, with gate's (which holds
// the request's results) gone: under Caddy's deep handler chain, the larger
// stack made every request goroutine copy its stack again after each
// garbage collection shrank it. A request that holds a concurrency slot
// is sent on by admitHeld, which gives the slot back when it returns.
func TestAdmittedRequestGoesOnFromServeHTTP(t *testing.T) {
	for _, c := range []struct {
		name     string
		zone     Zone
		fromGate bool
	}{
		{"rate", Zone{Algorithm: "token_bucket", Events: 1000, Window: caddy.Duration(3600e9)}, false},
		{"rate and ban", Zone{Algorithm: "token_bucket", Events: 1000, Window: caddy.Duration(3600e9), Ban: caddy.Duration(3600e9)}, false},
		{"concurrency", Zone{Algorithm: "token_bucket", Events: 1000, Window: caddy.Duration(3600e9), Concurrency: 4}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			z := c.zone
			h := &Handler{RateLimits: map[string]*Zone{"frames": &z}}
			provisionBench(t, h)
			var frames []string
			next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
				pc := make([]uintptr, 64)
				fs := runtime.CallersFrames(pc[:runtime.Callers(2, pc)])
				for {
					f, more := fs.Next()
					frames = append(frames, f.Function)
					if !more {
						break
					}
				}
				return nil
			})
			if err := h.ServeHTTP(&nopWriter{h: make(http.Header)}, benchRequests(1)[0], next); err != nil {
				t.Fatal(err)
			}
			// frames[0] is caddyhttp.HandlerFunc's ServeHTTP.
			if !c.fromGate && (len(frames) < 2 || !strings.HasSuffix(frames[1], "(*Handler).ServeHTTP")) {
				t.Fatalf("next called from %v, want (*Handler).ServeHTTP", frames[:min(len(frames), 3)])
			}
			inGate := slices.ContainsFunc(frames, func(f string) bool { return strings.HasSuffix(f, "(*Handler).gate") })
			if inGate != c.fromGate {
				t.Errorf("next called with gate on the stack: %v, want %v (stack %v)", inGate, c.fromGate, frames[:min(len(frames), 4)])
			}
		})
	}
}
