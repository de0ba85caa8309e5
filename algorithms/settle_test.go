package algorithms

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// TestSettleSteps steps through settlements on a fixed time grid: a give
// back returns the key to where it would be without the request, an excess
// is owed past the capacity and waited off.
func TestSettleSteps(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			// 5 per 5s, burst 5: one event refills in 1s.
			l := mustLimit(t, kind, 5, 5*time.Second, 0, 0)
			s := NewState(&l)
			// Five reservations of 1 fill the bucket.
			var taken [5]Decision
			for i := range taken {
				taken[i] = l.Take(&s, t0, Milli)
				if !taken[i].Allowed {
					t.Fatalf("step %d: Take(t0, 1) rejected", i)
				}
			}
			if d := l.Peek(&s, t0, Milli); d.Allowed {
				t.Fatalf("Peek after 5: allowed, want rejected")
			}
			// The last one's response did not match: given back whole.
			l.Settle(&s, t0, Milli, 0, taken[4])
			if d := l.Peek(&s, t0, Milli); !d.Allowed {
				t.Fatalf("Peek after giving back the last: %+v, want allowed", d)
			}
			// Another settles to 7 events: 6 owed, debt 4+1+6 = 11s.
			d := l.Take(&s, t0, Milli)
			l.Settle(&s, t0, Milli, 7*Milli, d)
			if got := l.Peek(&s, t0+5*sec, Milli); got.Allowed || got.Wait != 2*sec {
				t.Errorf("Peek(t0+5s) after owing 6 = %+v, want rejected with wait 2s", got)
			}
			if got := l.Peek(&s, t0+7*sec, Milli); !got.Allowed {
				t.Errorf("Peek(t0+7s) after owing 6 = %+v, want allowed", got)
			}
		})
	}
	t.Run("fixed_window", func(t *testing.T) {
		l := mustLimit(t, FixedWindow, 3, time.Second, 0, 0)
		s := NewState(&l)
		d := l.Take(&s, t0, Milli)
		l.Settle(&s, t0+1, Milli, 10*Milli, d) // 9 owed in this window
		if got := l.Peek(&s, t0+2, Milli); got.Allowed || got.Wait != sec-2 {
			t.Errorf("Peek after owing = %+v, want rejected until the window ends", got)
		}
		if got := l.Peek(&s, t0+sec, Milli); !got.Allowed {
			t.Errorf("Peek in the next window = %+v, want allowed", got)
		}
		d = l.Take(&s, t0+sec, 2*Milli)
		l.Settle(&s, t0+sec+1, 2*Milli, 0, d) // given back
		if got := l.Peek(&s, t0+sec+1, 3*Milli); !got.Allowed {
			t.Errorf("Peek(3) after giving back 2 = %+v, want allowed", got)
		}
	})
	t.Run("sliding_log_cannot", func(t *testing.T) {
		l := mustLimit(t, SlidingLog, 3, time.Second, 0, 0)
		if l.CanSettle() == nil {
			t.Errorf("sliding_log CanSettle() = nil, want an error")
		}
		s := NewState(&l)
		d := l.Take(&s, t0, 2*Milli)
		l.Settle(&s, t0, 2*Milli, 0, d) // a give-back still works
		if got := l.Peek(&s, t0, 3*Milli); !got.Allowed {
			t.Errorf("Peek(3) after giving back = %+v, want allowed", got)
		}
	})
}

// TestOweCaps owes costs far beyond any capacity, and checks that the
// state stays within OwedCap (exact in a Lua double) and keeps refusing.
func TestOweCaps(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow} {
		for _, n := range []int64{1, 300_000} {
			l := mustLimit(t, kind, n, time.Second, 0, 0)
			s := NewState(&l)
			d := l.Take(&s, t0, Milli)
			for _, cost := range []int64{math.MaxInt64 / 4, math.MaxInt64, OwedCap} {
				l.Settle(&s, t0, Milli, cost, d)
			}
			if s.Level > OwedCap {
				t.Errorf("%s n=%d: Level = %d after owing huge costs, want <= %d", kind, n, s.Level, OwedCap)
			}
			if got := l.Peek(&s, t0+sec/2, Milli); got.Allowed {
				t.Errorf("%s n=%d: Peek after owing a huge cost = %+v, want rejected", kind, n, got)
			}
			if x := l.OweAmount(math.MaxInt64); x != OwedCap {
				t.Errorf("%s n=%d: OweAmount(MaxInt64) = %d, want %d", kind, n, x, OwedCap)
			}
		}
	}
}

// settled is one admitted request of a settlement trace.
type settled struct {
	at, settleAt     int64
	reserved, actual int64 // milli
}

// TestSettleBound runs random traces of requests that reserve an estimate,
// run for a while (several in flight at once) and settle to a random
// actual cost, and checks the bound of settle.go for every interval
// between two admissions: the actual costs admitted in it sum to at most
// B + r*t + X, X the excess settled after its last admission. A give-back
// that minted quota, or an excess not charged, breaks it.
func TestSettleBound(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(29, uint64(kind)))
			for trace := 0; trace < traces(); trace++ {
				// Whole-µs units, so that no rounding enters the bound:
				// n per n seconds, one event per second.
				n := 1 + rng.Int64N(6)
				l := mustLimit(t, kind, n, time.Duration(n)*time.Second, rng.Int64N(2*n+1), 0)
				reqs := runSettleTrace(rng, &l, 60)
				checkBound(t, &l, reqs, func(a, b settled) (int64, int64) {
					return l.Tau, (b.at - a.at) * l.Scale
				}, l.Unit)
			}
		})
	}
	t.Run("fixed_window", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(29, 4))
		for trace := 0; trace < traces(); trace++ {
			n := 1 + rng.Int64N(6)
			l := mustLimit(t, FixedWindow, n, time.Duration(n)*time.Second, 0, 0)
			reqs := runSettleTrace(rng, &l, 60)
			// Per window: intervals within one window get N, whatever t.
			byWindow := map[int64][]settled{}
			for _, r := range reqs {
				byWindow[r.at/l.Window] = append(byWindow[r.at/l.Window], r)
			}
			for _, in := range byWindow {
				checkBound(t, &l, in, func(a, b settled) (int64, int64) {
					return l.Events * Milli, 0
				}, Milli)
			}
		}
	})
}

// runSettleTrace runs n requests against l and returns the admitted ones.
// Each reserves 0 to 3 events, runs 0 to 3 s, and settles to 0 to 6 events
// (a whole number, or a fraction for the windows' milli-units).
func runSettleTrace(rng *rand.Rand, l *Limit, n int) []settled {
	s := NewState(l)
	type pending struct {
		settled
		d Decision
	}
	var inflight []pending
	var done []settled
	now := t0 + rng.Int64N(l.Window)
	settleUpTo := func(t int64) {
		sort.Slice(inflight, func(i, j int) bool { return inflight[i].settleAt < inflight[j].settleAt })
		k := 0
		for ; k < len(inflight) && inflight[k].settleAt <= t; k++ {
			p := inflight[k]
			l.Settle(&s, p.settleAt, p.reserved, p.actual, p.d)
			done = append(done, p.settled)
		}
		inflight = inflight[k:]
	}
	for i := 0; i < n; i++ {
		now += rng.Int64N(1500 * ms)
		settleUpTo(now)
		r := settled{at: now, reserved: rng.Int64N(4) * Milli, actual: rng.Int64N(7) * Milli}
		r.settleAt = now + rng.Int64N(3*sec+1)
		if d := l.Take(&s, now, r.reserved); d.Allowed {
			inflight = append(inflight, pending{r, d})
		}
	}
	settleUpTo(math.MaxInt64)
	sort.SliceStable(done, func(i, j int) bool { return done[i].at < done[j].at })
	return done
}

// checkBound checks, for every interval [a.at, b.at] between admissions,
// that sum(actual)*unit/Milli <= capacity + refill + X*unit/Milli, with
// capacity and refill (both in the state's units) from limits(a, b).
func checkBound(t *testing.T, l *Limit, reqs []settled, limits func(a, b settled) (int64, int64), unit int64) {
	t.Helper()
	for i := range reqs {
		for j := i; j < len(reqs); j++ {
			if j+1 < len(reqs) && reqs[j+1].at == reqs[j].at {
				continue // b is the last admission at its time
			}
			var sum, excess int64
			for _, r := range reqs[i : j+1] {
				sum += r.actual
				if r.settleAt > reqs[j].at && r.actual > r.reserved {
					excess += r.actual - r.reserved
				}
			}
			capacity, refill := limits(reqs[i], reqs[j])
			if sum*unit/Milli > capacity+refill+excess*unit/Milli {
				t.Fatalf("%s %d/%dµs burst %d: requests admitted in [%d, %d] cost %d milli, above the bound: capacity %d + refill %d + excess %d (units of %d)",
					l.Kind, l.Events, l.Window, l.Burst, reqs[i].at-t0, reqs[j].at-t0, sum, capacity, refill, excess, unit)
			}
		}
	}
}

// TestOweGCRA: a GCRA key owes as a token bucket does (its TAT moves on
// by the excess's refill), also with a debt far beyond MaxSpan/4; the
// zero Limit owes nothing; a cost of exactly OwedCap/Unit events owes
// OwedCap.
func TestOweGCRA(t *testing.T) {
	l := mustLimit(t, GCRA, 10, time.Second, 0, 0)
	var s State
	late := int64(2_300_000_000_000_000) // 2042: the TAT plus now passes 4 MaxSpan
	l.Take(&s, late, Milli)
	l.Owe(&s, late, 2*Milli)
	if d := l.Peek(&s, late, 0); d.Reset != 300*ms {
		t.Fatalf("after owing 2 events: Reset %d, want %d", d.Reset, 300*ms)
	}
	long := mustLimit(t, GCRA, 1, time.Duration(MaxSpan/2)*time.Microsecond, 0, 0)
	var ls State
	long.Take(&ls, t0, Milli)
	long.Owe(&ls, t0, Milli)
	if d := long.Peek(&ls, t0, 0); d.Reset != OwedCap {
		t.Fatalf("a debt of MaxSpan/2 owing an event: Reset %d, want OwedCap %d", d.Reset, OwedCap)
	}
	var zero Limit
	if x := zero.OweAmount(Milli); x != 0 {
		t.Fatalf("the zero Limit owes %d, want 0", x)
	}
	three := mustLimit(t, TokenBucket, 1, 3*time.Microsecond, 0, 0) // Unit 3
	if x := three.OweAmount(OwedCap / three.Unit * Milli); x != OwedCap {
		t.Fatalf("OwedCap/Unit events owe %d, want OwedCap %d", x, OwedCap)
	}
}
