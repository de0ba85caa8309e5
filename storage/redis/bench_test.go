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

// benchKeys is how many keys the benchmarks spread their decisions over.
const benchKeys = 10_000

// BenchmarkRedisTake measures token-bucket decisions per second against a
// local redis-server, from 1, 16 and 64 concurrent callers over 10,000 keys,
// each call on its own round trip (pipeline=false) and through the batcher
// (pipeline=true), by EVALSHA and by FCALL (functions=true), side by side
// in one run (bench_redis_benchmark.sh measures
// the same script with redis-benchmark, unpipelined and with -P 16).
//
// It starts its callers itself rather than with b.RunParallel, which runs a
// multiple of GOMAXPROCS goroutines and so cannot run exactly 1 or 16
// callers on every machine.
func BenchmarkRedisTake(b *testing.B) {
	srv := redistest.Start(b)
	for _, callers := range []int{1, 16, 64} {
		for _, mode := range []struct{ pipeline, functions bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
			b.Run(fmt.Sprintf("callers=%d/pipeline=%t/functions=%t", callers, mode.pipeline, mode.functions), func(b *testing.B) {
				s := New(benchClient(b, srv, callers), DefaultPrefix)
				if mode.pipeline {
					s = NewPipelined(benchClient(b, srv, callers), DefaultPrefix)
					defer s.Close()
				}
				if mode.functions {
					withFunctions(b, s)
				}
				zl := zoneOf(s, "bench", mustLimit(b, algorithms.TokenBucket, 100, time.Second, 0, 0))
				benchCallers(b, callers, func(ctx context.Context, key string) error {
					_, err := zl.Take(ctx, key, 0, algorithms.Milli)
					return err
				})
			})
		}
	}
}

// BenchmarkRedisTakeAll measures requests per second decided by TakeAll
// over zones that key the same identity (one script per request), from 16
// callers: one zone (Take's path), two and four.
func BenchmarkRedisTakeAll(b *testing.B) {
	srv := redistest.Start(b)
	const callers = 16
	kinds := []algorithms.Kind{algorithms.TokenBucket, algorithms.SlidingWindow, algorithms.GCRA, algorithms.FixedWindow}
	for _, zones := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("zones=%d/callers=%d", zones, callers), func(b *testing.B) {
			s := New(benchClient(b, srv, callers), DefaultPrefix)
			var reqs []Request
			for i := 0; i < zones; i++ {
				l := mustLimit(b, kinds[i], 100, time.Second, 0, 0)
				reqs = append(reqs, Request{Zone: zoneOf(s, "bench-all-"+strconv.Itoa(i), l), Cost: algorithms.Milli})
			}
			benchCallers(b, callers, func(ctx context.Context, key string) error {
				rs := make([]Request, len(reqs))
				copy(rs, reqs)
				for i := range rs {
					rs[i].Key = key
				}
				_, _, err := s.TakeAll(ctx, 0, rs)
				return err
			})
		})
	}
}

func benchClient(b *testing.B, srv *redistest.Server, callers int) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{
		Addr:                  srv.Addr,
		PoolSize:              callers,
		ContextTimeoutEnabled: true,
	})
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// benchCallers runs b.N calls of decide over benchKeys keys from callers
// goroutines, after one call that loads the script, and reports
// decisions/s.
func benchCallers(b *testing.B, callers int, decide func(ctx context.Context, key string) error) {
	ctx := context.Background()
	if err := decide(ctx, "warm-up"); err != nil {
		b.Fatal(err)
	}
	names := make([]string, benchKeys)
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
				if err := decide(ctx, names[rng.IntN(benchKeys)]); err != nil {
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
}
