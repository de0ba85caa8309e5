package algorithms

// The bucket family. A token bucket with capacity B refilled at r = N/W is
// kept as its debt: the µs it needs to be full again. A fresh key has no
// debt; a request of cost c adds inc(c) = c * W/N µs; debt drains one µs per
// µs; a request is admitted while debt + inc(c) <= Tau = B * W/N. Read as
// a leaky bucket, debt is the level and draining is the leak, so the two are
// the same meter (the contract's token_bucket and leaky_bucket).
//
// A leaky_bucket with MaxDelay shapes instead of rejecting: a request that
// does not fit now is admitted with a Delay of the time until it fits, its
// place reserved by adding its inc to the level at once, so that later
// requests queue behind it; one that would wait longer than MaxDelay is
// rejected.

// bucket decides for TokenBucket and LeakyBucket. State: At = last refill,
// Level = debt in µs.
func (l *Limit) bucket(s *State, now, cost int64, commit bool) Decision {
	if now < s.At {
		now = s.At // the clock ran backwards: no time has elapsed
	}
	debt := s.Level - (now - s.At)
	if debt < 0 {
		debt = 0
	}
	s.At, s.Level = now, debt

	inc := l.inc(cost)
	over := debt + inc - l.Tau
	switch {
	case over <= 0:
		if commit {
			s.Level = debt + inc
		}
		return Decision{Allowed: true, Remaining: l.wholeUnits(l.Tau - s.Level), Reset: s.Level}
	case l.MaxDelay > 0 && over <= l.MaxDelay:
		if commit {
			s.Level = debt + inc
		}
		return Decision{Allowed: true, Remaining: 0, Reset: s.Level, Delay: over}
	default:
		return Decision{Remaining: l.wholeUnits(l.Tau - debt), Reset: debt, Wait: over - l.MaxDelay}
	}
}

func (l *Limit) bucketUndo(s *State, now, cost int64) {
	l.bucket(s, now, 0, false)
	s.Level -= l.inc(cost)
	if s.Level < 0 {
		s.Level = 0
	}
}

// gcra decides as bucket does, keeping only the theoretical arrival time
// TAT = now + debt in At. With one timestamp it cannot tell a clock that ran
// backwards from debt; it then sees more debt, so it errs towards rejecting.
func (l *Limit) gcra(s *State, now, cost int64, commit bool) Decision {
	tat := s.At
	if tat < now {
		tat = now
	}
	debt := tat - now
	inc := l.inc(cost)
	over := debt + inc - l.Tau
	if over > 0 {
		return Decision{Remaining: l.wholeUnits(l.Tau - debt), Reset: debt, Wait: over}
	}
	if commit {
		s.At = tat + inc
		debt += inc
	}
	return Decision{Allowed: true, Remaining: l.wholeUnits(l.Tau - debt), Reset: debt}
}

func (l *Limit) gcraUndo(s *State, now, cost int64) {
	s.At -= l.inc(cost)
	if s.At < now {
		s.At = now
	}
}
