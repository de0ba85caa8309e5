package memory

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// checkTable checks a shard's table: its size, its count, and that every
// key is found from its home slot by find.
func checkTable(t *testing.T, sh *shard) {
	t.Helper()
	if n := sh.size; n != 0 && (n < 8 || n&(n-1) != 0) {
		t.Fatalf("table of %d slots, want 0 or a power of two of at least 8", n)
	}
	if len(sh.words) != sh.size*sh.stride || sh.log && len(sh.logs) != sh.size {
		t.Fatalf("table of %d slots has %d words of stride %d, %d logs", sh.size, len(sh.words), sh.stride, len(sh.logs))
	}
	if sh.packed && sh.stride != bucketStride {
		t.Fatalf("packed table of stride %d", sh.stride)
	}
	// A 32-byte slot must not cross a cache line: the table starts on a
	// multiple of 32 bytes.
	if sh.stride == bucketStride && sh.size > 0 && uintptr(unsafe.Pointer(&sh.words[0]))%32 != 0 {
		t.Fatalf("table of %d 32-byte slots at %p: not 32-byte aligned", sh.size, &sh.words[0])
	}
	used := 0
	for i := 0; i < sh.size; i++ {
		b := i * sh.stride
		tag := sh.words[b+1]
		if tag == 0 {
			if sh.log && sh.logs[i] != nil {
				t.Fatalf("empty slot %d keeps a log", i)
			}
			continue
		}
		used++
		if got := sh.find(sh.words[b], tag&^refBit); got != i {
			t.Fatalf("key %x/%x in slot %d, find says %d", sh.words[b], tag, i, got)
		}
	}
	if used != sh.n {
		t.Fatalf("%d slots used, n says %d", used, sh.n)
	}
	if used*16 > sh.size*maxFill {
		t.Fatalf("%d of %d slots used: more than %d/16", used, sh.size, maxFill)
	}
}

// TestTableMatchesModel drives one shard's table with adds, state
// writes, deletes, CLOCK evictions and shrinks against a Go map, for every
// layout: the bucket family's, a packed window's (whose states fit, and
// one given a state that does not, which widens it midway), a calendar
// window's wide slots, and a sliding_log's rings. The hashes are chosen,
// not computed: a few homes in a small table, so that probe sequences
// collide, run into each other and wrap around the table's end, and some
// keys share a whole hash (the tag must tell them apart). Each key's state
// and log are its own values: a key moved by a shift, a resize or a
// widening must keep them.
func TestTableMatchesModel(t *testing.T) {
	calendar, err := algorithms.NewCalendarLimit(10, algorithms.Calendar{Unit: algorithms.Day, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		limit algorithms.Limit
		widen bool // some states do not fit a packed slot
	}{
		{"token_bucket", mustLimit(t, algorithms.TokenBucket, 10, time.Second), false},
		{"sliding_window", mustLimit(t, algorithms.SlidingWindow, 10, time.Second), false},
		{"sliding_window/widened", mustLimit(t, algorithms.SlidingWindow, 10, time.Second), true},
		{"fixed_window/calendar", calendar, false},
		{"sliding_log", mustLimit(t, algorithms.SlidingLog, 10, time.Second), false},
	} {
		kind, widened := c.name, 0
		for seed := uint64(0); seed < 200; seed++ {
			rng := rand.New(rand.NewPCG(seed, 7))
			var sh shard
			sh.init(&c.limit)
			packed := sh.packed
			model := map[int]algorithms.State{}
			// 5 homes (above the shard's bits) and 2 keys a hash;
			// homes near the end of an 8- or 16-slot table.
			hashOf := func(k int) (h, tag uint64) {
				return uint64(5+k/2%5)<<shardBits + 3, uint64(k)<<(genShift+16) | usedBit
			}
			stateOf := func(k, v int) algorithms.State {
				st := algorithms.State{At: int64(k) << 40, Level: int64(v)}
				if c.limit.Kind != algorithms.TokenBucket {
					// Within a packed slot's bounds, at both ends.
					st.Prev, st.Head = int64(k)<<25, -int64(v+k)<<22
					if k%2 == 0 {
						st.Level, st.Head = 1<<32-1-int64(v), 1<<31-1-int64(k)
					}
				}
				if c.widen && rng.IntN(40) == 0 {
					st.Level = 1 << 32 // a packed slot's count cannot hold it
				}
				if sh.log {
					st.Log = []int64{int64(k), int64(v)}
				}
				return st
			}
			for step := 0; step < 300; step++ {
				k := rng.IntN(40)
				h, tag := hashOf(k)
				switch op := rng.IntN(12); {
				case op < 6: // add, or write the state of a key held
					i := sh.find(h, tag)
					if i < 0 {
						i = sh.add(h, tag)
					}
					st := stateOf(k, step)
					sh.setState(i, &st)
					model[k] = st
				case op < 9: // delete
					if i := sh.find(h, tag); i >= 0 {
						sh.deleteAt(i)
					}
					delete(model, k)
				case op < 11: // evict
					if sh.n == 0 {
						continue
					}
					sh.evict()
					gone := 0
					for k := range model {
						if h, tag := hashOf(k); sh.find(h, tag) < 0 {
							delete(model, k)
							gone++
						}
					}
					if gone != 1 {
						t.Fatalf("%s seed %d step %d: evict removed %d keys, want 1", kind, seed, step, gone)
					}
				default:
					sh.shrink()
				}
				checkTable(t, &sh)
				if sh.n != len(model) {
					t.Fatalf("%s seed %d step %d: %d keys, model %d", kind, seed, step, sh.n, len(model))
				}
				for k := 0; k < 40; k++ {
					h, tag := hashOf(k)
					i := sh.find(h, tag)
					want, held := model[k]
					if (i >= 0) != held {
						t.Fatalf("%s seed %d step %d: key %d found %v, model %v", kind, seed, step, k, i >= 0, held)
					}
					if held {
						got := sh.state(i)
						if got.At != want.At || got.Level != want.Level || got.Prev != want.Prev || got.Head != want.Head || len(got.Log) != len(want.Log) || len(got.Log) > 0 && got.Log[1] != want.Log[1] {
							t.Fatalf("%s seed %d step %d: key %d holds %+v, want %+v", kind, seed, step, k, got, want)
						}
					}
				}
			}
			if packed && !sh.packed {
				if !c.widen {
					t.Fatalf("%s seed %d: widened, with every state within a packed slot's bounds", kind, seed)
				}
				widened++
			}
		}
		if c.widen && widened < 100 {
			t.Fatalf("%s: %d of 200 runs widened their table, want most", kind, widened)
		}
	}
}

// TestSlotStride: a slot holds every State field its algorithm keeps, and
// no more: the bucket family's two words and the others' four, after the
// hash and the tag. Every algorithm is run through each of the store's
// operations on a fake clock, and every field it leaves must come back
// from its slot (a field dropped by a too-narrow slot would be zero).
func TestSlotStride(t *testing.T) {
	if fixed := mustLimit(t, algorithms.FixedWindow, 10, time.Second); !packs(&fixed) {
		t.Fatal("want packed 32-byte slots for an epoch-aligned fixed_window")
	}
	if strideOf(algorithms.TokenBucket) != 4 || strideOf(algorithms.GCRA) != 4 || strideOf(algorithms.LeakyBucket) != 4 || strideOf(algorithms.SlidingWindow) != 6 {
		t.Fatal("want 32-byte slots for the bucket family, 48 for the others")
	}
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.LeakyBucket} {
		l := mustLimit(t, kind, 7, 3*time.Second)
		var st algorithms.State
		now := 1000 * sec
		rng := rand.New(rand.NewPCG(uint64(kind), 1))
		for step := 0; step < 2000; step++ {
			now += int64(rng.IntN(300_000))
			switch rng.IntN(5) {
			case 0, 1:
				l.Take(&st, now, int64(rng.IntN(3000)))
			case 2:
				d := l.Take(&st, now, 1000)
				l.Undo(&st, now+int64(rng.IntN(100_000)), 1000, d)
			case 3:
				l.Seed(&st, algorithms.Decision{Allowed: true, Remaining: int64(rng.IntN(7)), Reset: int64(rng.IntN(3_000_000)), At: now}, 1000, rng.IntN(2) == 0)
			case 4:
				if l.CanSettle() == nil {
					d := l.Take(&st, now, 2000)
					l.Settle(&st, now, 2000, int64(rng.IntN(4000)), d)
				}
			}
			if st.Prev != 0 || st.Head != 0 || st.Log != nil {
				t.Fatalf("%s step %d: state %+v keeps more than At and Level, which its 32-byte slot drops", kind, step, st)
			}
		}
	}
}

// TestSweepManyKeys sweeps a store whose tables are full of colliding
// probes: every fresh key is forgotten, every other kept with its state,
// and the tables shrink once mostly empty, then grow again.
func TestSweepManyKeys(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 10, 10*time.Second, 0)
	now := 100 * sec
	const n = 20_000
	for i := 0; i < n; i++ {
		at := now
		if i%10 == 0 {
			at = now + 900_000 // not yet full again at now+1s
		}
		take(t, s, "key-"+strconv.Itoa(i), at)
	}
	slotsBefore := totalSlots(s)
	if got := s.Sweep(now + sec); got != n-n/10 {
		t.Fatalf("Sweep() = %d, want %d", got, n-n/10)
	}
	checkConsistent(t, s)
	for i := 0; i < n; i++ {
		d, ok, _ := s.Peek(context.Background(), "key-"+strconv.Itoa(i), now+sec)
		if ok != (i%10 == 0) {
			t.Fatalf("key-%d held = %v after sweep, want %v", i, ok, i%10 == 0)
		}
		if ok && d.Remaining != 9 {
			t.Fatalf("key-%d: Remaining = %d after sweep, want 9", i, d.Remaining)
		}
	}
	if after := totalSlots(s); after*4 > slotsBefore {
		t.Errorf("%d slots after sweeping 90%% of %d keys, had %d: want the tables shrunk", after, n, slotsBefore)
	}
	if got := s.Sweep(now + 10*sec); got != n/10 {
		t.Fatalf("second Sweep() = %d, want %d", got, n/10)
	}
	if got := totalSlots(s); got != 0 {
		t.Errorf("%d slots in an empty store, want 0", got)
	}
	for i := 0; i < n; i++ {
		take(t, s, "key-"+strconv.Itoa(i), now+11*sec)
	}
	checkConsistent(t, s)
	if s.Len() != n {
		t.Errorf("Len() = %d after refilling, want %d", s.Len(), n)
	}
}

func totalSlots(s *Store) int {
	n := 0
	for i := range s.shards {
		n += s.shards[i].size
	}
	return n
}

// TestPackedWindowsStayExact: a window zone of 10 million events in 10
// seconds counts past what a packed slot holds (2^32 milli-units), and is
// granted and owes more than that: every decision must still be the one
// a plain State makes, so the shards given such states widen, and the
// others stay packed.
func TestPackedWindowsStayExact(t *testing.T) {
	for _, kind := range []algorithms.Kind{algorithms.SlidingWindow, algorithms.FixedWindow} {
		l := mustLimit(t, kind, 10_000_000, 10*time.Second)
		s := New(storage.Zone{Name: "z", Limit: l})
		ctx := context.Background()
		const keys = 4
		ref := make([]algorithms.State, keys)
		taken := make([]algorithms.Decision, keys)
		rng := rand.New(rand.NewPCG(uint64(kind), 3))
		now := 1000 * sec
		for step := 0; step < 3000; step++ {
			now += int64(rng.IntN(2_000))
			k := rng.IntN(keys)
			key := "key-" + strconv.Itoa(k)
			var got, want algorithms.Decision
			switch op := rng.IntN(20); {
			case op < 14:
				cost := rng.Int64N(6_000_000_000)
				got, _ = s.Take(ctx, key, now, cost)
				want = l.Take(&ref[k], now, cost)
				if got.Allowed {
					taken[k] = got
				}
			case op < 16:
				amount := rng.Int64N(1 << 36)
				got, _ = s.Grant(ctx, key, now, amount)
				want, _ = l.Grant(&ref[k], now, amount)
			case op < 18:
				actual := rng.Int64N(1 << 34)
				s.Settle(ctx, key, now, 1000, actual, taken[k])
				l.Settle(&ref[k], now, 1000, actual, taken[k])
				got, _, _ = s.Peek(ctx, key, now)
				want = l.Peek(&ref[k], now, algorithms.Milli)
			default:
				s.Undo(ctx, key, now, 2_000_000_000, taken[k])
				l.Undo(&ref[k], now, 2_000_000_000, taken[k])
				got, _, _ = s.Peek(ctx, key, now)
				want = l.Peek(&ref[k], now, algorithms.Milli)
			}
			got.Entry = 0 // the store's, which the algorithm does not know
			if got != want {
				t.Fatalf("%s step %d, key %d: got %+v, want %+v", kind, step, k, got, want)
			}
		}
		wide, packed := 0, 0
		for i := range s.shards {
			sh := &s.shards[i]
			switch {
			case sh.packed:
				packed++
			case sh.size > 0:
				wide++
				checkTable(t, sh)
			}
		}
		if wide == 0 || packed == 0 {
			t.Errorf("%s: %d shards widened, %d packed; want the shards of the keys widened, the others packed", kind, wide, packed)
		}
	}
}
