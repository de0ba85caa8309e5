package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// BenchmarkRedisTake measures token-bucket decisions per second against a
// local redis-server, from 1, 16 and 64 concurrent callers over 10,000 keys
// (bench_redis_benchmark.sh measures the same script with redis-benchmark,
// the server's ceiling).
//
// It starts its callers itself rather than with b.RunParallel, which runs a
// multiple of GOMAXPROCS goroutines and so cannot run exactly 1 or 16
// callers on every machine.
func BenchmarkRedisTake(b *testing.B) {
	srv := redistest.Start(b)
	const keys = 10_000
	for _, callers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			c := goredis.NewClient(&goredis.Options{
				Addr:                  srv.Addr,
				PoolSize:              callers,
				ContextTimeoutEnabled: true,
			})
			defer c.Close()
			zl := zoneOf(New(c, DefaultPrefix), "bench", mustLimit(b, algorithms.TokenBucket, 100, time.Second, 0, 0))
			ctx := context.Background()
			if _, err := zl.Take(ctx, "warm-up", 0, algorithms.Milli); err != nil {
				b.Fatal(err) // also loads the script
			}
			names := make([]string, keys)
			for i := range names {
				names[i] = "client-" + strconv.Itoa(i)
			}
			var next atomic.Int64
			var failed atomic.Value
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			for g := 0; g < callers; g++ {
				wg.Add(1)
				go func(seed uint64) {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, 1))
					for next.Add(1) <= int64(b.N) {
						if _, err := zl.Take(ctx, names[rng.IntN(keys)], 0, algorithms.Milli); err != nil {
							failed.Store(err)
							return
						}
					}
				}(uint64(g))
			}
			wg.Wait()
			b.StopTimer()
			if err := failed.Load(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}
