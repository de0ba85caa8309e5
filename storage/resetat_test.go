package storage

import "testing"

// ResetAt dates a reset at now unless the clock ran back, and then after
// every time the key's state has seen, the fresh state a µs later still;
// the twin is single.lua's op 'x', which TestResetThenUndoParity runs
// against the memory store.
func TestResetAt(t *testing.T) {
	for _, c := range []struct {
		name               string
		now, seen, last    int64
		wantMark, wantHold int64
	}{
		{"no state, no mark", 100, 0, 0, 100, 100},
		{"the state seen up to now", 100, 100, 0, 100, 100},
		{"the state seen earlier", 100, 90, 0, 100, 100},
		{"an earlier mark", 100, 90, 50, 100, 100},
		// A clock that ran back since the last reset: the mark holds.
		{"a later mark", 100, 0, 120, 120, 120},
		{"a later mark, the state seen up to it", 100, 120, 120, 120, 120},
		// A clock that ran back since a decision on the state.
		{"the state seen later", 100, 110, 0, 111, 112},
		{"the state seen later than the mark", 100, 130, 120, 131, 132},
	} {
		mark, hold := ResetAt(c.now, c.seen, c.last)
		if mark != c.wantMark || hold != c.wantHold {
			t.Errorf("%s: ResetAt(%d, %d, %d) = %d, %d; want %d, %d", c.name, c.now, c.seen, c.last, mark, hold, c.wantMark, c.wantHold)
		}
	}
}
