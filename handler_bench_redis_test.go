package tollgate

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// BenchmarkServeHTTPRedis is BenchmarkServeHTTP's allowed request on a
// Redis zone (a redis-server started for it): the handler's path around
// one decision on Redis, serial and from parallel callers (which share
// pipelines), with on_storage_error local (the local copy follows each
// decision) and allow (no local copy). Quota leases are off: the parallel
// callers' keys would be hot, and decided from leases (see
// BenchmarkServeHTTPLeased).
func BenchmarkServeHTTPRedis(b *testing.B) {
	srv := redistest.Start(b)
	for _, onError := range []string{"local", "allow"} {
		for _, parallel := range []bool{false, true} {
			name := "on_storage_error=" + onError + "/keys=1000"
			if parallel {
				name += "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				z := Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), OnStorageError: onError, Lease: "off"}
				h := &Handler{RateLimits: map[string]*Zone{"bench": &z}, Headers: []string{"none"},
					StorageRaw: json.RawMessage(`{"module": "redis", "addresses": ["` + srv.Addr + `"], "timeout": "10s"}`)}
				provisionBench(b, h)
				const keys = 1000
				reqs := benchRequests(keys)
				b.ReportAllocs()
				b.ResetTimer()
				if !parallel {
					w := &nopWriter{h: make(http.Header)}
					for i := 0; b.Loop(); i++ {
						clear(w.h)
						if err := h.ServeHTTP(w, reqs[i%keys], nextOK); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				serveParallel(b, h, 16, 64)
			})
		}
	}
}

// BenchmarkServeHTTPLeased is the handler's allowed request on 100 hot
// keys from parallel callers, of a token_bucket zone in memory and on
// Redis, where each key is decided from its quota lease (on by default;
// a key an instance sees 8 times in 250 ms leases): what deciding from a
// lease costs beside the memory store's decision.
func BenchmarkServeHTTPLeased(b *testing.B) {
	srv := redistest.Start(b)
	for _, store := range []string{"memory", "redis"} {
		b.Run("store="+store+"/keys=100/parallel", func(b *testing.B) {
			z := Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}
			h := &Handler{RateLimits: map[string]*Zone{"bench": &z}, Headers: []string{"none"}}
			if store == "redis" {
				h.StorageRaw = json.RawMessage(`{"module": "redis", "addresses": ["` + srv.Addr + `"], "timeout": "10s"}`)
			}
			provisionBench(b, h)
			b.ReportAllocs()
			b.ResetTimer()
			serveParallel(b, h, 8, 100)
		})
	}
}

// serveParallel serves allowed requests of keys keys through h from
// parallelism callers a core, each with its own requests (the same
// keys): a request's replacer is not shared.
func serveParallel(b *testing.B, h *Handler, parallelism, keys int) {
	b.SetParallelism(parallelism)
	b.RunParallel(func(pb *testing.PB) {
		mine := benchRequests(keys)
		w := &nopWriter{h: make(http.Header)}
		for i := 0; pb.Next(); i++ {
			clear(w.h)
			if err := h.ServeHTTP(w, mine[i%len(mine)], nextOK); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestLeasedPathAllocations pins the allocations of a request decided
// from its key's quota lease (a Redis zone's hot key): as the memory
// store's (TestAllowedPathAllocations, headers none: the request's
// placeholders and their provider), none for the lease itself (before,
// three: the request's parts, its Redis key and its verdict). Lease calls
// made meanwhile (a lease spent or ended) add a little: the least of a
// few runs of 1,000 requests is taken.
func TestLeasedPathAllocations(t *testing.T) {
	srv := redistest.Start(t)
	z := Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}
	h := &Handler{RateLimits: map[string]*Zone{"allocs": &z}, Headers: []string{"none"},
		StorageRaw: json.RawMessage(`{"module": "redis", "addresses": ["` + srv.Addr + `"], "timeout": "10s"}`)}
	provisionBench(t, h)
	const n = 1000
	servePrepared(t, h, n) // the key gets hot and takes its lease
	_, _, _, _, before := redisstore.LeaseTotals()
	gotAllocs, gotBytes := servePrepared(t, h, n)
	if _, _, _, _, after := redisstore.LeaseTotals(); after-before < 0.9*5*n {
		t.Fatalf("%d of %d requests decided from a lease: the test measures the lease's path", after-before, 5*n)
	}
	if gotAllocs > 2.2 || gotBytes > 80 {
		t.Errorf("a request decided from a lease allocates %v times, %v bytes; want at most 2.2, 80 bytes (the memory store's 2, 64, and a lease call's share)", gotAllocs, gotBytes)
	}
	t.Logf("%v allocations, %v bytes a request", gotAllocs, gotBytes)
}
