package memory

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
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
// writes, deletes, CLOCK evictions and shrinks against a Go map, for both
// strides and a sliding_log's rings. The hashes are chosen, not computed:
// a few homes in a small table, so that probe sequences collide, run into
// each other and wrap around the table's end, and some keys share a whole
// hash (the tag must tell them apart). Each key's state and log are its
// own values: a key moved by a shift or a resize must keep them.
func TestTableMatchesModel(t *testing.T) {
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.SlidingWindow, algorithms.SlidingLog} {
		for seed := uint64(0); seed < 200; seed++ {
			rng := rand.New(rand.NewPCG(seed, 7))
			sh := shard{stride: strideOf(kind), log: kind == algorithms.SlidingLog}
			model := map[int]algorithms.State{}
			// 5 homes (above the shard's bits) and 2 keys a hash;
			// homes near the end of an 8- or 16-slot table.
			hashOf := func(k int) (h, tag uint64) {
				return uint64(5+k/2%5)<<shardBits + 3, uint64(k)<<2 | usedBit
			}
			stateOf := func(k, v int) algorithms.State {
				st := algorithms.State{At: int64(k), Level: int64(v)}
				if sh.stride == windowStride {
					st.Prev, st.Head = int64(-k), int64(v+k)
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
		}
	}
}

// TestSlotStride: a slot holds every State field its algorithm keeps, and
// no more: the bucket family's two words and the others' four, after the
// hash and the tag. Every algorithm is run through each of the store's
// operations on a fake clock, and every field it leaves must come back
// from its slot (a field dropped by a too-narrow slot would be zero).
func TestSlotStride(t *testing.T) {
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
