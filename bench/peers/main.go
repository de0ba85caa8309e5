// Command peers measures Tollgate's memory store beside the keyed Go rate
// limiters people reach for, in one process, and prints one table: what a
// decision costs at a number of keys taken in random order, serial and
// parallel, with the clock read on every decision, and the heap each key
// holds. The limiters are timed in small batches, taking turns, and the
// table gives each one's median batch: on shared cores, where the
// throughput drifts from second to second, every limiter sees the same
// drift.
//
// It is a module of its own (see go.mod), so that the peers never enter
// Tollgate's. Run it from this directory:
//
//	go run . -keys 100000 -batches 40
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

// perSecond is every limiter's rate: high enough that the decisions
// measured are admissions, as most are in a server.
const perSecond = 1_000_000

// limiter is one contestant: build returns a fresh one's decision.
type limiter struct {
	name  string
	build func() (take func(key string), err error)
}

func tollgate(kind algorithms.Kind) limiter {
	return limiter{"Tollgate memory store, " + kind.String(), func() (func(string), error) {
		l, err := algorithms.NewLimit(kind, perSecond, time.Second, 0, 0)
		if err != nil {
			return nil, err
		}
		s := memory.New(storage.Zone{Name: "peers", Limit: l})
		ctx := context.Background()
		return func(key string) {
			s.Take(ctx, key, time.Now().UnixMicro(), algorithms.Milli)
		}, nil
	}}
}

var limiters = []limiter{
	// What the harness costs every limiter: the key read from its place
	// among the others, its bytes, and the clock. A limiter's own cost is
	// its figure less this one.
	{"harness alone (the key's bytes and the clock)", func() (func(string), error) {
		var sink uint64
		return func(key string) {
			n := uint64(time.Now().UnixNano())
			for i := 0; i < len(key); i++ {
				n += uint64(key[i])
			}
			sink += n
		}, nil
	}},
	tollgate(algorithms.TokenBucket),
	tollgate(algorithms.GCRA),
	tollgate(algorithms.SlidingWindow),
	tollgate(algorithms.FixedWindow),
	tollgate(algorithms.LeakyBucket),
	{"throttled/throttled v2.15.0 (GCRA, memstore)", func() (func(string), error) {
		st, err := memstore.NewCtx(0) // no max_keys: a Go map
		if err != nil {
			return nil, err
		}
		rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerSec(perSecond), MaxBurst: perSecond})
		if err != nil {
			return nil, err
		}
		ctx := context.Background()
		return func(key string) { rl.RateLimitCtx(ctx, key, 1) }, nil
	}},
	{"sethvargo/go-limiter v0.7.1 (memorystore)", func() (func(string), error) {
		st, err := memorystore.New(&memorystore.Config{Tokens: perSecond, Interval: time.Second})
		if err != nil {
			return nil, err
		}
		var _ golimiter.Store = st
		ctx := context.Background()
		return func(key string) { st.Take(ctx, key) }, nil
	}},
	{"golang.org/x/time/rate v0.14.0 + sync.Map", func() (func(string), error) {
		var m sync.Map
		return func(key string) {
			l, ok := m.Load(key)
			if !ok {
				l, _ = m.LoadOrStore(key, rate.NewLimiter(perSecond, perSecond))
			}
			l.(*rate.Limiter).AllowN(time.Now(), 1)
		}, nil
	}},
	{"ulule/limiter v3.11.2 (memory)", func() (func(string), error) {
		l := ulule.New(ulmemory.NewStore(), ulule.Rate{Period: time.Second, Limit: perSecond})
		ctx := context.Background()
		return func(key string) { l.Get(ctx, key) }, nil
	}},
}

func main() {
	nkeys := flag.Int("keys", 100_000, "distinct keys")
	batches := flag.Int("batches", 40, "timed batches a limiter, serial and parallel each, interleaved with the others'")
	batch := flag.Int("batch", 20_000, "decisions a batch")
	keyLen := flag.Int("keylen", 0, "pad each key to this many bytes (0: an IPv4 address, 8 to 11 bytes)")
	only := flag.String("only", "", "measure only the limiters whose name contains this")
	flag.Parse()

	keys := make([]string, *nkeys)
	for i := range keys {
		keys[i] = "10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
		if len(keys[i]) < *keyLen {
			keys[i] += strings.Repeat("k", *keyLen-len(keys[i]))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	order := make([]int32, 1<<20)
	for i := range order {
		order[i] = int32(rng.IntN(*nkeys))
	}
	var ls []limiter
	for _, l := range limiters {
		if strings.Contains(l.name, *only) {
			ls = append(ls, l)
		}
	}

	// Build every limiter, each given every key once: the heap it then
	// holds, per key, is its bytes a key.
	takes := make([]func(string), len(ls))
	bytes := make([]float64, len(ls))
	for i, l := range ls {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		take, err := l.build()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", l.name, err)
			os.Exit(1)
		}
		for _, k := range keys {
			take(k)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		takes[i], bytes[i] = take, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(len(keys))
	}

	// Time the limiters in small batches, taking turns (each batch in a
	// rotated order), so that the machine's drift from second to second
	// falls on every limiter alike; the median batch is the figure.
	serial := make([][]float64, len(ls))
	parallel := make([][]float64, len(ls))
	procs := runtime.GOMAXPROCS(0)
	mask := len(order) - 1
	pos := 0
	for b := 0; b < *batches; b++ {
		for k := range ls {
			i := (k + b) % len(ls)
			take := takes[i]
			start := time.Now()
			for j := 0; j < *batch; j++ {
				take(keys[order[(pos+j)&mask]])
			}
			serial[i] = append(serial[i], float64(time.Since(start).Nanoseconds())/float64(*batch))

			var wg sync.WaitGroup
			start = time.Now()
			for g := 0; g < procs; g++ {
				wg.Add(1)
				go func(from int) {
					defer wg.Done()
					for j := from; j < from+*batch/procs; j++ {
						take(keys[order[j&mask]])
					}
				}(pos + *batch + g**batch/procs) // keys the serial batch did not just take
			}
			wg.Wait()
			parallel[i] = append(parallel[i], float64(time.Since(start).Nanoseconds())/float64(*batch))
		}
		pos += 2 * *batch
	}

	fmt.Printf("%d keys in random order (%s), GOMAXPROCS %d, medians of %d interleaved batches of %d decisions\n\n",
		*nkeys, keyDesc(*keyLen), procs, *batches, *batch)
	fmt.Println("| limiter | serial ns | parallel ns | heap bytes a key |")
	fmt.Println("|---|---|---|---|")
	for i, l := range ls {
		fmt.Printf("| %s | %.0f | %.0f | %.0f |\n", l.name, median(serial[i]), median(parallel[i]), bytes[i])
	}
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func keyDesc(n int) string {
	if n == 0 {
		return "IPv4 addresses"
	}
	return fmt.Sprintf("keys of %d bytes", n)
}
