package algorithms

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestPropertySeed runs random traces against one shared state while a
// local copy is seeded from this instance's decisions, as on_storage_error
// local keeps it. In every mode, right after a seed the copy holds no more
// than the shared state does (its Remaining at the decision's time is no
// less than the decision's).
//
//   - alone: this instance makes every decision. The copy must decide
//     every whole-event request at the decision's time exactly as the
//     shared state does (the bucket family to a tick, so only where a tick
//     is a µs), and never reject, at any later time with nothing charged
//     meanwhile, what the shared state would admit (a sliding_window to a
//     thousandth of an event).
//   - shared: other instances charge the shared state too, and replies can
//     be seeded out of order. The copy must still never reject what the
//     shared state would admit.
//   - outage: some requests are decided on the copy alone, as when the
//     store cannot answer (the store may or may not have charged them).
func TestPropertySeed(t *testing.T) {
	kinds := []struct {
		kind    Kind
		shaping bool
	}{
		{TokenBucket, false}, {GCRA, false}, {LeakyBucket, false}, {LeakyBucket, true},
		{FixedWindow, false}, {SlidingWindow, false}, {SlidingLog, false},
	}
	for _, k := range kinds {
		for mode, modeName := range []string{"alone", "shared", "outage"} {
			name := k.kind.String()
			if k.shaping {
				name += "/shaping"
			}
			t.Run(name+"/"+modeName, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(k.kind)*3+uint64(mode), 17))
				for range traces() {
					l := randLimit(t, rng, k.kind, k.shaping)
					seedTrace(t, rng, &l, mode)
					if t.Failed() {
						return
					}
				}
			})
		}
	}
}

const (
	seedAlone = iota
	seedShared
	seedOutage
)

// pendingSeed is a decision whose seed is held back, to arrive after a
// later one.
type pendingSeed struct {
	d       Decision
	cost    int64
	charged bool
}

func seedTrace(t *testing.T, rng *rand.Rand, l *Limit, mode int) {
	t.Helper()
	shared, local := NewState(l), NewState(l)
	slack := int64(0)
	if l.Kind == SlidingWindow {
		slack = 1
	}
	var history []string // what the shared state and the copy saw, for a failure
	fail := func(format string, args ...any) {
		t.Helper()
		for _, h := range history[max(0, len(history)-8):] {
			t.Log(h)
		}
		t.Errorf(format, args...)
	}
	var held *pendingSeed
	for i, r := range randTrace(rng, l, 60) {
		mine := mode != seedShared || rng.IntN(2) == 0
		if mode == seedOutage && rng.IntN(3) == 0 {
			// The store does not answer in time: the copy decides, and
			// the store may have decided it too.
			if rng.IntN(2) == 0 {
				l.Take(&shared, r.t, r.cost)
			}
			d := l.Take(&local, r.t, r.cost)
			history = append(history, fmt.Sprintf("step %d at %s, cost %s, decided on the copy alone: %+v; the copy %+v", i, at0(r.t), events(r.cost), d, local))
			continue
		}
		var d Decision
		charged := false
		if mine && rng.IntN(8) == 0 {
			// Another zone rejected the request: nothing was charged,
			// and this zone's decision is what it would have decided.
			d = l.Peek(&shared, r.t, r.cost)
		} else {
			d = l.Take(&shared, r.t, r.cost)
			charged = d.Allowed
		}
		history = append(history, fmt.Sprintf("step %d at %s, cost %s, mine %v: %+v, charged %v; shared %+v", i, at0(r.t), events(r.cost), mine, d, charged, shared))
		if !mine {
			continue
		}
		if mode == seedShared && held == nil && rng.IntN(8) == 0 {
			held = &pendingSeed{d, r.cost, charged} // its reply comes late
			continue
		}
		l.Seed(&local, d, r.cost, charged)
		history = append(history, fmt.Sprintf("  the copy: %+v", local))
		stale := false
		if held != nil {
			l.Seed(&local, held.d, held.cost, held.charged)
			history = append(history, fmt.Sprintf("  then the late reply %+v: the copy %+v", held.d, local))
			held, stale = nil, true
		}
		if c := clone(local); !stale && l.Peek(&c, d.At, 0).Remaining < d.Remaining {
			fail("%s, step %d: seeded from %+v (charged %v), the copy %+v holds more than the shared state %+v",
				describe(l), i, d, charged, local, shared)
			return
		}
		if mode == seedOutage {
			continue
		}
		for range 8 {
			at := d.At
			if rng.IntN(4) != 0 {
				at += rng.Int64N(3*l.Window + 1)
			}
			c := seedCost(rng, l)
			s, c2 := clone(shared), clone(local)
			want, got := l.Peek(&s, at, c+slack), l.Peek(&c2, at, c)
			if want.Allowed && !got.Allowed {
				fail("%s, step %d: seeded from %+v (charged %v), the copy %+v rejects %s at %s, which the shared state %+v admits",
					describe(l), i, d, charged, local, events(c), atRel(at, d.At), shared)
				return
			}
		}
		if mode != seedAlone || ((l.Kind == TokenBucket || l.Kind == GCRA || l.Kind == LeakyBucket) && l.Scale != 1) {
			continue
		}
		for c := int64(Milli); c <= l.Capacity(); c += Milli {
			s, c2 := clone(shared), clone(local)
			want, got := l.Peek(&s, d.At, c), l.Peek(&c2, d.At, c)
			if want.Allowed != got.Allowed {
				fail("%s, step %d: seeded from %+v (charged %v), the copy %+v decides %s at the decision's time %v, the shared state %+v %v",
					describe(l), i, d, charged, local, events(c), got.Allowed, shared, want.Allowed)
				return
			}
		}
	}
}

// seedCost is a random cost up to the capacity, often whole events.
func seedCost(rng *rand.Rand, l *Limit) int64 {
	if rng.IntN(2) == 0 {
		return Milli * (1 + rng.Int64N(max(1, l.Capacity()/Milli)))
	}
	return rng.Int64N(l.Capacity() + 1)
}

func atRel(at, from int64) string {
	return fmt.Sprintf("%s (the decision's time + %dµs)", at0(at), at-from)
}

func at0(t int64) string { return fmt.Sprintf("t0+%dµs", t-t0) }

// TestSeedBan copies a ban and its strikes.
func TestSeedBan(t *testing.T) {
	l, err := NewBan(3, time.Minute, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var shared, local State
	now := t0
	for i := range 3 {
		d := l.Strike(&shared, now+int64(i))
		l.Seed(&local, d, 0, false)
		if got, want := l.Peek(&local, now+int64(i), 0), l.Peek(&shared, now+int64(i), 0); got != want {
			t.Fatalf("strike %d: the copy decides %+v, the shared state %+v", i+1, got, want)
		}
	}
	end := shared.At
	if d := l.Peek(&local, end-1, 0); d.Allowed {
		t.Fatalf("the copy's ban ended before the shared one's end: %+v", d)
	}
	if d := l.Peek(&local, end, 0); !d.Allowed {
		t.Fatalf("the copy's ban outlasts the shared one: %+v", d)
	}
	// A ban's decision whose Wait covers its zone's rate (WaitAlso): the
	// copy's ban ends with the shared one, at Reset, not at the Wait.
	d := l.Peek(&shared, now, 0)
	d.WaitAlso(Decision{Wait: d.Wait + 3600*second})
	local = State{}
	l.Seed(&local, d, 0, false)
	if local.At != end {
		t.Fatalf("seeded from a ban whose Wait covers its rate: the copy's ban ends at %s, want %s", at0(local.At), at0(end))
	}
	// A shared decision that admits clears a ban the copy made on its own.
	local = State{At: now + 600_000_000}
	l.Seed(&local, l.Peek(&State{}, now, 0), 0, false)
	if d := l.Peek(&local, now, 0); !d.Allowed || d.Remaining != 3 {
		t.Fatalf("after a shared admission, the copy decides %+v, want admitted with 3 strikes left", d)
	}
}

// TestSeedConcurrencyIsNotSeeded: slots are leases no decision times.
func TestSeedConcurrencyIsNotSeeded(t *testing.T) {
	l, err := NewConcurrency(2, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s := State{Level: 1}
	l.Seed(&s, Decision{At: t0, Remaining: 0, Reset: second, Wait: second}, Milli, false)
	if s.At != 0 || s.Level != 1 || s.Prev != 0 || s.Log != nil {
		t.Fatalf("a concurrency state changed: %+v", s)
	}
}

// TestSeedSlidingWindowForgetsWhatOnlyTheCopyCounted: requests the copy
// admitted on its own while the store could not answer, in the previous
// window, weigh no more than the shared state's own count once the store
// answers again.
func TestSeedSlidingWindowForgetsWhatOnlyTheCopyCounted(t *testing.T) {
	l := mustLimit(t, SlidingWindow, 10, time.Minute, 0, 0)
	w0 := t0 - t0%l.Window
	var shared, local State
	for range 10 {
		if d := l.Take(&local, w0+sec, Milli); !d.Allowed {
			t.Fatalf("the copy on its own: %+v", d)
		}
	}
	now := w0 + l.Window + 30*sec
	d := l.Take(&shared, now, Milli)
	l.Seed(&local, d, Milli, true)
	if got := l.Peek(&local, now, 0); got.Remaining != d.Remaining {
		t.Fatalf("after the seed the copy %+v has %d events left at the decision's time, the shared state %d", local, got.Remaining, d.Remaining)
	}
	if got := l.Peek(&local, now+l.Window, 0); got.Remaining != l.Peek(&shared, now+l.Window, 0).Remaining {
		t.Fatalf("a window later the copy %+v has %d events left, the shared state %+v %d", local, got.Remaining, shared, l.Peek(&shared, now+l.Window, 0).Remaining)
	}
}
