package algorithms

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestConcurrencySlots(t *testing.T) {
	l, err := NewConcurrency(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var s State
	held := 0 // requests admitted and not yet ended
	for i := range 10_000 {
		now := int64(i)
		if held > 0 && rng.IntN(2) == 0 {
			l.Undo(&s, now, Milli, Decision{})
			held--
			continue
		}
		peek := l.Peek(&s, now, Milli)
		d := l.Take(&s, now, 5*Milli) // cost does not matter: one request, one slot
		if d.Allowed != peek.Allowed {
			t.Fatalf("step %d: Take %v, Peek %v", i, d, peek)
		}
		if d.Allowed != (held < 3) {
			t.Fatalf("step %d: %d in flight, Take %v", i, held, d)
		}
		if d.Allowed {
			held++
			if d.Remaining != int64(3-held) {
				t.Fatalf("step %d: Remaining %d with %d in flight", i, d.Remaining, held)
			}
		} else if d.Wait != second {
			t.Fatalf("step %d: rejected with Wait %d, want one second", i, d.Wait)
		}
		if l.Fresh(&s, now) != (held == 0) {
			t.Fatalf("step %d: Fresh %v with %d in flight", i, l.Fresh(&s, now), held)
		}
	}
	// More give-backs than takes never mint slots.
	for range 10 {
		l.Undo(&s, 0, Milli, Decision{})
	}
	for i := range 4 {
		if d := l.Take(&s, 0, Milli); d.Allowed != (i < 3) {
			t.Fatalf("after extra undos, take %d: %v", i, d)
		}
	}
}

// banModel is the contract's ban, written plainly: the times of the
// rejections counted in the current strike window, and the ban's end.
type banModel struct {
	after        int
	window, hold int64
	strikes      []int64
	until        int64
}

func (m *banModel) banned(now int64) bool { return now < m.until }

func (m *banModel) strike(now int64) {
	if m.banned(now) {
		return
	}
	if len(m.strikes) > 0 && now >= m.strikes[0]+m.window {
		m.strikes = m.strikes[:0]
	}
	m.strikes = append(m.strikes, now)
	if len(m.strikes) >= m.after {
		m.until, m.strikes = now+m.hold, m.strikes[:0]
	}
}

func TestBanMatchesModel(t *testing.T) {
	for _, after := range []int{1, 2, 5} {
		l, err := NewBan(int64(after), 10*time.Millisecond, 25*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		m := &banModel{after: after, window: l.Window, hold: l.Hold}
		rng := rand.New(rand.NewPCG(uint64(after), 7))
		var s State
		now := int64(1_000_000)
		for i := range 20_000 {
			now += rng.Int64N(4000)
			var d Decision
			if rng.IntN(3) == 0 {
				d = l.Take(&s, now, Milli)
			} else {
				d = l.Strike(&s, now)
				m.strike(now)
			}
			if d.Allowed == m.banned(now) {
				t.Fatalf("after %d, step %d at %d: decision %+v, model banned until %d", after, i, now, d, m.until)
			}
			if !d.Allowed && d.Wait != m.until-now {
				t.Fatalf("after %d, step %d: Wait %d, want %d", after, i, d.Wait, m.until-now)
			}
			if d.Allowed && d.Remaining != int64(after-len(m.strikes)) && len(m.strikes) > 0 && now < m.strikes[0]+m.window {
				t.Fatalf("after %d, step %d: Remaining %d, model has %d strikes", after, i, d.Remaining, len(m.strikes))
			}
			fresh := !m.banned(now) && (len(m.strikes) == 0 || now >= m.strikes[0]+m.window)
			if l.Fresh(&s, now) != fresh {
				t.Fatalf("after %d, step %d: Fresh %v, model %v", after, i, l.Fresh(&s, now), fresh)
			}
		}
	}
}

func TestGuardConfigErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{errOf(NewConcurrency(0, time.Minute)), "concurrency: must be greater than 0, got 0"},
		{errOf(NewConcurrency(1, 10*time.Millisecond)), "concurrency_lease: must be at least 1s, got 10ms"},
		{errOf(NewBan(1, time.Minute, 0)), "ban: must be greater than 0, got 0s"},
		{errOf(NewBan(0, time.Minute, time.Minute)), "ban_after: must be greater than 0, got 0"},
		{errOf(NewBan(1, 0, time.Minute)), "window: a ban counts rejections"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("error %v, want %q", c.err, c.want)
		}
	}
	if _, err := ParseKind("concurrency"); err == nil {
		t.Error("ParseKind accepts concurrency as an algorithm")
	}
}

func errOf(_ Limit, err error) error { return err }

func TestGuardsDoNotAllocate(t *testing.T) {
	c, _ := NewConcurrency(2, time.Minute)
	b, _ := NewBan(2, time.Minute, time.Minute)
	var cs, bs State
	if n := testing.AllocsPerRun(100, func() {
		c.Take(&cs, 1, Milli)
		c.Undo(&cs, 1, Milli, Decision{})
		b.Strike(&bs, 1)
		b.Take(&bs, 2, Milli)
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// TestWaitAlso: a ban's rejection waits for its rate's decision too, and
// keeps its own Reset (the ban's end).
func TestWaitAlso(t *testing.T) {
	ban := Decision{Reset: 60, Wait: 60, At: 7}
	for _, c := range []struct {
		name  string
		d, o  Decision
		wait  int64
		reset int64
	}{
		{"the rate waits longer", ban, Decision{Wait: 3600, Reset: 3600}, 3600, 60},
		{"the rate admits sooner", ban, Decision{Wait: 30, Reset: 30}, 60, 60},
		{"the rate admits now", ban, Decision{Allowed: true, Remaining: 3}, 60, 60},
		{"the rate never admits", ban, Decision{Wait: Never}, Never, 60},
		{"an admission is left alone", Decision{Allowed: true, Remaining: 2}, Decision{Wait: 3600}, 0, 0},
	} {
		d := c.d
		d.WaitAlso(c.o)
		if d.Wait != c.wait || d.Reset != c.reset || d.Allowed != c.d.Allowed || d.At != c.d.At || d.Remaining != c.d.Remaining {
			t.Errorf("%s: %+v, want Wait %d and Reset %d, the rest of %+v", c.name, d, c.wait, c.reset, c.d)
		}
	}
}

// TestGuardConfigEdges: the guards' bounds at their edges are accepted,
// and just past them refused with the whole error.
func TestGuardConfigEdges(t *testing.T) {
	maxSpan := time.Duration(MaxSpan) * time.Microsecond
	for _, err := range []error{
		errOf(NewConcurrency(MaxEvents, maxSpan)),
		errOf(NewBan(MaxEvents, maxSpan, maxSpan)),
	} {
		if err != nil {
			t.Errorf("at the bounds: %v, want accepted", err)
		}
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{errOf(NewConcurrency(MaxEvents+1, time.Minute)), "concurrency: must be at most 1099511627776, got 1099511627777"},
		{errOf(NewConcurrency(1, maxSpan+time.Microsecond)), "concurrency_lease: must be at most 312749h58m26.842624s, got 312749h58m26.842625s"},
		{errOf(NewBan(1, time.Minute, maxSpan+time.Microsecond)), "ban: must be at most 312749h58m26.842624s, got 312749h58m26.842625s"},
		{errOf(NewBan(MaxEvents+1, time.Minute, time.Minute)), "ban_after: must be at most 1099511627776, got 1099511627777"},
		{errOf(NewBan(1, maxSpan+time.Microsecond, time.Minute)), "window: a ban counts rejections within the zone's window, which must be in [1µs, 312749h58m26.842624s], got 312749h58m26.842625s"},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("error %v, want %q", c.err, c.want)
		}
	}
}

// TestBanEdges: a strike window's strikes are forgotten at its end
// exactly, and a strike at a ban's end exactly counts (after 1: it bans
// again).
func TestBanEdges(t *testing.T) {
	b, err := NewBan(3, time.Minute, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var s State
	b.Strike(&s, t0)
	if d := b.Peek(&s, t0+60*sec-1, 0); d.Remaining != 2 {
		t.Fatalf("a µs before the strike window's end: %+v, want 2 left", d)
	}
	if d := b.Peek(&s, t0+60*sec, 0); d.Remaining != 3 || d.Reset != 0 {
		t.Fatalf("at the strike window's end: %+v, want 3 left, Reset 0", d)
	}
	one, err := NewBan(1, time.Minute, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var o State
	one.Strike(&o, t0)
	if d := one.Strike(&o, t0+10*sec); d.Allowed || d.Reset != 10*sec {
		t.Fatalf("a strike as the ban ends: %+v, want banned again for 10s", d)
	}
}
