package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
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

// BenchmarkLeaseCallRedisCPU measures what a quota lease call (single.lua's
// op 'q', renewing: it ends the key's previous lease, decides the request
// and takes a new lease) costs Redis, beside a plain decision of the same
// zone (op 't'): Redis's CPU time per call (INFO cpu, user + sys: the
// script and the command's reading and answering), on a token_bucket of
// 1,000,000/s (scripts/bench_leases.sh's zone) over 100 keys, one call at
// a time, by FCALL (functions=true, as production once the library is
// loaded) and by EVALSHA. Run it with -benchtime 20000x or so: each call is
// a round trip.
func BenchmarkLeaseCallRedisCPU(b *testing.B) {
	srv := redistest.Start(b)
	for _, functions := range []bool{true, false} {
		for _, op := range []string{"take", "lease"} {
			b.Run(fmt.Sprintf("functions=%t/op=%s", functions, op), func(b *testing.B) {
				c := benchClient(b, srv, 1)
				s := New(c, DefaultPrefix)
				if functions {
					withFunctions(b, s)
				}
				l := mustLimit(b, algorithms.TokenBucket, 1_000_000, time.Second, 0, 0)
				zl := s.Zone(storage.Zone{Name: "bench-lease-" + op, Limit: l, Lease: true})
				z := zl.(*zone)
				ctx := context.Background()
				const keys = 100
				held := make([]ended, keys)
				life := DefaultLeaseLife.Microseconds()
				call := func(i int) {
					k := i % keys
					if op == "take" {
						if _, err := zl.Take(ctx, "client-"+strconv.Itoa(k), 0, algorithms.Milli); err != nil {
							b.Fatal(err)
						}
						return
					}
					rkey := s.key("client-"+strconv.Itoa(k), z.tail)
					d, n, lived, err := z.lease(ctx, 0, rkey, amount(&l, algorithms.Milli), 440, life, held[k])
					if err != nil || n == 0 {
						b.Fatalf("lease: %+v, %d, %v", d, n, err)
					}
					// Nothing spent: each renewal gives the lease back
					// whole, so that the bucket never runs dry however
					// long the run (a lease half spent every few ms
					// drains it: the lease then fails).
					held[k] = ended{unspent: n, taken: d.At, life: lived, n: n}
				}
				for i := range keys {
					call(i)
				}
				cpu0 := redisCPU(b, c)
				b.ResetTimer()
				for i := range b.N {
					call(i)
				}
				b.StopTimer()
				b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(b.N), "redis-cpu-µs/call")
			})
		}
	}
}

// redisCPU returns the CPU time the server has used, user and system, in
// seconds (INFO cpu).
func redisCPU(b *testing.B, c *goredis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		for _, name := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				sum += x
			}
		}
	}
	return sum
}

// BenchmarkLeasedHotKeys decides requests on 100 hot keys (one at random a
// request) of a token_bucket of 1,000,000/s from 64 callers on a pipelined
// store with functions, leases on and off, and reports Redis's CPU time a
// decision (INFO cpu) and the scripts Redis ran a decision; with -v it logs
// every command Redis ran (INFO commandstats) and how long each took.
func BenchmarkLeasedHotKeys(b *testing.B) {
	srv := redistest.Start(b)
	for _, lease := range []bool{true, false} {
		b.Run(fmt.Sprintf("lease=%t", lease), func(b *testing.B) {
			c := benchClient(b, srv, 64)
			s := NewPipelined(benchClient(b, srv, 64), DefaultPrefix)
			defer s.Close()
			withFunctions(b, s)
			l := mustLimit(b, algorithms.TokenBucket, 1_000_000, time.Second, 0, 0)
			zl := s.Zone(storage.Zone{Name: fmt.Sprintf("hot-%t", lease), Limit: l, Lease: lease})
			ctx := context.Background()
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			cpu0 := redisCPU(b, c)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 2))
					for next.Add(1) <= int64(b.N) {
						key := "client-" + strconv.Itoa(rng.IntN(100))
						if _, err := s.Decide(ctx, time.Now().UnixMicro(), []Request{{Zone: zl, Key: key, Cost: algorithms.Milli}}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(b.N), "redis-cpu-µs/decision")
			info, err := c.Info(ctx, "commandstats").Result()
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("N=%d leases taken %d returned %d expired %d from leases %d\n%s", b.N, s.Leases().Taken.Load(), s.Leases().Returned.Load(),
				s.Leases().Expired.Load(), s.Leases().Decisions.Load(), info)
		})
	}
}
