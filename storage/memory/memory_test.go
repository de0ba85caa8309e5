package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

const sec = int64(time.Second / time.Microsecond)

func newStore(t testing.TB, kind algorithms.Kind, events int64, window time.Duration, maxKeys int) *Store {
	t.Helper()
	l, err := algorithms.NewLimit(kind, events, window, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return New(storage.Zone{Name: "z", Limit: l, MaxKeys: maxKeys})
}

func take(t *testing.T, s *Store, key string, now int64) algorithms.Decision {
	t.Helper()
	d, err := s.Take(context.Background(), key, now, algorithms.Milli)
	if err != nil {
		t.Fatalf("Take(%q): %v", key, err)
	}
	return d
}

func TestTakeIsolatesKeys(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 2, time.Minute, 0)
	now := 100 * sec
	for i, want := range []bool{true, true, false} {
		if got := take(t, s, "a", now).Allowed; got != want {
			t.Fatalf("step %d: Take(a) = %v, want %v", i, got, want)
		}
	}
	if !take(t, s, "b", now).Allowed {
		t.Fatal("Take(b) after a was exhausted = false, want true: keys must not share state")
	}
	if got := s.Len(); got != 2 {
		t.Fatalf("Len() = %d, want 2", got)
	}
}

func TestMaxKeysEvictsLeastRecentlyUsed(t *testing.T) {
	// MaxKeys 1: the one key held goes for the next.
	s := newStore(t, algorithms.TokenBucket, 1, time.Hour, 1)
	now := 100 * sec
	take(t, s, "a", now)
	if take(t, s, "a", now).Allowed {
		t.Fatal("second Take(a) allowed, want rejected")
	}
	take(t, s, "b", now) // evicts a
	if got := s.Evictions(); got != 1 {
		t.Fatalf("Evictions() = %d, want 1", got)
	}
	if _, ok, _ := s.Peek(context.Background(), "a", now); ok {
		t.Fatal("a still held after eviction")
	}
	if !take(t, s, "a", now).Allowed {
		t.Fatal("Take(a) after eviction = false, want true (fresh state)")
	}
}

func TestMaxKeysBound(t *testing.T) {
	for _, maxKeys := range []int{1, 3, 64, 100, 1000} {
		s := newStore(t, algorithms.FixedWindow, 5, time.Hour, maxKeys)
		for i := 0; i < 5*maxKeys; i++ {
			take(t, s, strconv.Itoa(i), 100*sec)
		}
		if got := s.Len(); got > maxKeys || got == 0 {
			t.Errorf("max_keys %d: Len() = %d, want 1..%d", maxKeys, got, maxKeys)
		}
		if got, want := s.Evictions(), int64(5*maxKeys-s.Len()); got != want {
			t.Errorf("max_keys %d: Evictions() = %d, want %d", maxKeys, got, want)
		}
	}
}

// TestRecencyKeptToHalfTheList: with max_keys 4, a key is moved to the
// front by a decision only once 2 moves came after its own; in the front
// half it stays where it is, and may go before a key used earlier.
func TestRecencyKeptToHalfTheList(t *testing.T) {
	s := newStore(t, algorithms.FixedWindow, 100, time.Hour, 4)
	now := 100 * sec
	for _, k := range []string{"a", "b", "c", "d"} {
		take(t, s, k, now) // the list, front first: d c b a
	}
	take(t, s, "a", now) // 3 moves since a's: to the front (a d c b)
	take(t, s, "d", now) // 1 move since d's: stays (a d c b)
	take(t, s, "e", now) // evicts b
	if _, ok, _ := shardOfPeek(s, "b", now); ok {
		t.Fatal("b kept, want evicted: the least recently used")
	}
	if _, ok, _ := shardOfPeek(s, "a", now); !ok {
		t.Fatal("a evicted, want kept: moved to the front")
	}
	take(t, s, "f", now) // evicts c
	take(t, s, "g", now) // evicts d: used after a, but never moved
	for k, want := range map[string]bool{"a": true, "c": false, "d": false, "e": true, "f": true, "g": true} {
		if _, ok, _ := shardOfPeek(s, k, now); ok != want {
			t.Errorf("%s held = %v, want %v", k, ok, want)
		}
	}
	checkConsistent(t, s)
}

func shardOfPeek(s *Store, key string, now int64) (algorithms.Decision, bool, error) {
	return s.Peek(context.Background(), key, now)
}

func shardOf(s *Store, key string) *shard {
	_, sh := s.locate(key)
	return sh
}

// sameShard returns n keys that share a shard of s.
func sameShard(s *Store, n int) []string {
	keys := []string{"k0"}
	for i := 1; len(keys) < n; i++ {
		if k := "k" + strconv.Itoa(i); shardOf(s, k) == shardOf(s, keys[0]) {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestSmallMaxKeysKeepsLiveKeys is the reproduction: rate 1/h,
// max_keys 100, two keys that share a shard alternating. The store used
// to give each shard max_keys/64 keys (here one), so the two evicted each
// other on every request and 40 of 40 passed; only 2 may.
func TestSmallMaxKeysKeepsLiveKeys(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 1, time.Hour, 100)
	keys := sameShard(s, 2)
	admitted := 0
	for i := 0; i < 40; i++ {
		if take(t, s, keys[i%2], 100*sec+int64(i)).Allowed {
			admitted++
		}
	}
	if admitted != 2 || s.Evictions() != 0 {
		t.Fatalf("two keys alternating under max_keys 100: %d of 40 admitted, %d evictions; want 2 and 0", admitted, s.Evictions())
	}
}

// TestNoEvictionBelowMaxKeys: a zone holds exactly max_keys keys, however
// they fall into shards, before it evicts anything; then one key out per
// key in.
func TestNoEvictionBelowMaxKeys(t *testing.T) {
	for _, maxKeys := range []int{1, 2, 63, 100, 1000} {
		s := newStore(t, algorithms.TokenBucket, 5, time.Hour, maxKeys)
		for i := 0; i < maxKeys; i++ {
			take(t, s, strconv.Itoa(i), 100*sec)
		}
		if s.Len() != maxKeys || s.Evictions() != 0 {
			t.Fatalf("max_keys %d, %d keys: Len %d, Evictions %d; want %d and 0", maxKeys, maxKeys, s.Len(), s.Evictions(), maxKeys)
		}
		for i := 0; i < 10; i++ {
			take(t, s, "more"+strconv.Itoa(i), 100*sec)
		}
		if s.Len() != maxKeys || s.Evictions() != 10 {
			t.Fatalf("max_keys %d, 10 more keys: Len %d, Evictions %d; want %d and 10", maxKeys, s.Len(), s.Evictions(), maxKeys)
		}
		checkConsistent(t, s)
	}
}

// TestEvictionOrderAcrossShards: the zone's least recently used key goes
// first, whichever shard it is in.
func TestEvictionOrderAcrossShards(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 5, time.Hour, 50)
	now := 100 * sec
	for i := 0; i < 50; i++ {
		take(t, s, strconv.Itoa(i), now)
	}
	// Use all but 7 and 31 again: those two are now the least recently
	// used, in order.
	for i := 0; i < 50; i++ {
		if i != 7 && i != 31 {
			take(t, s, strconv.Itoa(i), now+sec)
		}
	}
	take(t, s, "31", now+2*sec) // 7 is the oldest now
	take(t, s, "new1", now+2*sec)
	if _, ok, _ := s.Peek(context.Background(), "7", now); ok {
		t.Fatal("7 kept, want evicted: it is the zone's least recently used key")
	}
	for i := 0; i < 50; i++ {
		if _, ok, _ := s.Peek(context.Background(), strconv.Itoa(i), now); !ok && i != 7 {
			t.Fatalf("%d evicted, want only 7 gone", i)
		}
	}
}

// checkConsistent checks that the eviction list, the count and the tables
// agree, and that every entry is where a lookup finds it.
func checkConsistent(t *testing.T, s *Store) {
	t.Helper()
	live := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		checkTable(t, sh)
		for _, sl := range sh.slots {
			if sl.e != nil && !sl.e.evicted.Load() {
				live++
			}
		}
		sh.mu.Unlock()
	}
	s.list.mu.Lock()
	defer s.list.mu.Unlock()
	listed := 0
	for e := s.list.head; e != nil; e = e.next {
		listed++
	}
	if int64(live) != s.list.n || int64(listed) != s.list.n || s.Len() != live || (int64(live) > s.maxKeys && s.limit.Kind != algorithms.Concurrency) {
		t.Fatalf("inconsistent: %d live in maps, %d listed, n %d, Len %d, max %d", live, listed, s.list.n, s.Len(), s.maxKeys)
	}
}

func TestSweepForgetsOnlyFreshKeys(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 10, 10*time.Second, 0)
	now := 100 * sec
	take(t, s, "old", now)
	take(t, s, "new", now+900_000) // 0.9s later
	// One event refills in 1s: at now+1s "old" is full again, "new" is not.
	if n := s.Sweep(now + sec); n != 1 {
		t.Fatalf("Sweep() = %d, want 1", n)
	}
	if _, ok, _ := s.Peek(context.Background(), "old", now+sec); ok {
		t.Error("old still held after sweep, want forgotten")
	}
	d, ok, _ := s.Peek(context.Background(), "new", now+sec)
	if !ok {
		t.Fatal("new forgotten by sweep, want kept")
	}
	if d.Remaining != 9 {
		t.Errorf("new: Remaining = %d, want 9", d.Remaining)
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len() = %d, want 1", got)
	}
}

func TestResetAndUndo(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 1, time.Hour, 0)
	ctx := context.Background()
	now := 100 * sec
	d := take(t, s, "a", now)
	if err := s.Undo(ctx, "a", now, algorithms.Milli, d); err != nil {
		t.Fatal(err)
	}
	if !take(t, s, "a", now).Allowed {
		t.Fatal("Take after Undo = false, want true")
	}
	if ok, _ := s.Reset(ctx, "a", now); !ok {
		t.Fatal("Reset(a) = false, want true")
	}
	if ok, _ := s.Reset(ctx, "a", now); ok {
		t.Fatal("second Reset(a) = true, want false")
	}
	if !take(t, s, "a", now).Allowed {
		t.Fatal("Take after Reset = false, want true")
	}
	if err := s.Undo(ctx, "missing", now, algorithms.Milli, d); err != nil {
		t.Fatalf("Undo(missing) = %v, want nil", err)
	}
}

func TestConcurrentTakesAdmitExactlyBurst(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 1000, time.Hour, 0)
	var admitted sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for g := 0; g < 16; g++ {
		admitted.Add(1)
		go func() {
			defer admitted.Done()
			for i := 0; i < 200; i++ {
				d, _ := s.Take(context.Background(), "hot", 100*sec, algorithms.Milli)
				if d.Allowed {
					mu.Lock()
					n++
					mu.Unlock()
				}
			}
		}()
	}
	admitted.Wait()
	if n != 1000 {
		t.Fatalf("admitted %d of 3200, want exactly 1000", n)
	}
}

// BenchmarkTake measures one decision on the memory store, with one hot key
// and with 100,000 keys, serial and parallel; and, serial, with 10,000 and
// 100,000 keys taken in random order, as clients come (taken in the order
// they were inserted, the store's memory is read in order, which the
// processor fetches ahead).
func BenchmarkTake(b *testing.B) {
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.SlidingLog, algorithms.FixedWindow, algorithms.LeakyBucket} {
		for _, keys := range []int{1, 100_000} {
			for _, mode := range []string{"serial", "parallel"} {
				b.Run(fmt.Sprintf("alg=%s/keys=%d/%s", kind, keys, mode), func(b *testing.B) {
					benchTake(b, kind, keys, mode)
				})
			}
		}
		for _, keys := range []int{10_000, 100_000} {
			b.Run(fmt.Sprintf("alg=%s/keys=%d/random", kind, keys), func(b *testing.B) {
				benchTake(b, kind, keys, "random")
			})
		}
	}
}

// benchTake runs one BenchmarkTake case; mode is serial, parallel or
// random (serial, the keys in random order).
func benchTake(b *testing.B, kind algorithms.Kind, nkeys int, mode string) {
	l := benchLimit(b, kind)
	s := New(storage.Zone{Name: "bench", Limit: l})
	keys := make([]string, nkeys)
	ctx := context.Background()
	for i := range keys {
		keys[i] = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
		s.Take(ctx, keys[i], 1, algorithms.Milli)
	}
	// The clock is the handler's business: the store is given now. It
	// advances 1µs a decision, as under a million decisions a second.
	var clock atomic.Int64
	clock.Store(1)
	b.ReportAllocs()
	b.ResetTimer()
	switch mode {
	case "random":
		rng := rand.New(rand.NewPCG(1, 2))
		order := make([]int32, 1<<16)
		for i := range order {
			order[i] = int32(rng.IntN(nkeys))
		}
		now := int64(1)
		for i := 0; b.Loop(); i++ {
			now++
			s.Take(ctx, keys[order[i%len(order)]], now, algorithms.Milli)
		}
		return
	case "serial":
		now := int64(1)
		for i := 0; b.Loop(); i++ {
			now++
			s.Take(ctx, keys[i%nkeys], now, algorithms.Milli)
		}
		return
	}
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1)) * 7919
		for pb.Next() {
			i++
			s.Take(ctx, keys[i%nkeys], clock.Add(1), algorithms.Milli)
		}
	})
}

// benchLimit is a limit of kind that admits most requests, so that the
// allowed path is measured: a million a second, or for a sliding_log
// (which keeps an entry per event) 100.
func benchLimit(b *testing.B, kind algorithms.Kind) algorithms.Limit {
	l, err := algorithms.NewLimit(kind, 1_000_000, time.Second, 0, 0)
	if kind == algorithms.SlidingLog {
		l, err = algorithms.NewLimit(kind, 100, time.Second, 0, 0)
	}
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkBytesPerKey reports the memory store's heap bytes per key for
// each algorithm: 100,000 keys with one request each, and for sliding_log
// also a zone of 100,000 events per hour after 1 and after 100 requests per
// key (its log grows with its entries, not with events).
func BenchmarkBytesPerKey(b *testing.B) {
	type config struct {
		name     string
		kind     algorithms.Kind
		events   int64
		requests int
	}
	var configs []config
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.SlidingLog, algorithms.FixedWindow, algorithms.LeakyBucket} {
		configs = append(configs, config{"alg=" + kind.String(), kind, 100, 1})
	}
	configs = append(configs,
		config{"alg=sliding_log/events=100000/requests=1", algorithms.SlidingLog, 100_000, 1},
		config{"alg=sliding_log/events=100000/requests=100", algorithms.SlidingLog, 100_000, 100},
	)
	for _, c := range configs {
		b.Run(c.name, func(b *testing.B) {
			const n = 100_000
			l, err := algorithms.NewLimit(c.kind, c.events, time.Hour, 0, 0)
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, n)
			for i := range keys {
				keys[i] = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
			}
			var perKey float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				s := New(storage.Zone{Name: "mem", Limit: l})
				for r := 0; r < c.requests; r++ {
					for _, k := range keys {
						s.Take(context.Background(), k, int64(1+r), algorithms.Milli)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perKey = float64(after.HeapAlloc-before.HeapAlloc) / n
				runtime.KeepAlive(s)
			}
			b.ReportMetric(perKey, "bytes/key")
		})
	}
}

// TestConcurrencyKeysAreNeverEvicted: a flood of other keys through a
// small max_keys must not evict a key's slots in flight (that would free
// them: more requests in flight than the limit), and a key whose last
// request ends is forgotten at once.
func TestConcurrencyKeysAreNeverEvicted(t *testing.T) {
	l, err := algorithms.NewConcurrency(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s := New(storage.Zone{Name: "cc", Limit: l, MaxKeys: 4})
	ctx := context.Background()
	var held []algorithms.Decision
	for i := 0; i < 2; i++ {
		d, _ := s.Take(ctx, "victim", 0, algorithms.Milli)
		held = append(held, d)
	}
	for i := 0; i < 100; i++ {
		key := fmt.Sprint("flood-", i)
		d, _ := s.Take(ctx, key, 0, algorithms.Milli)
		if !d.Allowed {
			t.Fatalf("flood key %d rejected", i)
		}
		if i%2 == 0 {
			_ = s.Undo(ctx, key, 0, algorithms.Milli, d)
		}
	}
	if d, _ := s.Take(ctx, "victim", 0, algorithms.Milli); d.Allowed {
		t.Fatal("a third request of the victim admitted after a flood of other keys: its slots were evicted")
	}
	if n := s.Len(); n != 51 {
		t.Errorf("Len %d, want 51: the victim and the 50 flood keys still in flight", n)
	}
	for _, d := range held {
		_ = s.Undo(ctx, "victim", 0, algorithms.Milli, d)
	}
	if n := s.Len(); n != 50 {
		t.Errorf("Len %d after the victim's requests ended, want 50", n)
	}
	checkConsistent(t, s)
}
