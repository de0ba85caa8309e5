package algorithms

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestRatePrecision runs each bucket algorithm flat out for a long
// stretch of simulated time: every µs (or coarser, for slow rates) as many
// one-event requests as it admits. The admitted count must never pass
// B + r*t and must be within 0.1% of it. With the refill time of an event
// rounded up to a whole µs, 300000/s admitted 250000/s and 999999/s
// admitted 500000/s. Under the race detector each span is a tenth as
// long (see raceOn), and for mutation testing (see mutationOn).
func TestRatePrecision(t *testing.T) {
	for _, c := range []struct {
		events int64
		window time.Duration
		step   time.Duration // simulated time between bursts of requests
		span   time.Duration // simulated time in all
	}{
		{300_000, time.Second, time.Microsecond, 2 * time.Second},
		{999_999, time.Second, time.Microsecond, 2 * time.Second},
		{1_000_000, time.Second, time.Microsecond, 2 * time.Second},
		{333_333, time.Second, 3 * time.Microsecond, 2 * time.Second},
		{7, time.Second, time.Millisecond, 2000 * time.Second},
		{1001, time.Second, time.Microsecond, 10 * time.Second},
		{1, time.Hour, time.Second, 3000 * time.Hour},
	} {
		for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
			t.Run(fmt.Sprintf("%s/%d_per_%s", kind, c.events, c.window), func(t *testing.T) {
				l := mustLimit(t, kind, c.events, c.window, 0, 0)
				var s State
				var admitted int64
				span := c.span
				if raceOn || mutationOn || testing.Short() {
					span /= 10
				}
				step, end := c.step.Microseconds(), t0+span.Microseconds()
				for now := t0; now <= end; now += step {
					for l.Take(&s, now, Milli).Allowed {
						admitted++
					}
				}
				// B + r*t, t the simulated time from the first request to
				// the last.
				ideal := float64(l.Burst) + float64(c.events)*float64(end-t0)/float64(l.Window)
				if float64(admitted) > ideal {
					t.Fatalf("%d admitted in %s, more than B + r*t = %.1f", admitted, span, ideal)
				}
				if float64(admitted) < ideal*(1-0.001)-1 {
					t.Fatalf("%d admitted in %s, want within 0.1%% of B + r*t = %.1f (%.3f%% short)", admitted, span, ideal, 100*(1-float64(admitted)/ideal))
				}
			})
		}
	}
}

// TestPropertyLateUndo: random interleavings of requests and give-backs of
// random earlier admissions, possibly windows later, never admit more
// than the definition. At every admission the live admissions (admitted
// and not given back by then) must satisfy the algorithm's bound: a
// give-back that returned quota to the wrong window, or more than the
// charge still held, lets the next admissions pass it.
func TestPropertyLateUndo(t *testing.T) {
	for _, kind := range allKinds {
		for _, shaping := range []bool{false, true} {
			if shaping && kind != LeakyBucket {
				continue
			}
			t.Run(fmt.Sprintf("alg=%s/shaping=%t", kind, shaping), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(11, uint64(kind)))
				for range traces() {
					l := randLimit(t, rng, kind, shaping)
					lateUndoTrace(t, rng, &l)
				}
			})
		}
	}
}

type live struct {
	d    Decision
	cost int64
}

func lateUndoTrace(t *testing.T, rng *rand.Rand, l *Limit) {
	t.Helper()
	var s State
	var alive []live
	now := t0 + rng.Int64N(l.Window)
	for i := 0; i < 300; i++ {
		switch r := rng.IntN(10); {
		case r < 3:
		case r < 7:
			now += rng.Int64N(l.Window/3 + 1)
		default:
			now += rng.Int64N(2*l.Window + 1)
		}
		if len(alive) > 0 && rng.IntN(4) == 0 {
			j := rng.IntN(len(alive))
			l.Undo(&s, now, alive[j].cost, alive[j].d)
			alive = append(alive[:j], alive[j+1:]...)
			continue
		}
		cost := []int64{Milli, Milli, Milli / 2, 2 * Milli, 0}[rng.IntN(5)]
		d := l.Take(&s, now, cost)
		if !d.Allowed {
			continue
		}
		alive = append(alive, live{d, cost})
		checkLive(t, l, alive, now)
	}
}

// checkLive checks the live admissions against l's definition, at an
// admission at now.
func checkLive(t *testing.T, l *Limit, alive []live, now int64) {
	t.Helper()
	limit := l.Capacity()
	switch l.Kind {
	case FixedWindow, SlidingWindow:
		start := now - now%l.Window
		var cur, prev int64
		for _, a := range alive {
			switch a.d.At - a.d.At%l.Window {
			case start:
				cur += a.cost
			case start - l.Window:
				prev += a.cost
			}
		}
		if cur > limit {
			t.Fatalf("%s: %s live in the window from %s, more than N", describe(l), events(cur), at(start))
		}
		if l.Kind == SlidingWindow && mulCmp(prev, l.Window-(now-start), limit-cur, l.Window) > 0 {
			t.Fatalf("%s: at %s: %s * (1 - e/W) + %s is more than N", describe(l), at(now), events(prev), events(cur))
		}
	case SlidingLog:
		var n int64
		for _, a := range alive {
			if a.d.At > now-l.Window {
				n += ceilDiv(a.cost, Milli)
			}
		}
		if n > l.Events {
			t.Fatalf("%s: %d events live in (%s, %s], more than N", describe(l), n, at(now-l.Window), at(now))
		}
	default:
		// Released times (admission plus delay), in order: for any span
		// [a, b] of them, the cost released is at most B + r(b - a).
		for i := range alive {
			var cost int64
			ai := alive[i].d.At + alive[i].d.Delay
			for j := range alive {
				if aj := alive[j].d.At + alive[j].d.Delay; aj >= ai {
					cost += alive[j].cost
				}
			}
			last := now + alive[len(alive)-1].d.Delay
			span := last - ai
			if l.Scale > 1 {
				span++ // delays are rounded up to the µs
			}
			if cost*l.Window > (l.Burst*l.Window+l.Events*span)*Milli {
				t.Fatalf("%s: %s live released from %s to %s, more than B + r*T", describe(l), events(cost), at(ai), at(last))
			}
		}
	}
}

// TestSlidingLogGrowsWithEntries: a sliding_log key holds a ring the size
// of its entries, not of events: one entry costs a few words, N entries N,
// and the ring shrinks back as they expire.
func TestSlidingLogGrowsWithEntries(t *testing.T) {
	l := mustLimit(t, SlidingLog, 100_000, time.Hour, 0, 0)
	if s := NewState(&l); cap(s.Log) != 0 {
		t.Fatalf("a fresh sliding_log state holds %d entries of room, want none", cap(s.Log))
	}
	var s State
	l.Take(&s, t0, Milli)
	if len(s.Log) > minLog {
		t.Fatalf("after one request the log has room for %d entries, want at most %d", len(s.Log), minLog)
	}
	for i := int64(1); i < 1000; i++ {
		l.Take(&s, t0+i, Milli)
	}
	if s.Level != 1000 || len(s.Log) > 2048 {
		t.Fatalf("after 1000 requests: %d entries in a ring of %d, want 1000 in at most 2048", s.Level, len(s.Log))
	}
	full := mustLimit(t, SlidingLog, 5, time.Hour, 0, 0)
	var f State
	for i := int64(0); i < 7; i++ {
		full.Take(&f, t0+i, Milli)
	}
	if f.Level != 5 || len(f.Log) != 5 {
		t.Fatalf("a full log of 5: %d entries in a ring of %d, want 5 in 5", f.Level, len(f.Log))
	}
	// An hour later the 1000 entries have expired: the next request
	// shrinks the ring.
	for i := int64(0); i < 20; i++ {
		l.Take(&s, t0+2*3600*sec+i, Milli)
	}
	if len(s.Log) > 64 {
		t.Fatalf("with 20 live entries the ring still holds %d, want it shrunk", len(s.Log))
	}
}
