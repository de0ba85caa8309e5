package algorithms

import "fmt"

// Settlement. A zone that charges a request by how its response ended
// (count_response, cost_response) reserves a cost when the request arrives,
// admitting it only if that fits, and settles the charge to the actual
// cost when the response is complete: what was reserved and not spent is
// given back (as Undo gives back), and what was spent beyond the
// reservation is owed (charged past the capacity: the work is done, and
// the key waits it off before its next admission).
//
// The bound it keeps, for the bucket family: over any interval of length
// t, the actual costs of the requests admitted in it sum to at most
// B + r*t + X, where X is the excess (actual - reserved, where positive)
// of those of them settled after the interval's last admission. An
// excess settled before an admission is charged before that admission is
// decided, so it counts against the capacity like any charge; only the
// excess of requests still in flight when the last one is admitted can
// pass it. For fixed_window the same holds per window: a window admits at
// most N plus the excess settled in it after its last admission.

// OwedCap bounds the debt (bucket family, in ticks) or count (windows, in
// milli-units) that owing can build: 2^50, so that every sum a decision
// then makes (a debt plus a cost, a window's count plus the previous
// one's weight plus a cost) stays below 2^52, exact in a Lua twin's
// doubles and within sliding_window's exact products. It is 35 years of
// debt at one tick per µs, and 2^40 events counted in one window.
const OwedCap int64 = MaxSpan

// CanSettle reports, as an error naming why, whether l can settle a
// request to an actual cost above what it reserved (owe). Every kind of
// the bucket and window families can; a sliding_log keeps one timestamp
// per admitted event, up to its events, and cannot hold a cost found only
// afterwards. Giving back (actual below reserved) works for every kind.
func (l *Limit) CanSettle() error {
	switch l.Kind {
	case TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow:
		return nil
	case SlidingLog:
		return fmt.Errorf("sliding_log keeps one timestamp per admitted event, at most events of them, and cannot charge a cost known only from the response; use sliding_window, fixed_window or a bucket algorithm")
	}
	return fmt.Errorf("%s has no cost to settle", l.Kind)
}

// Settle settles a request that the Take whose Decision is taken admitted
// with reserved milli-units to its actual cost, at now: actual < reserved
// gives the difference back to where it was charged (see Undo: never more
// than the charge still holds); actual > reserved owes the excess (see
// Owe). A sliding_log owes nothing (see CanSettle).
func (l *Limit) Settle(s *State, now, reserved, actual int64, taken Decision) {
	reserved, actual = max(reserved, 0), max(actual, 0)
	switch {
	case actual < reserved:
		l.Undo(s, now, reserved-actual, taken)
	case actual > reserved:
		l.Owe(s, now, actual-reserved)
	}
}

// Owe charges cost milli-units to s at now whatever the capacity: the
// excess of a request whose actual cost was found after it ran. A bucket's
// debt grows past its capacity, and the key is refused until it has
// drained back to where a request fits; a window's count grows past its
// limit for the window now current (the one the excess is found in). The
// debt or count is capped at OwedCap, or at what it already holds if more.
// A sliding_log is left as it is.
func (l *Limit) Owe(s *State, now, cost int64) {
	x := l.OweAmount(cost)
	if x <= 0 {
		return
	}
	switch l.Kind {
	case TokenBucket, LeakyBucket:
		var d Decision
		l.bucket(s, now, 0, false, &d)
		s.Level = owe(s.Level, x)
	case GCRA:
		if s.At-now > MaxSpan*4 {
			return // a TAT far ahead (a clock that ran back): refusing already
		}
		l.setTAT(s, now, owe(l.gcraDebt(s, now), x))
	case FixedWindow, SlidingWindow:
		if l.Calendar.Unit != NoUnit {
			sp := l.Calendar.Span(now) // holds now: see decide
			l.rollPeriod(s, now, &sp)
		} else {
			l.roll(s, now)
		}
		s.Level = owe(s.Level, x)
	}
}

// owe is level + x, capped at OwedCap or at level if already above it.
func owe(level, x int64) int64 {
	return min(level+x, max(level, OwedCap))
}

// OweAmount is cost milli-units as Owe adds them to the state: for the
// bucket family the refill time in ticks, ceil(cost * Unit / 1000); for
// the windows the cost itself; 0 for a sliding_log. It is capped at
// OwedCap, and never overflows (cost may be any int64 >= 0, far above the
// capacity). A Lua twin is given this amount.
func (l *Limit) OweAmount(cost int64) int64 {
	if cost <= 0 {
		return 0
	}
	switch l.Kind {
	case TokenBucket, LeakyBucket, GCRA:
		if l.Unit <= 0 {
			return 0
		}
		// cost/Milli events of Unit ticks each: past OwedCap/Unit events
		// the product is capped; below, cost*Unit < (OwedCap + Unit) *
		// Milli < 2^63.
		if cost/Milli >= OwedCap/l.Unit {
			return OwedCap
		}
		return min(l.inc(cost), OwedCap)
	case FixedWindow, SlidingWindow:
		return min(cost, OwedCap)
	}
	return 0
}
