package tollgate

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// BenchmarkServeHTTPRedis is BenchmarkServeHTTP's allowed request on a
// Redis zone (a redis-server started for it): the handler's path around
// one decision on Redis, serial and from parallel callers (which share
// pipelines), with on_storage_error local (the local copy follows each
// decision) and allow (no local copy).
func BenchmarkServeHTTPRedis(b *testing.B) {
	srv := redistest.Start(b)
	for _, onError := range []string{"local", "allow"} {
		for _, parallel := range []bool{false, true} {
			name := "on_storage_error=" + onError + "/keys=1000"
			if parallel {
				name += "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				z := Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), OnStorageError: onError}
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
				b.SetParallelism(16)
				b.RunParallel(func(pb *testing.PB) {
					// Each caller its own requests (the same keys): a
					// request's replacer is not shared.
					mine := benchRequests(64)
					w := &nopWriter{h: make(http.Header)}
					for i := 0; pb.Next(); i++ {
						clear(w.h)
						if err := h.ServeHTTP(w, mine[i%len(mine)], nextOK); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
