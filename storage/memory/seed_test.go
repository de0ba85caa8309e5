package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// TestSeedFollowsTheSharedState: a store that follows another's clock and
// is seeded from its decisions decides, on its own, as the shared state
// would: at the shared clock's time, however far this instance's clock is
// from it, and with the shared state's windows.
func TestSeedFollowsTheSharedState(t *testing.T) {
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.FixedWindow, algorithms.SlidingWindow, algorithms.SlidingLog} {
		t.Run(kind.String(), func(t *testing.T) {
			l, err := algorithms.NewLimit(kind, 3, time.Minute, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			shared := New(storage.Zone{Name: "shared", Limit: l})
			local := New(storage.Zone{Name: "local", Limit: l})
			var offset atomic.Int64
			local.Follow(&offset)

			// The shared clock is 1000s (and a half window) ahead of
			// this instance's: its window ends 30s after the decisions.
			sharedNow := 1000*60*sec + 30*sec
			mine := 7 * sec
			offset.Store(sharedNow - mine)
			for range 3 {
				d := take(t, shared, "k", sharedNow)
				local.Seed("k", d, algorithms.Milli, d.Allowed)
			}
			if d := take(t, local, "k", mine); d.Allowed {
				t.Fatalf("the copy admitted a 4th request of 3: %+v", d)
			}
			// Once the shared state would admit again, so does the copy:
			// half a window on for the windows (the next window), a
			// window on for all.
			later := int64(60 * sec)
			if kind == algorithms.FixedWindow {
				later = 30 * sec
			}
			if want := take(t, shared, "k", sharedNow+later); !want.Allowed {
				t.Fatalf("the shared state rejects %s on: %+v", time.Duration(later)*time.Microsecond, want)
			}
			if d := take(t, local, "k", mine+later); !d.Allowed {
				t.Fatalf("the copy rejects %s on, where the shared state admits: %+v", time.Duration(later)*time.Microsecond, d)
			}
			if d, ok, _ := local.Peek(context.Background(), "k", mine+later); !ok || d.At != sharedNow+later {
				t.Fatalf("Peek on the copy = %+v, %v: want it timed by the shared clock (%d)", d, ok, sharedNow+later)
			}
		})
	}
}

// TestSeedAddsOnlyKeysThatAreNotFresh: a decision that leaves the shared
// state fresh (a request of cost 0, or a concurrency store's) adds no
// key, and seeded keys count against MaxKeys like any.
func TestSeedAddsOnlyKeysThatAreNotFresh(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 2, time.Minute, 2)
	now := 100 * sec
	s.Seed("fresh", algorithms.Decision{Allowed: true, Remaining: 2, At: now}, 0, false)
	if s.Len() != 0 {
		t.Fatalf("a fresh copy was added: Len() = %d", s.Len())
	}
	for _, k := range []string{"a", "b", "c"} {
		s.Seed(k, algorithms.Decision{Allowed: true, Remaining: 1, Reset: 30 * sec, At: now}, algorithms.Milli, true)
	}
	if s.Len() != 2 || s.Evictions() != 1 {
		t.Fatalf("after 3 seeds in a store of 2 keys: Len() = %d, Evictions() = %d, want 2 and 1", s.Len(), s.Evictions())
	}
	if d, ok, _ := s.Peek(context.Background(), "c", now); !ok || d.Remaining != 1 {
		t.Fatalf("Peek(c) = %+v, %v, want the seeded state (1 left)", d, ok)
	}

	c := newStore(t, algorithms.TokenBucket, 2, time.Minute, 0)
	cl, err := algorithms.NewConcurrency(2, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.limit = cl
	c.Seed("k", algorithms.Decision{Allowed: true, Remaining: 1, Reset: sec, At: now}, algorithms.Milli, true)
	if c.Len() != 0 {
		t.Fatalf("a concurrency store was seeded: Len() = %d", c.Len())
	}
}

// BenchmarkSeed measures what a Redis decision costs this instance to keep
// its key's local copy (on_storage_error local): one Seed, keys in random
// order, beside BenchmarkTake's random case, the memory store's own
// decision.
func BenchmarkSeed(b *testing.B) {
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.SlidingLog} {
		for _, nkeys := range []int{10_000, 100_000} {
			b.Run(fmt.Sprintf("alg=%s/keys=%d/random", kind, nkeys), func(b *testing.B) {
				l := benchLimit(b, kind)
				shared := New(storage.Zone{Name: "shared", Limit: l})
				local := New(storage.Zone{Name: "local", Limit: l})
				var lead atomic.Int64
				local.Follow(&lead)
				keys := make([]string, nkeys)
				ctx := context.Background()
				for i := range keys {
					keys[i] = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
					d, _ := shared.Take(ctx, keys[i], 1, algorithms.Milli)
					local.Seed(keys[i], d, algorithms.Milli, true)
				}
				// The decisions to seed from, as Redis would return them,
				// each seeded once (a reply seeded again is merged, and a
				// sliding_log copy would count its entries twice): made
				// anew, the timer stopped, once all are seeded.
				rng := rand.New(rand.NewPCG(1, 2))
				order := make([]int32, 1<<16)
				ds := make([]algorithms.Decision, len(order))
				now := int64(2)
				decide := func() {
					for i := range order {
						order[i] = int32(rng.IntN(nkeys))
						ds[i], _ = shared.Take(ctx, keys[order[i]], now, algorithms.Milli)
						now++
					}
				}
				decide()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					j := i % len(order)
					if j == 0 && i > 0 {
						b.StopTimer()
						decide()
						b.StartTimer()
					}
					local.Seed(keys[order[j]], ds[j], algorithms.Milli, true)
				}
			})
		}
	}
}

// TestSeedNeverGoesBack: replies seeded out of order leave the copy where
// the latest left it, for every algorithm with a state to copy; Reseed,
// which follows a reset, takes it back. Before, the copy took whichever
// reply came last: seeded from decisions 1, 3, 2, it admitted a 4th
// request of 3.
func TestSeedNeverGoesBack(t *testing.T) {
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.LeakyBucket, algorithms.FixedWindow, algorithms.SlidingWindow, algorithms.SlidingLog} {
		t.Run(kind.String(), func(t *testing.T) {
			l, err := algorithms.NewLimit(kind, 3, time.Minute, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			shared := New(storage.Zone{Name: "shared", Limit: l})
			local := New(storage.Zone{Name: "local", Limit: l})
			now := 1000 * 60 * sec
			var ds [3]algorithms.Decision
			for i := range ds {
				ds[i] = take(t, shared, "k", now+int64(i)*sec)
			}
			for _, i := range []int{0, 2, 1, 0} {
				local.Seed("k", ds[i], algorithms.Milli, true)
			}
			if d, _, _ := local.Peek(context.Background(), "k", now+3*sec); d.Allowed {
				t.Fatalf("seeded 1, 3, 2, 1, the copy admits a 4th request of 3: %+v", d)
			}
			// The key is reset on the shared store, which then charges
			// one request: the copy follows.
			if _, err := shared.Reset(context.Background(), "k", now+4*sec); err != nil {
				t.Fatal(err)
			}
			d := take(t, shared, "k", now+4*sec)
			local.Reseed("k", d)
			if got, _, _ := local.Peek(context.Background(), "k", now+4*sec); !got.Allowed || got.Remaining != 2 {
				t.Fatalf("reseeded after a reset, the copy decides %+v, want 2 left", got)
			}
		})
	}
}
