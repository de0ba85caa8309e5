package shared

import (
	"testing"
	"time"
)

// TestSharedDeadlines: decisions that start within one grain share one
// context; each ends no sooner than its timeout and at most a grain later.
func TestSharedDeadlines(t *testing.T) {
	var s Deadlines
	const timeout = 30 * time.Millisecond
	start := time.Now()
	a, b := s.Get(timeout), s.Get(timeout)
	dl, ok := a.Deadline()
	if !ok {
		t.Fatal("no deadline")
	}
	if early, late := start.Add(timeout), time.Now().Add(timeout+grain); dl.Before(early) || dl.After(late) {
		t.Fatalf("deadline %s after start, want within [%s, %s]", dl.Sub(start), timeout, late.Sub(start))
	}
	if bdl, _ := b.Deadline(); !bdl.Equal(dl) && bdl.Sub(dl) != grain {
		t.Errorf("two gets a moment apart: deadlines %s and %s", dl, bdl)
	}
	<-a.Done()
	if time.Now().Before(start.Add(timeout)) {
		t.Errorf("ended %s after start, before its timeout", time.Since(start))
	}
	time.Sleep(2 * grain)
	if c := s.Get(timeout); c == a || c.Err() != nil {
		t.Error("a later get returned an ended context")
	}
	// Many gets in a row share few contexts.
	seen := map[any]bool{}
	for range 1000 {
		seen[s.Get(timeout)] = true
	}
	if len(seen) > 50 {
		t.Errorf("1000 gets in a row made %d contexts", len(seen))
	}
}
