package shared

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
)

// grantStore is a memory zone of 100 events an hour, which keeps no ids:
// GrantOnce keeps them in grantIDs.
func grantStore(t testing.TB) (*memory.Store, *algorithms.Limit) {
	t.Helper()
	l, err := algorithms.NewLimit(algorithms.FixedWindow, 100, time.Hour, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return memory.New(storage.Zone{Name: "grants", Limit: l}), &l
}

// freshGrantIDs gives the test an empty grantIDs, and puts the process's
// back after it.
func freshGrantIDs(t testing.TB) {
	grantIDs.Lock()
	m, queue, head := grantIDs.m, grantIDs.queue, grantIDs.head
	grantIDs.m, grantIDs.queue, grantIDs.head = nil, nil, 0
	grantIDs.Unlock()
	t.Cleanup(func() {
		grantIDs.Lock()
		grantIDs.m, grantIDs.queue, grantIDs.head = m, queue, head
		grantIDs.Unlock()
	})
}

// TestGrantIDsBounded: 30,000 grants with ids, all within their windows,
// keep at most maxGrantIDs ids: the latest are still known (a grant sent
// again applies nothing), the oldest forgotten. Before, the bound dropped
// only expired ids: within a window every id was kept, and each grant
// past the bound scanned them all under the lock.
func TestGrantIDsBounded(t *testing.T) {
	freshGrantIDs(t)
	s, l := grantStore(t)
	ctx := context.Background()
	now := int64(1_700_000_000) * 1_000_000
	const n = 30_000
	for i := range n {
		if _, applied, err := GrantOnce(ctx, s, l, s, "k"+strconv.Itoa(i%50), now, algorithms.Milli, "id-"+strconv.Itoa(i)); err != nil || !applied {
			t.Fatalf("grant %d: applied %v, err %v; want applied", i, applied, err)
		}
	}
	grantIDs.Lock()
	kept, queued := grantIDs.len(), len(grantIDs.queue)-grantIDs.head
	grantIDs.Unlock()
	if kept != maxGrantIDs || queued != maxGrantIDs {
		t.Errorf("after %d grants: %d ids kept, %d queued; want %d (the bound)", n, kept, queued, maxGrantIDs)
	}
	last := n - 1
	if _, applied, _ := GrantOnce(ctx, s, l, s, "k"+strconv.Itoa(last%50), now, algorithms.Milli, "id-"+strconv.Itoa(last)); applied {
		t.Errorf("the last grant sent again: applied, want repeated")
	}
	if _, applied, _ := GrantOnce(ctx, s, l, s, "k0", now, algorithms.Milli, "id-0"); !applied {
		t.Errorf("the first grant, past the bound, sent again: repeated, want applied (its id forgotten)")
	}
}

// TestIDSetDropsExpiredFirst steps an idSet of 3 through a fixed time
// grid: an id is known until its time; expired ids at the queue's head go
// as a new one comes; past the bound, the oldest added goes, expired or
// not (an expired one behind it waits for its turn: no scan).
func TestIDSetDropsExpiredFirst(t *testing.T) {
	s := idSet{max: 3}
	steps := []struct {
		now       int64
		add       string
		until     int64
		known     []string
		forgotten []string
	}{
		{0, "a", 10, []string{"a"}, nil},
		{1, "b", 1000, []string{"a", "b"}, nil},
		{2, "c", 20, []string{"a", "b", "c"}, nil},
		{30, "d", 1000, []string{"b", "d"}, []string{"a", "c"}}, // a dropped (expired, first); c expired
		{31, "e", 1000, []string{"d", "e"}, []string{"b", "c"}}, // at the bound: b, the oldest, goes
		{32, "f", 1000, []string{"d", "e", "f"}, nil},           // c, expired, goes: room for f
		{40, "a", 1000, []string{"e", "f", "a"}, []string{"d"}}, // a again: a new entry; d the oldest
	}
	for i, st := range steps {
		s.add(st.add, st.now, st.until)
		for _, id := range st.known {
			if !s.has(id, st.now) {
				t.Errorf("step %d: has(%q, %d) = false, want true", i, id, st.now)
			}
		}
		for _, id := range st.forgotten {
			if s.has(id, st.now) {
				t.Errorf("step %d: has(%q, %d) = true, want false", i, id, st.now)
			}
		}
		if s.len() > s.max {
			t.Errorf("step %d: %d ids kept, want at most %d", i, s.len(), s.max)
		}
	}
}

// BenchmarkGrantOnce: grants with ids past the bound of kept ids, all
// within their windows (the worst case of a scan for expired ids).
func BenchmarkGrantOnce(b *testing.B) {
	freshGrantIDs(b)
	s, l := grantStore(b)
	ctx := context.Background()
	now := int64(1_700_000_000) * 1_000_000
	for i := range maxGrantIDs {
		GrantOnce(ctx, s, l, s, "k", now, 1, "fill-"+strconv.Itoa(i))
	}
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "id-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		GrantOnce(ctx, s, l, s, "k", now, 1, ids[i])
	}
}
