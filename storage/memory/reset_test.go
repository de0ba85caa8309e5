package memory

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// A request admitted before its key's reset, still running then, may give
// its charge back later (a shaped client leaving, a response that does
// not count): the reset gave it back already, so it gives nothing, and
// takes nothing from what the key was charged since. Before, it did, and
// a key of 2 per window admitted 3 in it.
func TestUndoAfterReset(t *testing.T) {
	ctx := context.Background()
	const t0 = 1_700_000_000 * sec
	kinds := []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindow, algorithms.SlidingLog,
		algorithms.TokenBucket, algorithms.GCRA, algorithms.LeakyBucket}
	for _, kind := range kinds {
		l := mustLimit(t, kind, 2, time.Hour)
		// pre: what the first take charged is given back after the reset
		// and two takes since; post: what the last take charged is.
		for _, tc := range []struct {
			name      string
			resetAt   int64 // after the first take at t0
			undoLast  bool
			wantAdmit bool
		}{
			{"pre", t0 + 1, false, false},
			{"pre at the reset's µs", t0, false, false},
			{"post", t0 + 1, true, true},
		} {
			t.Run(kind.String()+"/"+tc.name, func(t *testing.T) {
				s := New(storage.Zone{Name: "z", Limit: l})
				first := take(t, s, "k", t0)
				if ok, _ := s.Reset(ctx, "k", tc.resetAt); !ok {
					t.Fatal("Reset(k) = false, want true")
				}
				take(t, s, "k", tc.resetAt+1)
				last := take(t, s, "k", tc.resetAt+2)
				if !first.Allowed || !last.Allowed {
					t.Fatalf("takes admitted %v, %v, want both", first.Allowed, last.Allowed)
				}
				undone := first
				if tc.undoLast {
					undone = last
				}
				if err := s.Undo(ctx, "k", tc.resetAt+3, algorithms.Milli, undone); err != nil {
					t.Fatal(err)
				}
				if d := take(t, s, "k", tc.resetAt+4); d.Allowed != tc.wantAdmit {
					t.Errorf("Take after Undo: Allowed = %v, want %v (%+v)", d.Allowed, tc.wantAdmit, d)
				}
			})
		}
	}
}

// The reset log is bounded: past maxResets keys, a reset counts for every
// key that was charged before it; and it is forgotten past the horizon,
// when an Undo no longer reads it.
func TestResetLogBounds(t *testing.T) {
	ctx := context.Background()
	const t0 = 1_700_000_000 * sec
	l := mustLimit(t, algorithms.FixedWindow, 2, time.Hour)
	s := New(storage.Zone{Name: "z", Limit: l})
	first := take(t, s, "k", t0)
	now := t0 + 1
	if ok, _ := s.Reset(ctx, "k", now); !ok {
		t.Fatal("Reset(k) = false, want true")
	}
	for i := range maxResets {
		key := "other" + strconv.Itoa(i)
		take(t, s, key, now)
		if ok, _ := s.Reset(ctx, key, now); !ok {
			t.Fatalf("Reset(%s) = false, want true", key)
		}
	}
	if n := len(s.resets.at); n >= maxResets {
		t.Fatalf("reset log holds %d keys, want fewer than %d", n, maxResets)
	}
	take(t, s, "k", now+1)
	take(t, s, "k", now+2)
	s.Undo(ctx, "k", now+3, algorithms.Milli, first)
	if d := take(t, s, "k", now+4); d.Allowed {
		t.Errorf("Take after the undo of a charge made before a full log's reset: Allowed = true, want false")
	}

	later := now + storage.Horizon(&l) + 1
	d := take(t, s, "k", later)
	s.Undo(ctx, "k", later, algorithms.Milli, d)
	if s.resets.any.Load() {
		t.Error("reset log still read past the horizon")
	}
	take(t, s, "k", later)
	if d := take(t, s, "k", later); !d.Allowed {
		t.Errorf("past the horizon, a charge given back is not: Allowed = false, want true")
	}
}
