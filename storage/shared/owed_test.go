package shared

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// recorder is a storage.Settler that records what reaches it, and fails
// with err while err is set.
type recorder struct {
	mu    sync.Mutex
	err   error
	calls []string
}

func (r *recorder) Settle(_ context.Context, key string, _, reserved, actual int64, taken algorithms.Decision) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.calls = append(r.calls, key+":"+itoa(reserved)+"->"+itoa(actual)+"@"+itoa(taken.At))
	return nil
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

var (
	errUnsent = errors.New("test: never sent")
	errMaybe  = errors.New("test: timed out, may have run")
)

// newOwed is an Owed on a fake clock (now), retrying every millisecond,
// whose client is held while it keeps anything (held).
func newOwed(now *atomic.Int64, held *atomic.Int64) *Owed {
	return &Owed{
		Retry:   time.Millisecond,
		Max:     3,
		Now:     now.Load,
		Do:      func(fn func(ctx context.Context) error) error { return fn(context.Background()) },
		Unsent:  func(err error) bool { return errors.Is(err, errUnsent) },
		Hold:    func() bool { held.Add(1); return true },
		Release: func() { held.Add(-1) },
	}
}

// waitDrained waits until o keeps nothing and has let the client go.
func waitDrained(t *testing.T, o *Owed, held *atomic.Int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); o.Pending() > 0 || held.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still kept: %d, client held: %d", o.Pending(), held.Load())
		}
	}
}

// TestOwedAppliesOnceMerged: give-backs of one request on one key are
// merged; give-backs and excesses, and other requests, are not; each is
// applied once the store answers, the latest charge first, and the
// client is held meanwhile.
func TestOwedAppliesOnceMerged(t *testing.T) {
	var now, held atomic.Int64
	s := &recorder{err: errUnsent}
	o := newOwed(&now, &held)
	a := algorithms.Decision{Allowed: true, At: 10, Reset: 5}
	b := algorithms.Decision{Allowed: true, At: 20, Reset: 5}
	for _, c := range []struct {
		taken algorithms.Decision
		give  int64
	}{{a, 1000}, {a, 500}, {a, -300}, {b, 1000}} {
		if !o.Keep(s, "k", c.taken, c.give, 100) {
			t.Fatalf("Keep(%v, %d) = false, want kept", c.taken, c.give)
		}
	}
	if got := o.Pending(); got != 3 {
		t.Fatalf("kept %d, want 3 (two give-backs of one request merged)", got)
	}
	if held.Load() != 1 {
		t.Fatalf("client held %d times, want 1", held.Load())
	}
	s.fail(nil) // the store answers again
	waitDrained(t, o, &held)
	got := s.got()
	want := map[string]bool{"k:1000->0@20": true, "k:1500->0@10": true, "k:0->300@10": true}
	if len(got) != 3 || got[0] != "k:1000->0@20" {
		t.Fatalf("applied %q, want 3, the latest charge (At 20) first", got)
	}
	for _, g := range got {
		if !want[g] {
			t.Errorf("applied %q, want one of %v", g, want)
		}
	}
	if o.Applied() != 3 || o.Dropped() != 0 {
		t.Errorf("applied %d, dropped %d; want 3, 0", o.Applied(), o.Dropped())
	}
}

// TestOwedDrops: a settlement whose window has ended is dropped, when kept
// and when it comes to be applied; so is one past Max, and one whose call
// may have run (never sent twice). Each is counted.
func TestOwedDrops(t *testing.T) {
	var now, held atomic.Int64
	s := &recorder{err: errUnsent}
	o := newOwed(&now, &held)
	now.Store(100)
	if o.Keep(s, "late", algorithms.Decision{At: 1}, 1000, 100) {
		t.Error("a settlement whose window ended was kept")
	}
	for i, key := range []string{"a", "b", "c"} {
		if !o.Keep(s, key, algorithms.Decision{At: int64(i)}, 1000, 200) {
			t.Fatalf("settlement %s not kept", key)
		}
	}
	if o.Keep(s, "d", algorithms.Decision{At: 9}, 1000, 200) {
		t.Error("a fourth settlement kept past Max 3")
	}
	s.fail(errMaybe) // the store is reached, but its answers are lost
	waitDrained(t, o, &held)
	if got := s.got(); len(got) != 0 {
		t.Errorf("applied %q, want none", got)
	}
	if o.Dropped() != 5 || o.Applied() != 0 {
		t.Errorf("dropped %d, applied %d; want 5 (late, past Max, 3 that may have run), 0", o.Dropped(), o.Applied())
	}

	// Kept while the store cannot hear, then the window ends.
	s.fail(errUnsent)
	if !o.Keep(s, "e", algorithms.Decision{At: 50}, 1000, 300) {
		t.Fatal("settlement e not kept")
	}
	now.Store(300)
	waitDrained(t, o, &held)
	if got := s.got(); len(got) != 0 || o.Dropped() != 6 {
		t.Errorf("applied %q, dropped %d; want none, 6", got, o.Dropped())
	}
}

// TestSettlementsCountedForTheProcess: the process-wide counts behind the
// metrics follow what each Owed keeps, applies and drops.
func TestSettlementsCountedForTheProcess(t *testing.T) {
	var now, held atomic.Int64
	now.Store(1000)
	o := newOwed(&now, &held)
	r := &recorder{}
	r.fail(errUnsent)
	p0, a0, d0 := Settlements()
	o.Keep(r, "a", algorithms.Decision{At: 1}, 5, 10_000)
	o.Keep(r, "a", algorithms.Decision{At: 1}, 5, 10_000) // merged: one kept
	o.Keep(r, "b", algorithms.Decision{At: 1}, 5, 10_000)
	o.Keep(r, "c", algorithms.Decision{At: 1}, 5, 500) // its window ended: dropped
	if p, a, d := Settlements(); p-p0 != 2 || a-a0 != 0 || d-d0 != 1 {
		t.Errorf("kept: pending %d, applied %d, dropped %d more; want 2, 0, 1", p-p0, a-a0, d-d0)
	}
	r.fail(nil)
	waitDrained(t, o, &held)
	if p, a, d := Settlements(); p-p0 != 0 || a-a0 != 2 || d-d0 != 1 {
		t.Errorf("drained: pending %d, applied %d, dropped %d more; want 0, 2, 1", p-p0, a-a0, d-d0)
	}
}
