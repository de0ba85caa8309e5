package algorithms

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// TestFixedWindow: 3 events per aligned second.
func TestFixedWindow(t *testing.T) {
	steps := []step{
		0: {take, t0 + 100*ms, 1000, Decision{Allowed: true, Remaining: 2, Reset: 900 * ms}},
		1: {take, t0 + 200*ms, 1500, Decision{Allowed: true, Remaining: 0, Reset: 800 * ms}},
		2: {take, t0 + 300*ms, 1000, Decision{Remaining: 0, Reset: 700 * ms, Wait: 700 * ms}},
		3: {take, t0 + 300*ms, 500, Decision{Allowed: true, Remaining: 0, Reset: 700 * ms}},
		4: {peek, t0 + sec - 1, 1, Decision{Remaining: 0, Reset: 1, Wait: 1}},
		5: {fresh, t0 + sec - 1, 0, Decision{Allowed: false}},
		// A new window: the count starts over.
		6:  {take, t0 + sec, 3000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		7:  {take, t0 + sec, 4000, Decision{Remaining: 0, Reset: sec, Wait: Never}},
		8:  {undo, t0 + 1500*ms, 2000, Decision{}},
		9:  {peek, t0 + 1500*ms, 2000, Decision{Allowed: true, Remaining: 2, Reset: 500 * ms}},
		10: {take, t0 + 1500*ms, 2000, Decision{Allowed: true, Remaining: 0, Reset: 500 * ms}},
		// Before the latest time the state has seen (1.5s): counted in
		// its window, at that time (no time has elapsed).
		11: {take, t0 + 500*ms, 1000, Decision{Remaining: 0, Reset: 500 * ms, Wait: 500 * ms}},
		12: {fresh, t0 + 2*sec - 1, 0, Decision{Allowed: false}},
		13: {fresh, t0 + 2*sec, 0, Decision{Allowed: true}},
		14: {take, t0 + 2*sec, 0, Decision{Allowed: true, Remaining: 3, Reset: 0}},
		// The boundary burst: 2N within 2µs across a window start.
		15: {take, t0 + 3*sec - 1, 3000, Decision{Allowed: true, Remaining: 0, Reset: 1}},
		16: {take, t0 + 3*sec, 3000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		// Two windows on, nothing of the old count is left.
		17: {take, t0 + 5*sec + 1, 1000, Decision{Allowed: true, Remaining: 2, Reset: sec - 1}},
	}
	run(t, mustLimit(t, FixedWindow, 3, time.Second, 0, 0), steps)
}

// TestSlidingWindow: 4 events per second, the previous aligned second's
// count weighing in as prev * (W - elapsed) / W, floored in milli-units.
func TestSlidingWindow(t *testing.T) {
	steps := []step{
		0: {take, t0 + 500*ms, 2000, Decision{Allowed: true, Remaining: 2, Reset: 1500 * ms}},
		1: {take, t0 + 750*ms, 2000, Decision{Allowed: true, Remaining: 0, Reset: 1250 * ms}},
		// Full for the rest of this window. In the next one 4 weighs
		// 4000 * (W - e) / W milli-units, exactly, which is <= 3500 once
		// W - e <= 875000µs: at e = 125000µs, 375000µs from now. (A
		// floored weight would admit 249µs early, at 3500.996.)
		2: {take, t0 + 750*ms, 500, Decision{Remaining: 0, Reset: 1250 * ms, Wait: 375_000}},
		3: {peek, t0 + sec + 124_999, 500, Decision{Remaining: 0, Reset: 875_001, Wait: 1}},
		4: {peek, t0 + sec + 125_000, 500, Decision{Allowed: true, Remaining: 0, Reset: 875_000}},
		// At e = 250ms the previous window weighs 3: room for 1.
		5: {take, t0 + 1250*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: 1750 * ms}},
		// 0.5 more fits once the previous window weighs <= 2.5, at
		// e = 375000µs (4000 * 625000 / 10^6 = 2500).
		6: {take, t0 + 1250*ms, 500, Decision{Remaining: 0, Reset: 1750 * ms, Wait: 125_000}},
		7: {take, t0 + 1500*ms, 500, Decision{Allowed: true, Remaining: 0, Reset: 1500 * ms}},
		8: {undo, t0 + 1500*ms, 500, Decision{}},
		9: {peek, t0 + 1500*ms, 1000, Decision{Allowed: true, Remaining: 1, Reset: 1500 * ms}},
		// Two seconds in: the previous window (1 event) weighs 0.5.
		10: {take, t0 + 2500*ms, 5000, Decision{Remaining: 3, Reset: 500 * ms, Wait: Never}},
		11: {fresh, t0 + 3*sec - 1, 0, Decision{Allowed: false}},
		12: {fresh, t0 + 3*sec, 0, Decision{Allowed: true}},
		13: {take, t0 + 3500*ms, 4000, Decision{Allowed: true, Remaining: 0, Reset: 1500 * ms}},
		14: {take, t0 + 4250*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: 1750 * ms}},
		// Before the latest time the state has seen (4.25s): decided at
		// that time, as step 14 was (no time has elapsed).
		15: {take, t0 + 3900*ms, 0, Decision{Allowed: true, Remaining: 0, Reset: 1750 * ms}},
		16: {take, t0 + 4250*ms, 0, Decision{Allowed: true, Remaining: 0, Reset: 1750 * ms}},
		// Undo after the window rolled gives back to the previous window.
		17: {undo, t0 + 5*sec, 1000, Decision{}},
		18: {peek, t0 + 5*sec, 0, Decision{Allowed: true, Remaining: 4, Reset: 0}},
	}
	run(t, mustLimit(t, SlidingWindow, 4, time.Second, 0, 0), steps)
}

// TestSlidingLog: 3 events in any (now - 1s, now]. A fractional cost takes
// whole events: 1.5 takes 2.
func TestSlidingLog(t *testing.T) {
	steps := []step{
		0: {take, t0, 1000, Decision{Allowed: true, Remaining: 2, Reset: sec}},
		1: {take, t0 + 100*ms, 1500, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		// The event at t0 leaves the window at t0+1s.
		2: {take, t0 + 200*ms, 500, Decision{Remaining: 0, Reset: 900 * ms, Wait: 800 * ms}},
		3: {peek, t0 + sec - 1, 1000, Decision{Remaining: 0, Reset: 100*ms + 1, Wait: 1}},
		4: {take, t0 + sec, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		// Two must leave: both of t0+100ms.
		5:  {take, t0 + sec, 2000, Decision{Remaining: 0, Reset: sec, Wait: 100 * ms}},
		6:  {take, t0 + sec, 4000, Decision{Remaining: 0, Reset: sec, Wait: Never}},
		7:  {undo, t0 + sec, 1000, Decision{}},
		8:  {peek, t0 + sec, 1000, Decision{Allowed: true, Remaining: 1, Reset: 100 * ms}},
		9:  {peek, t0 + sec, 1000, Decision{Allowed: true, Remaining: 1, Reset: 100 * ms}},
		10: {take, t0 + 1100*ms, 0, Decision{Allowed: true, Remaining: 3, Reset: 0}},
		11: {fresh, t0 + 1100*ms, 0, Decision{Allowed: true}},
		12: {take, t0 + 1500*ms, 1000, Decision{Allowed: true, Remaining: 2, Reset: sec}},
		// Before the newest entry: logged at the newest entry's time.
		13: {take, t0 + 1200*ms, 1000, Decision{Allowed: true, Remaining: 1, Reset: sec}},
		14: {fresh, t0 + 2500*ms - 1, 0, Decision{Allowed: false}},
		15: {fresh, t0 + 2500*ms, 0, Decision{Allowed: true}},
		// The ring wraps around.
		16: {take, t0 + 3*sec, 2000, Decision{Allowed: true, Remaining: 1, Reset: sec}},
		17: {take, t0 + 3500*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		18: {take, t0 + 4*sec, 2000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		19: {take, t0 + 4*sec, 1, Decision{Remaining: 0, Reset: sec, Wait: 500 * ms}},
	}
	run(t, mustLimit(t, SlidingLog, 3, time.Second, 0, 0), steps)
}

// TestSlidingLogWithoutRing: a state not made by NewState still works.
func TestSlidingLogWithoutRing(t *testing.T) {
	l := mustLimit(t, SlidingLog, 2, time.Second, 0, 0)
	var s State
	for i, want := range []bool{true, true, false} {
		if d := l.Take(&s, t0, Milli); d.Allowed != want {
			t.Errorf("step %d: Take(t0, 1) = %t, want %t", i, d.Allowed, want)
		}
	}
}

// TestWeightExact: a sliding_window's weight is ceil(prev * toNext / W)
// exactly, computed in big integers here, for counts and windows from 1
// to their bounds and toNext within the window; beyond it (no decision
// asks that), the same, up to a quotient of MaxInt64/4, where it stops
// (above every limit, and no sum of it overflows), also where the product
// passes W * 2^64 (the quotient passes 64 bits) and at exactly W * 2^64.
func TestWeightExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 7))
	edge := func(hi int64) int64 {
		switch rng.IntN(4) {
		case 0:
			return 1 + rng.Int64N(min(hi, 1000))
		case 1:
			return hi - rng.Int64N(min(hi, 1000))
		}
		return 1 + rng.Int64N(hi)
	}
	for i := 0; i < 200_000; i++ {
		w := edge(MaxSpan)
		l := Limit{Kind: SlidingWindow, Events: 1, Window: w}
		prev, toNext := edge(MaxEvents*Milli), edge(w)
		switch i % 10 {
		case 0:
			toNext = edge(4 * w) // beyond the window
		case 1:
			w = edge(1 << 31)
			l.Window = w
			prev, toNext = edge(math.MaxInt64), edge(math.MaxInt64)
		case 2: // the product exactly W * 2^64: the quotient 2^64
			w = edge(1 << 30)
			l.Window = w
			prev, toNext = w<<32, 1<<32
		}
		want := new(big.Int).Mul(big.NewInt(prev), big.NewInt(toNext))
		want.Add(want, big.NewInt(w-1))
		want.Quo(want, big.NewInt(w))
		if want.Cmp(big.NewInt(math.MaxInt64/4)) > 0 {
			want.SetInt64(math.MaxInt64 / 4)
		}
		if got := l.weight(prev, toNext); got != want.Int64() {
			t.Fatalf("weight(%d, %d) in a window of %d = %d, want %s", prev, toNext, w, got, want)
		}
	}
}

// TestCalendarUndo: a calendar window's undo gives back to the state's
// window a request charged in it, from its first µs on, and nothing for
// a decision made at or after the window's end (a later window's).
func TestCalendarUndo(t *testing.T) {
	cal := Calendar{Day, 1, time.UTC}
	l, err := NewCalendarLimit(2, cal)
	if err != nil {
		t.Fatal(err)
	}
	d0 := micros(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	d1 := d0 + 86400e6
	var s State
	first := l.Take(&s, d0, Milli) // the window's first µs
	if second := l.Take(&s, d0+5, Milli); !first.Allowed || !second.Allowed {
		t.Fatalf("takes: %+v, %+v", first, second)
	}
	// A decision of the next window: not charged here.
	l.Undo(&s, d1-2, Milli, Decision{Allowed: true, At: d1})
	if d := l.Peek(&s, d1-2, Milli); d.Allowed {
		t.Fatalf("after the undo of the next window's request: %+v, want the window still full", d)
	}
	l.Undo(&s, d1-2, Milli, first)
	if d := l.Peek(&s, d1-2, Milli); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after the undo of the first request: %+v, want one event admitted", d)
	}
}

// TestSlidingUndoPrevious: an undo of a request charged in the previous
// window gives it back to that window's count, and to what the state
// keeps of that window's charges (Head, see State), which a seed reads.
func TestSlidingUndoPrevious(t *testing.T) {
	l := mustLimit(t, SlidingWindow, 4, time.Second, 0, 0)
	w0 := t0 - t0%l.Window
	var s State
	taken := l.Take(&s, w0+10, 3*Milli)
	l.Undo(&s, w0+sec+10, Milli, taken)
	if s.Prev != 2*Milli || s.Head != 2*Milli {
		t.Fatalf("after an undo of 1 of the previous window's 3: Prev %d, Head %d, want both %d", s.Prev, s.Head, 2*Milli)
	}
}

// TestSlidingLogGrantEndsBeforeWait: a sliding_log whose log is full with
// its grant, asked for one more: the oldest entry leaves the window just
// as the grant ends, and the log must then hold at most N, so the wait
// is until the next entry leaves, not the first.
func TestSlidingLogGrantEndsBeforeWait(t *testing.T) {
	l := mustLimit(t, SlidingLog, 1, 10*time.Second, 0, 0)
	var s State
	if _, err := l.Grant(&s, t0, Milli); err != nil { // until t0 + 10 s
		t.Fatal(err)
	}
	for _, at := range []int64{t0, t0 + 5*sec} {
		if d := l.Take(&s, at, Milli); !d.Allowed {
			t.Fatalf("take at t0+%dµs: %+v", at-t0, d)
		}
	}
	d := l.Take(&s, t0+6*sec, Milli)
	if d.Allowed || d.Wait != 9*sec {
		t.Fatalf("a third: %+v, want refused with Wait 9s (until the second entry leaves at t0+15s)", d)
	}
}

// TestSlidingLogRing: the ring's size step by step: none for a fresh
// key, 4 for the first entries, doubled when a request finds it full
// (not before: 4 entries fit in 4), up to N; halved when at most a
// quarter of it is in use (a quarter exactly too), not below 4.
func TestSlidingLogRing(t *testing.T) {
	l := mustLimit(t, SlidingLog, 100, time.Minute, 0, 0)
	var s State
	for k := int64(1); k <= 100; k++ {
		l.Take(&s, t0+k, Milli)
		want := int64(minLog)
		for want < k {
			want *= 2
		}
		want = min(want, 100)
		if int64(len(s.Log)) != want {
			t.Fatalf("after %d entries a ring of %d, want %d", k, len(s.Log), want)
		}
	}
	// 16 entries in a ring of 16 (from scratch), then 12 expire: 4 in
	// use, a quarter, halves it to 8 at the next commit (of no cost).
	var q State
	for k := int64(0); k < 12; k++ {
		l.Take(&q, t0+k, Milli)
	}
	for k := int64(0); k < 4; k++ {
		l.Take(&q, t0+30*sec+k, Milli)
	}
	if len(q.Log) != 16 {
		t.Fatalf("16 entries in a ring of %d, want 16", len(q.Log))
	}
	l.Take(&q, t0+60*sec+12, 0)
	if q.Level != 4 || len(q.Log) != 8 {
		t.Fatalf("4 entries left: %d in a ring of %d, want 4 in 8", q.Level, len(q.Log))
	}
	// 4 in a ring of 4 stays 4, and an empty ring of 4 too.
	var f State
	for k := int64(0); k < 4; k++ {
		l.Take(&f, t0+k, Milli)
	}
	l.Take(&f, t0+2*time.Minute.Microseconds(), 0)
	if f.Level != 0 || len(f.Log) != minLog {
		t.Fatalf("all expired: %d entries in a ring of %d, want 0 in %d", f.Level, len(f.Log), minLog)
	}
}

// TestSlidingLogEmptyGrant: a grant of nothing to a sliding_log leaves a
// fresh key fresh (Reset 0), and its window end unread.
func TestSlidingLogEmptyGrant(t *testing.T) {
	l := mustLimit(t, SlidingLog, 3, time.Minute, 0, 0)
	var s State
	if _, err := l.Grant(&s, t0, 0); err != nil {
		t.Fatal(err)
	}
	if d := l.Peek(&s, t0, Milli); !d.Allowed || d.Reset != 0 || d.Remaining != 3 {
		t.Fatalf("after a grant of nothing: %+v, want admitted, Reset 0, Remaining 3", d)
	}
}

// TestCalendarUndoAtEnd: an undo at the window's end gives nothing back:
// the window no longer counts, even for a clock that then runs back.
func TestCalendarUndoAtEnd(t *testing.T) {
	l, err := NewCalendarLimit(1, Calendar{Day, 1, time.UTC})
	if err != nil {
		t.Fatal(err)
	}
	d0 := micros(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	d1 := d0 + 86400e6
	var s State
	taken := l.Take(&s, d0+5, Milli)
	l.Undo(&s, d1, Milli, taken)
	if d := l.Peek(&s, d1-1, Milli); d.Allowed {
		t.Fatalf("after an undo at the window's end, a request a µs before it: %+v, want refused", d)
	}
}

// TestSlidingLogUndoStale: an undo reads no slot past the log's entries
// (a slot an earlier undo left holds a stale time that may match).
func TestSlidingLogUndoStale(t *testing.T) {
	l := mustLimit(t, SlidingLog, 5, time.Minute, 0, 0)
	var s State
	d := l.Take(&s, t0, 2*Milli) // two entries at t0
	l.Undo(&s, t0, Milli, d)     // one left; its old slot still reads t0
	l.Undo(&s, t0, 2*Milli, d)
	if s.Level != 0 {
		t.Fatalf("after undoing 1 and then 2 of 2 entries: %d entries, want 0", s.Level)
	}
}
