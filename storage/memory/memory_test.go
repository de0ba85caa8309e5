package memory

import (
	"context"
	"fmt"
	"strconv"
	"sync"
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

// TestClockKeepsUsedKeys: with max_keys 4 (one shard), a new key evicts
// the first key the CLOCK hand finds unused since it last passed. Every
// key starts unused, so the first eviction evicts the first key from
// where the hand started; from then on, a key used again is passed over
// for one that was not.
func TestClockKeepsUsedKeys(t *testing.T) {
	s := newStore(t, algorithms.FixedWindow, 100, time.Hour, 4)
	now := 100 * sec
	for _, k := range []string{"a", "b", "c", "d"} {
		take(t, s, k, now)
	}
	take(t, s, "e", now) // evicts one of a..d
	if s.Evictions() != 1 || s.Len() != 4 {
		t.Fatalf("Evictions %d, Len %d; want 1 and 4", s.Evictions(), s.Len())
	}
	var kept []string
	for _, k := range []string{"a", "b", "c", "d"} {
		if _, ok, _ := s.Peek(context.Background(), k, now); ok {
			kept = append(kept, k)
		}
	}
	if len(kept) != 3 {
		t.Fatalf("kept %v of a..d, want 3 of them", kept)
	}
	// Use all but kept[1]: the next new key must evict it and no other.
	take(t, s, kept[0], now)
	take(t, s, kept[2], now)
	take(t, s, "e", now)
	take(t, s, "f", now)
	for _, k := range append(kept, "e", "f") {
		_, ok, _ := s.Peek(context.Background(), k, now)
		if want := k != kept[1]; ok != want {
			t.Errorf("%s held = %v, want %v: %s is the one key not used since the hand passed", k, ok, want, kept[1])
		}
	}
	checkConsistent(t, s)
}

func shardOfPeek(s *Store, key string, now int64) (algorithms.Decision, bool, error) {
	return s.Peek(context.Background(), key, now)
}

func shardOf(s *Store, key string) *shard {
	_, _, sh := s.locate(key)
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

// TestUnusedKeyGoesFirst: in a zone of 50 keys, where every key but one
// was used again after the hand last cleared the bits, a new key evicts
// that one, and new0 (used when it came) stays.
func TestUnusedKeyGoesFirst(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 5, time.Hour, 50)
	now := 100 * sec
	for i := 0; i < 50; i++ {
		take(t, s, strconv.Itoa(i), now)
	}
	// Every key starts unused: the first new key's hand evicts the
	// first key it finds, gone.
	take(t, s, "new0", now+sec)
	gone := -1
	for i := 0; i < 50; i++ {
		if _, ok, _ := s.Peek(context.Background(), strconv.Itoa(i), now); !ok {
			if gone >= 0 {
				t.Fatalf("%d and %d evicted for one new key", gone, i)
			}
			gone = i
		}
	}
	if gone < 0 {
		t.Fatal("no key evicted for a new key in a full zone")
	}
	unused := (gone + 1) % 50 // any key but gone
	for i := 0; i < 50; i++ {
		if i != unused && i != gone {
			take(t, s, strconv.Itoa(i), now+sec)
		}
	}
	take(t, s, "new0", now+sec) // asked for again: used
	take(t, s, "new1", now+2*sec)
	if _, ok, _ := s.Peek(context.Background(), strconv.Itoa(unused), now); ok {
		t.Fatalf("%d kept, want evicted: the one key not used since the hand passed", unused)
	}
	for i := 0; i < 50; i++ {
		if _, ok, _ := s.Peek(context.Background(), strconv.Itoa(i), now); !ok && i != unused && i != gone {
			t.Fatalf("%d evicted, want only %d gone", i, unused)
		}
	}
	checkConsistent(t, s)
}

// checkConsistent checks that the count and the tables agree, that the
// zone holds at most max_keys, and that every key is where a lookup finds
// it.
func checkConsistent(t *testing.T, s *Store) {
	t.Helper()
	live := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		checkTable(t, sh)
		if uint64(i) > s.mask && sh.n != 0 {
			t.Fatalf("shard %d of %d holds %d keys", i, s.mask+1, sh.n)
		}
		live += sh.n
		sh.mu.Unlock()
	}
	if s.Len() != live || (int64(live) > s.maxKeys && s.limit.Kind != algorithms.Concurrency) {
		t.Fatalf("inconsistent: %d keys in the tables, Len %d, max %d", live, s.Len(), s.maxKeys)
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

// TestPeekTellsGrant: the store's PeekGrant tells the quota granted to a
// key's window, for each window algorithm, until the window ends or a
// reset forgets the key.
func TestPeekTellsGrant(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindow, algorithms.SlidingLog} {
		t.Run(kind.String(), func(t *testing.T) {
			s := newStore(t, kind, 2, time.Minute, 0)
			now := 60 * sec * 1_000_000 // a window's start
			take(t, s, "a", now)
			if _, err := s.Grant(ctx, "a", now, 2000); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Grant(ctx, "a", now, 500); err != nil {
				t.Fatal(err)
			}
			if d, g, ok, _ := s.PeekGrant(ctx, "a", now+59*sec); !ok || g != 2500 || d.Remaining != 3 {
				t.Fatalf("PeekGrant(a) in the granted window = %+v, %d (held %v), want 3 remaining, 2500 granted", d, g, ok)
			}
			if _, g, _, _ := s.PeekGrant(ctx, "a", now+60*sec); g != 0 {
				t.Fatalf("PeekGrant(a) after the window: granted %d, want 0", g)
			}
			if _, err := s.Grant(ctx, "a", now+60*sec, 1000); err != nil {
				t.Fatal(err)
			}
			if ok, err := s.Reset(ctx, "a", now+60*sec); !ok || err != nil {
				t.Fatalf("Reset(a) = %v, %v", ok, err)
			}
			take(t, s, "a", now+60*sec)
			if _, g, _, _ := s.PeekGrant(ctx, "a", now+60*sec); g != 0 {
				t.Fatalf("PeekGrant(a) after a reset: granted %d, want 0", g)
			}
		})
	}
}
