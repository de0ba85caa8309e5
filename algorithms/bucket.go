package algorithms

// The bucket family. A token bucket with capacity B refilled at r = N/W is
// kept as its debt: the time it needs to be full again, in ticks of
// 1/Scale µs. A fresh key has no debt; a request of cost c adds inc(c) = c
// * W/N; debt drains one tick per tick; a request is admitted while debt +
// inc(c) <= Tau = B * W/N. Read as a leaky bucket, debt is the level and
// draining is the leak, so the two are the same meter (the contract's
// token_bucket and leaky_bucket).
//
// A leaky_bucket with MaxDelay shapes instead of rejecting: a request that
// does not fit now is admitted with a Delay of the time until it fits, its
// place reserved by adding its inc to the level at once, so that later
// requests queue behind it; one that would wait longer than MaxDelay is
// rejected.

// drain returns debt ticks after elapsed µs, without overflow.
func (l *Limit) drain(debt, elapsed int64) int64 {
	elapsed = max(elapsed, 0) // a clock that ran backwards: no time has elapsed
	if elapsed >= l.micros(debt) {
		return 0
	}
	return debt - l.ticks(elapsed) // elapsed < debt/Scale + 1: no overflow
}

// bucket decides for TokenBucket and LeakyBucket into *d. State: At =
// last refill (µs), Level = debt in ticks.
func (l *Limit) bucket(s *State, now, cost int64, commit bool, d *Decision) {
	now = max(now, s.At) // the clock ran backwards: no time has elapsed
	debt := l.drain(s.Level, now-s.At)
	s.At, s.Level = now, debt
	l.meter(&s.Level, now, cost, commit, d)
}

// meter decides cost against the debt *level (ticks) at now into *d,
// adding its inc when commit and admitted.
func (l *Limit) meter(level *int64, now, cost int64, commit bool, d *Decision) {
	l.meterInc(level, now, l.inc(cost), commit, d)
}

// meterInc is meter for a charge of inc ticks.
func (l *Limit) meterInc(level *int64, now, inc int64, commit bool, d *Decision) {
	debt := *level
	over := debt + inc - l.Tau
	switch {
	case over <= 0:
		if commit {
			*level = debt + inc
		}
		*d = Decision{Allowed: true, Remaining: l.wholeUnits(l.Tau - *level), Reset: l.micros(*level), At: now}
	case l.MaxDelay > 0 && over <= l.ticks(l.MaxDelay):
		if commit {
			*level = debt + inc
		}
		*d = Decision{Allowed: true, Remaining: 0, Reset: l.micros(*level), Delay: l.micros(over), At: now}
	default:
		*d = Decision{Remaining: l.wholeUnits(l.Tau - debt), Reset: l.micros(debt), Wait: l.micros(over - l.ticks(l.MaxDelay)), At: now}
	}
}

// giveBack returns the ticks of debt an Undo of inc, charged by the
// decision taken, gives back at now from debt: never more than the charge
// still holds.
//
// The debt is a queue of charges drained in order, one tick per tick: a
// charge starts draining once the charges before it have, and not before
// it was made. When taken's charge is still the last in the queue (the
// queue ends where it ended right after the charge: nothing was charged
// after it, nothing before it given back), it holds min(inc, debt), all of
// which goes back. Otherwise it still holds at least inc minus the time
// since it was made, whatever happened meanwhile; a policing bucket gives
// that back. A shaping bucket gives back nothing then: requests charged
// after it sleep until fixed release times, and the place it left would
// let a new request be released before them, a burst the bucket never
// allows. So an immediate give-back, or the last queued request's client
// leaving, returns the whole charge, and no give-back ever mints quota.
func (l *Limit) giveBack(debt, inc, now int64, taken Decision) int64 {
	if taken.At+taken.Reset == now+l.micros(debt) {
		return min(inc, debt) // the last charge in the queue
	}
	if l.MaxDelay > 0 {
		return 0
	}
	elapsed := max(0, now-taken.At)
	if elapsed >= l.micros(inc) {
		return 0
	}
	return max(0, min(inc-l.ticks(elapsed), debt))
}

func (l *Limit) bucketUndo(s *State, now, cost int64, taken Decision) {
	var d Decision
	l.bucket(s, now, 0, false, &d)
	s.Level -= l.giveBack(s.Level, l.inc(cost), s.At, taken)
}

// HeldAt returns a fresh state of l whose clock reads at, and whether
// l's algorithm has one: a bucket's (token_bucket, leaky_bucket), its
// refill time at and no debt, and an epoch window's, the latest time it
// has seen at and nothing counted. A decision on it at an earlier now is
// decided at at, as on any state that has seen at (the clock ran
// backwards). A reset leaves it where the clock ran back (see
// storage.ResetAt). The others' fresh state keeps no time: a calendar
// window's At is its window's start, gcra's is its debt's end, and a
// sliding_log's times are its entries.
func (l *Limit) HeldAt(at int64) (State, bool) {
	switch l.Kind {
	case TokenBucket, LeakyBucket:
		return State{At: at}, true
	case FixedWindow, SlidingWindow:
		if l.Calendar.Unit == NoUnit {
			return State{At: at}, true
		}
	}
	return State{}, false
}

// gcra decides as bucket does, keeping only the theoretical arrival time
// TAT, at a tick's precision: At µs and Level ticks, 0 <= Level < Scale.
// With one timestamp it cannot tell a clock that ran backwards from debt;
// it then sees more debt, so it errs towards rejecting.
func (l *Limit) gcra(s *State, now, cost int64, commit bool, d *Decision) {
	debt := l.gcraDebt(s, now)
	l.meter(&debt, now, cost, commit, d)
	if commit && d.Allowed {
		l.setTAT(s, now, debt)
	}
}

// gcraDebt is the debt in ticks at now: TAT - now, or 0.
func (l *Limit) gcraDebt(s *State, now int64) int64 {
	if s.At < now {
		return 0 // TAT < At + 1 <= now
	}
	if s.At-now > MaxSpan*4 {
		return maxExact // a TAT far ahead (a clock that ran back): rejects
	}
	return l.ticks(s.At-now) + s.Level
}

// setTAT stores TAT = now + debt ticks, debt >= 0.
func (l *Limit) setTAT(s *State, now, debt int64) {
	q := l.floorMicros(debt)
	s.At, s.Level = now+q, debt-l.ticks(q)
}

func (l *Limit) gcraUndo(s *State, now, cost int64, taken Decision) {
	debt := l.gcraDebt(s, now)
	if debt == 0 {
		return
	}
	l.setTAT(s, now, debt-l.giveBack(debt, l.inc(cost), now, taken))
}
