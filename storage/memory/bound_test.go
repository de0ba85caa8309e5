package memory

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// TestFloodNeverPassesMaxKeys: goroutines push a flood of distinct keys
// through a zone of several shards; the zone never holds more than
// max_keys, every key beyond it is counted as an eviction, and the
// tables agree with the count.
func TestFloodNeverPassesMaxKeys(t *testing.T) {
	const maxKeys, workers, each = 4096, 4, 20_000
	s := newStore(t, algorithms.TokenBucket, 5, time.Hour, maxKeys)
	if s.mask == 0 {
		t.Fatalf("a zone of %d keys has one shard: the test wants several", maxKeys)
	}
	var wg sync.WaitGroup
	var over atomic.Int64
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				s.Take(context.Background(), "flood-"+strconv.Itoa(g)+"-"+strconv.Itoa(i), 100*sec, algorithms.Milli)
				if n := s.Len(); n > maxKeys {
					over.Add(1)
				}
			}
		}(g)
	}
	wg.Wait()
	if over.Load() > 0 {
		t.Fatalf("Len passed max_keys %d %d times", maxKeys, over.Load())
	}
	if s.Len() != maxKeys || s.Evictions() != workers*each-maxKeys {
		t.Fatalf("Len %d, Evictions %d; want %d and %d", s.Len(), s.Evictions(), maxKeys, workers*each-maxKeys)
	}
	checkConsistent(t, s)
	slots := 0
	for i := range s.shards {
		slots += s.shards[i].size
	}
	// Every shard's table at most twice what its share needs: a flood
	// cannot grow one past it, since an eviction in the shard makes room
	// for each new key.
	if slots > 4*maxKeys {
		t.Fatalf("%d slots for %d keys: the tables grew with the flood", slots, maxKeys)
	}
}

// keysInShard returns n keys whose shard in s is the shard at index i.
func keysInShard(s *Store, i, n int) []string {
	var keys []string
	for k := 0; len(keys) < n; k++ {
		key := "k" + strconv.Itoa(k)
		if shardOf(s, key) == &s.shards[i] {
			keys = append(keys, key)
		}
	}
	return keys
}

// TestEvictFromAnotherShard: in a full zone, a new key whose shard holds
// no other evicts one from a shard that does, and the count stays exact;
// when that shard is busy, the zone holds one key more until the new
// key's decision is done, and then evicts it.
func TestEvictFromAnotherShard(t *testing.T) {
	const maxKeys = 2048
	s := newStore(t, algorithms.TokenBucket, 5, time.Hour, maxKeys)
	if s.mask != 1 {
		t.Fatalf("a zone of %d keys has %d shards, want 2", maxKeys, s.mask+1)
	}
	for _, k := range keysInShard(s, 0, maxKeys) {
		take(t, s, k, 100*sec)
	}
	lone := keysInShard(s, 1, 2)
	take(t, s, lone[0], 100*sec)
	if s.Len() != maxKeys || s.Evictions() != 1 || s.shards[1].n != 1 {
		t.Fatalf("Len %d, Evictions %d, %d keys in the new key's shard; want %d, 1 and 1", s.Len(), s.Evictions(), s.shards[1].n, maxKeys)
	}
	checkConsistent(t, s)

	// Shard 1 holds lone[0]: empty it, then keep shard 0 busy while a
	// new key comes to shard 1.
	if ok, _ := s.Reset(context.Background(), lone[0], 100*sec); !ok {
		t.Fatal("Reset of the lone key: not held")
	}
	fill := keysInShard(s, 0, maxKeys+1)[maxKeys] // a new key in shard 0
	take(t, s, fill, 100*sec)
	if s.Len() != maxKeys || s.Evictions() != 1 || s.shards[1].n != 0 {
		t.Fatalf("refilled: Len %d, Evictions %d, %d keys in shard 1; want %d, 1 and 0", s.Len(), s.Evictions(), s.shards[1].n, maxKeys)
	}
	sh0 := &s.shards[0]
	sh0.mu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Take(context.Background(), lone[1], 100*sec, algorithms.Milli)
	}()
	for s.Len() != maxKeys+1 {
		runtime.Gosched()
	}
	sh0.mu.Unlock()
	<-done
	if s.Len() != maxKeys || s.Evictions() != 2 {
		t.Fatalf("after the busy shard was free: Len %d, Evictions %d; want %d and 2", s.Len(), s.Evictions(), maxKeys)
	}
	checkConsistent(t, s)
}

// TestDecisionsAllocateNothing: every operation on a key the store holds,
// and a new key through a full zone (an eviction each), allocates
// nothing, for every algorithm (a sliding_log once its ring holds its
// events).
func TestDecisionsAllocateNothing(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.SlidingLog, algorithms.FixedWindow, algorithms.LeakyBucket} {
		s := newStore(t, kind, 50, time.Second, 64)
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = "key-" + strconv.Itoa(i)
		}
		now := 100 * sec
		for i := 0; i < 10_000; i++ { // fills the zone, and grows every ring
			now += 1000
			s.Take(ctx, keys[i%64], now, algorithms.Milli)
		}
		i := 0
		ops := map[string]func(){
			"Take": func() { now += 1000; s.Take(ctx, keys[i%64], now, algorithms.Milli); i++ },
			"Peek": func() { s.Peek(ctx, keys[i%64], now); i++ },
			"Undo": func() {
				now += 1000
				d, _ := s.Take(ctx, keys[i%64], now, algorithms.Milli)
				_ = s.Undo(ctx, keys[i%64], now, algorithms.Milli, d)
				i++
			},
			"Seed": func() {
				now += 1000
				s.Seed(keys[i%64], algorithms.Decision{Allowed: true, Remaining: 3, Reset: sec, At: now}, algorithms.Milli, true)
				i++
			},
			"Take, a new key evicting one": func() {
				now += 1000
				s.Take(ctx, keys[64+i%900], now, algorithms.Milli)
				i++
			},
		}
		if kind == algorithms.SlidingLog {
			delete(ops, "Take, a new key evicting one") // a new key's ring grows from none
			delete(ops, "Seed")
		}
		for name, op := range ops {
			if n := testing.AllocsPerRun(500, op); n != 0 {
				t.Errorf("%s: %s: %v allocations, want 0", kind, name, n)
			}
		}
	}
}

// TestConcurrentTakesMatchReference: goroutines take a few keys at once,
// many to a shard, in phases on a fake clock; within a phase every
// decision has the same now and cost, so the admissions of each key add
// up to what the same number of takes admit one after another. Each
// phase's admissions, and each key's state after it, must match a
// reference run on a plain State: a decision whose update was lost to
// another would admit too many. The windows run twice: with counts a
// packed slot holds, and with 10 million events and costs of 100,000,
// whose counts pass 2^32 milli-units within the first phase, so that
// shards widen while other goroutines wait on them.
func TestConcurrentTakesMatchReference(t *testing.T) {
	const workers, keys, takes = 8, 5, 40
	type config struct {
		kind         algorithms.Kind
		events, cost int64
	}
	var configs []config
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.SlidingLog, algorithms.FixedWindow, algorithms.LeakyBucket} {
		configs = append(configs, config{kind, 60, algorithms.Milli})
	}
	configs = append(configs, config{algorithms.SlidingWindow, 10_000_000, 100_000 * algorithms.Milli}, config{algorithms.FixedWindow, 10_000_000, 100_000 * algorithms.Milli})
	for _, c := range configs {
		kind, cost := c.kind, c.cost
		l := mustLimit(t, kind, c.events, 10*time.Second)
		s := New(storage.Zone{Name: "z", Limit: l})
		ref := make([]algorithms.State, keys)
		now := 1000 * sec
		for phase := 0; phase < 12; phase++ {
			now += int64(phase%4) * 700_000 // some phases at the same time
			var admitted [keys]atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < workers; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for i := 0; i < takes; i++ {
						k := (g + i) % keys
						if d, _ := s.Take(context.Background(), "key-"+strconv.Itoa(k), now, cost); d.Allowed {
							admitted[k].Add(1)
						}
					}
				}(g)
			}
			wg.Wait()
			for k := 0; k < keys; k++ {
				want := int64(0)
				for i := 0; i < workers*takes/keys; i++ {
					if l.Take(&ref[k], now, cost).Allowed {
						want++
					}
				}
				if got := admitted[k].Load(); got != want {
					t.Fatalf("%s phase %d key %d: %d admitted, want %d", kind, phase, k, got, want)
				}
				got, _, _ := s.Peek(context.Background(), "key-"+strconv.Itoa(k), now)
				if wantD := l.Peek(&ref[k], now, algorithms.Milli); got != wantD {
					t.Fatalf("%s phase %d key %d: Peek %+v, reference %+v", kind, phase, k, got, wantD)
				}
			}
		}
		if packs(&l) && cost > algorithms.Milli {
			for i := range s.shards {
				if sh := &s.shards[i]; sh.n > 0 && sh.packed {
					t.Errorf("%s, cost %d: a shard of %d keys still packed, want every shard with a key widened", kind, cost, sh.n)
				}
			}
		}
	}
}
