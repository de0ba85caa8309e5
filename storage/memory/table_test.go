package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// checkTable checks a shard's table: its size, its count, and that every
// entry is found from its home slot by find.
func checkTable(t *testing.T, sh *shard) {
	t.Helper()
	if n := len(sh.slots); n != 0 && (n < 8 || n&(n-1) != 0) {
		t.Fatalf("table of %d slots, want 0 or a power of two of at least 8", n)
	}
	used := 0
	for i, sl := range sh.slots {
		if sl.e == nil {
			continue
		}
		used++
		if got := sh.find(sl.h, sl.e.key); got != i {
			t.Fatalf("key %q in slot %d, find says %d", sl.e.key, i, got)
		}
	}
	if used != sh.n {
		t.Fatalf("%d slots used, n says %d", used, sh.n)
	}
	if used*4 > len(sh.slots)*3 {
		t.Fatalf("%d of %d slots used: more than 3/4", used, len(sh.slots))
	}
}

// TestTableMatchesModel drives one shard's table with puts, deletes and
// shrinks against a Go map. The hashes are chosen, not computed: a few
// homes in a small table, so that probe sequences collide, run into each
// other and wrap around the table's end, and some keys share a whole hash
// (the key comparison must tell them apart).
func TestTableMatchesModel(t *testing.T) {
	var l algorithms.Limit
	for seed := uint64(0); seed < 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		var sh shard
		model := map[string]*entry{}
		hashOf := func(key string) uint64 {
			var k uint64
			fmt.Sscanf(key, "k%d", &k)
			// 5 homes (times numShards: the shard's bits) and 2 keys a
			// hash; homes near the end of an 8- or 16-slot table.
			return (5+k/2%5)*numShards + 3
		}
		for step := 0; step < 300; step++ {
			key := fmt.Sprintf("k%d", rng.IntN(40))
			h := hashOf(key)
			switch op := rng.IntN(10); {
			case op < 6: // put, or replace with a new entry of the key
				e := newEntry(key, &l)
				sh.put(h, e)
				model[key] = e
			case op < 9: // delete
				if i := sh.find(h, key); i >= 0 {
					sh.deleteAt(i)
				}
				delete(model, key)
			default:
				sh.shrink()
			}
			checkTable(t, &sh)
			if sh.n != len(model) {
				t.Fatalf("seed %d step %d: %d entries, model %d", seed, step, sh.n, len(model))
			}
			for k := 0; k < 40; k++ {
				key := fmt.Sprintf("k%d", k)
				var got *entry
				if i := sh.find(hashOf(key), key); i >= 0 {
					got = sh.slots[i].e
				}
				if got != model[key] {
					t.Fatalf("seed %d step %d: %s: table has %p, model %p", seed, step, key, got, model[key])
				}
			}
		}
	}
}

// TestEntryLayout pins the entry to two cache lines, the key and its
// bytes in the first, the state in the second; and a short key's bytes
// in the entry, a long key as given.
func TestEntryLayout(t *testing.T) {
	var e entry
	if s := unsafe.Sizeof(e); s != 128 {
		t.Errorf("entry is %d bytes, want 128 (two cache lines)", s)
	}
	if o := unsafe.Offsetof(e.evicted); o+unsafe.Sizeof(e.evicted) > 64 {
		t.Errorf("evicted ends at byte %d, want it in the first cache line", o+unsafe.Sizeof(e.evicted))
	}
	if o := unsafe.Offsetof(e.state); o != 64 {
		t.Errorf("state at byte %d, want 64", o)
	}
	var l algorithms.Limit
	short := newEntry("ffff:ffff:ffff:ffff::/64", &l)
	if unsafe.StringData(short.key) != &short.kbuf[0] || short.key != "ffff:ffff:ffff:ffff::/64" {
		t.Errorf("a %d-byte key is not held in its entry", len(short.key))
	}
	long := "a-key-longer-than-twenty-four-bytes"
	if e := newEntry(long, &l); unsafe.StringData(e.key) != unsafe.StringData(long) {
		t.Errorf("a %d-byte key was copied", len(long))
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
		n += len(s.shards[i].slots)
	}
	return n
}
