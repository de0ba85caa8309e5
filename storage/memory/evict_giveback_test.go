package memory

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// TestGiveBackAfterEviction: a request charged to key a is in flight
// (count_response) when a flood of other keys evicts a through MaxKeys;
// a comes back fresh and is charged until it refuses. The request's
// give-back (Undo, or Settle to nothing) then finds a state it was not
// charged to: it gives nothing back, and a is still refused. Before, it
// was taken from the new state's charges: one admission over the limit
// per give-back. The same through TakeAll (two zones, decided on copies
// of their states).
func TestGiveBackAfterEviction(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000) * 1_000_000
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow,
		algorithms.SlidingLog, algorithms.FixedWindow, algorithms.LeakyBucket} {
		for _, path := range []string{"Take+Undo", "Take+Settle", "TakeAll+Undo"} {
			s := New(storage.Zone{Name: "z", Limit: mustLimit(t, kind, 2, time.Hour), MaxKeys: 1})
			other := New(storage.Zone{Name: "other", Limit: mustLimit(t, algorithms.FixedWindow, 100, time.Hour)})
			take := func(key string, now int64) algorithms.Decision {
				if path == "TakeAll+Undo" {
					ds := make([]algorithms.Decision, 2)
					TakeAll(now, []Request{{Store: other, Key: key, Cost: algorithms.Milli}, {Store: s, Key: key, Cost: algorithms.Milli}}, ds)
					return ds[1]
				}
				d, _ := s.Take(ctx, key, now, algorithms.Milli)
				return d
			}
			inFlight := take("a", t0)
			if !inFlight.Allowed {
				t.Fatalf("%v %s: the first request refused", kind, path)
			}
			take("b", t0+1) // evicts a: MaxKeys 1
			if _, held, _ := s.Peek(ctx, "a", t0+1); held {
				t.Fatalf("%v %s: a still held after b was added (MaxKeys 1)", kind, path)
			}
			admitted := 0
			for take("a", t0+2).Allowed {
				if admitted++; admitted > 10 {
					t.Fatalf("%v %s: a admitted without end", kind, path)
				}
			}
			if path == "Take+Settle" {
				_ = s.Settle(ctx, "a", t0+3, algorithms.Milli, 0, inFlight)
			} else {
				_ = s.Undo(ctx, "a", t0+3, algorithms.Milli, inFlight)
			}
			if d := take("a", t0+3); d.Allowed {
				t.Errorf("%v %s: after %d admitted on the new state and the evicted state's give-back, a was admitted again; want refused (the give-back is not the new state's)", kind, path, admitted)
			}
		}
	}
}
