// Command peers measures Tollgate's memory store beside the keyed Go rate
// limiters people reach for, in one process, and prints one table: what a
// decision costs at a number of keys taken in random order, serial and
// parallel, with the clock read on every decision, and the heap each key
// holds. Each round builds every limiter afresh, in a rotated order, and
// the table gives the medians of the rounds.
//
// It is a module of its own (see go.mod), so that the peers never enter
// Tollgate's. Run it from this directory:
//
//	go run . -keys 100000 -rounds 5
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

// result is one limiter's figures in one round.
type result struct{ serial, parallel, bytes float64 }

func main() {
	nkeys := flag.Int("keys", 100_000, "distinct keys")
	rounds := flag.Int("rounds", 5, "rounds, each measuring every limiter")
	ops := flag.Int("ops", 1_000_000, "decisions a measurement")
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
	order := make([]int32, 1<<16)
	for i := range order {
		order[i] = int32(rng.IntN(*nkeys))
	}
	var ls []limiter
	for _, l := range limiters {
		if strings.Contains(l.name, *only) {
			ls = append(ls, l)
		}
	}
	results := make([][]result, len(ls))
	for r := 0; r < *rounds; r++ {
		for k := range ls {
			i := (k + r) % len(ls) // rotate: no limiter always runs first
			res, err := measure(ls[i], keys, order, *ops)
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", ls[i].name, err)
				os.Exit(1)
			}
			results[i] = append(results[i], res)
		}
		fmt.Fprintf(os.Stderr, "round %d of %d done\n", r+1, *rounds)
	}

	fmt.Printf("%d keys in random order (%s), GOMAXPROCS %d, medians of %d rounds of %d decisions\n\n",
		*nkeys, keyDesc(*keyLen), runtime.GOMAXPROCS(0), *rounds, *ops)
	fmt.Println("| limiter | serial ns | parallel ns | heap bytes a key |")
	fmt.Println("|---|---|---|---|")
	for i, l := range ls {
		med := func(f func(result) float64) float64 {
			v := make([]float64, len(results[i]))
			for j, r := range results[i] {
				v[j] = f(r)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		fmt.Printf("| %s | %.0f | %.0f | %.0f |\n", l.name,
			med(func(r result) float64 { return r.serial }),
			med(func(r result) float64 { return r.parallel }),
			med(func(r result) float64 { return r.bytes }))
	}
}

func keyDesc(n int) string {
	if n == 0 {
		return "IPv4 addresses"
	}
	return fmt.Sprintf("keys of %d bytes", n)
}

// measure builds a fresh l, gives it every key once (the heap it then
// holds, per key, is its bytes), and times ops decisions serial, then
// parallel on GOMAXPROCS goroutines.
func measure(l limiter, keys []string, order []int32, ops int) (result, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	take, err := l.build()
	if err != nil {
		return result{}, err
	}
	for _, k := range keys {
		take(k)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	res := result{bytes: float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(len(keys))}

	mask := len(order) - 1
	start := time.Now()
	for i := 0; i < ops; i++ {
		take(keys[order[i&mask]])
	}
	res.serial = float64(time.Since(start).Nanoseconds()) / float64(ops)

	procs := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	start = time.Now()
	for g := 0; g < procs; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g * 7919; i < g*7919+ops/procs; i++ {
				take(keys[order[i&mask]])
			}
		}(g)
	}
	wg.Wait()
	res.parallel = float64(time.Since(start).Nanoseconds()) / float64(ops)
	runtime.KeepAlive(take)
	return res, nil
}
