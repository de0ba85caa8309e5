package redis

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// deadlineRunner runs a store's script calls with the runner it wraps and
// records the deadline of each call's context (the zero time for none).
// fail, if set, makes the calls it names (counted from 1) fail without
// reaching Redis.
type deadlineRunner struct {
	runner
	fail func(n int) bool

	mu   sync.Mutex
	seen []time.Time
}

var errInjected = errors.New("injected failure")

func (r *deadlineRunner) run(ctx context.Context, c *call) ([]int64, error) {
	dl, _ := ctx.Deadline()
	r.mu.Lock()
	r.seen = append(r.seen, dl)
	n := len(r.seen)
	r.mu.Unlock()
	if r.fail != nil && r.fail(n) {
		c.release()
		return nil, errInjected
	}
	return r.runner.run(ctx, c)
}

func (r *deadlineRunner) deadlines() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.seen...)
}

// TestTakeAllAcrossGroupsKeepsOneDeadline: a request whose zones span
// groups (Cluster slots, hash tags) makes several round trips, and every
// one of them, giving back included, runs under the request's one
// deadline. Before, the step that gives back (settle) got a budget of its
// own, as long again as the request had had at the start: a decision could
// wait for the store up to twice its timeout. The deadlines are compared,
// not timed: no wall-clock threshold.
func TestTakeAllAcrossGroupsKeepsOneDeadline(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range []struct {
		name  string
		fail  func(n int) bool
		calls int // round trips: decide a, decide b, give a back
		err   bool
	}{
		{"a later group rejects", nil, 3, false},
		{"a later group fails", func(n int) bool { return n == 2 }, 3, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newTestStore(srv.Client())
			s.group = byTag // one group per key: two round trips at least
			rec := &deadlineRunner{runner: s.run}
			s.run = rec
			a := zoneOf(s, "deadline-a-"+c.name, mustLimit(t, algorithms.TokenBucket, 5, time.Hour, 0, 0))
			b := zoneOf(s, "deadline-b-"+c.name, mustLimit(t, algorithms.TokenBucket, 1, time.Hour, 0, 0))
			if _, rej, err := s.TakeAll(context.Background(), epoch, []Request{{Zone: b, Key: "kb", Cost: algorithms.Milli}}); err != nil || rej != -1 {
				t.Fatalf("spending b: rejected %d, %v; want admitted", rej, err)
			}
			rec.mu.Lock()
			rec.seen = nil
			rec.mu.Unlock()
			rec.fail = c.fail

			// A deadline far away: nothing here waits for it.
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			want, _ := ctx.Deadline()
			_, rej, err := s.TakeAll(ctx, epoch, []Request{{Zone: a, Key: "ka", Cost: algorithms.Milli}, {Zone: b, Key: "kb", Cost: algorithms.Milli}})
			switch {
			case c.err && err == nil:
				t.Fatalf("TakeAll with b's round trip failing: no error")
			case !c.err && (err != nil || rej != 1):
				t.Fatalf("TakeAll: rejected %d, %v; want 1 (b is spent)", rej, err)
			}
			got := rec.deadlines()
			if len(got) != c.calls {
				t.Fatalf("%d round trips, want %d", len(got), c.calls)
			}
			for i, dl := range got {
				if !dl.Equal(want) {
					t.Errorf("round trip %d of %d: deadline %v after the request's, want the request's own (%v)", i+1, len(got), dl.Sub(want), want)
				}
			}
			// a's charge was given back: its 5 are whole.
			rec.fail = nil
			for i := 1; i <= 5; i++ {
				if d, err := a.Take(context.Background(), "ka", epoch, algorithms.Milli); err != nil || !d.Allowed {
					t.Fatalf("a after the request, take %d of 5: %+v, %v; want admitted (its charge given back)", i, d, err)
				}
			}
		})
	}
}
