package algorithms

import "math"

// The window family counts cost in milli-units against Events * Milli.
// Windows are aligned to multiples of W since the Unix epoch, so every
// instance and store agrees on where a window starts.

// roll brings a window state up to date with now and returns the
// (possibly adjusted) now. The clock running backwards counts as no time
// elapsed: now never goes before the stored window start.
func (l *Limit) roll(s *State, now int64) int64 {
	if now < s.At {
		now = s.At
	}
	start := now - now%l.Window
	if start > s.At {
		if start-s.At == l.Window {
			s.Prev = s.Level
		} else {
			s.Prev = 0
		}
		s.Level = 0
		s.At = start
	}
	return now
}

// fixedWindow: At = window start, Level = count in the window.
func (l *Limit) fixedWindow(s *State, now, cost int64, commit bool) Decision {
	now = l.roll(s, now)
	limit := l.Events * Milli
	toNext := s.At + l.Window - now
	if s.Level+cost > limit {
		return Decision{Remaining: (limit - s.Level) / Milli, Reset: toNext, Wait: toNext}
	}
	if commit {
		s.Level += cost
	}
	d := Decision{Allowed: true, Remaining: (limit - s.Level) / Milli}
	if s.Level > 0 {
		d.Reset = toNext
	}
	return d
}

// slidingWindow: At = window start, Level = this window's count, Prev = the
// previous window's. The previous count weighs in proportion to how much of
// the sliding window still overlaps it: prev * (W - elapsed) / W, floored.
// The weight is computed in float64 in the order a Lua twin computes it,
// (prev * (W - e)) / W, so both round alike.
func (l *Limit) slidingWindow(s *State, now, cost int64, commit bool) Decision {
	now = l.roll(s, now)
	limit := l.Events * Milli
	e := now - s.At
	toNext := l.Window - e
	weighted := l.weight(s.Prev, toNext)
	if weighted+s.Level+cost > limit {
		return Decision{
			Remaining: max(0, limit-weighted-s.Level) / Milli,
			Reset:     l.slidingReset(s, toNext),
			Wait:      l.slidingWait(s, e, cost),
		}
	}
	if commit {
		s.Level += cost
	}
	return Decision{
		Allowed:   true,
		Remaining: (limit - weighted - s.Level) / Milli,
		Reset:     l.slidingReset(s, toNext),
	}
}

func (l *Limit) slidingReset(s *State, toNext int64) int64 {
	switch {
	case s.Level > 0:
		return toNext + l.Window
	case s.Prev > 0:
		return toNext
	}
	return 0
}

// weight is the previous window's count prev as it weighs toNext µs before
// the current window ends: floor((prev * toNext) / W), in float64 in the
// order the Lua twin computes it.
func (l *Limit) weight(prev, toNext int64) int64 {
	return int64(math.Floor(float64(prev) * float64(toNext) / float64(l.Window)))
}

// slidingWait is the µs until a rejected request of cost fits: until the
// previous window's weight has decayed enough, or, when this window alone
// is too full, into the next window until this window's weight has.
func (l *Limit) slidingWait(s *State, e, cost int64) int64 {
	limit := l.Events * Milli
	if room := limit - s.Level - cost; room >= 0 {
		// It fits at the latest at the next window start (the weight is 0
		// at e' = W) and not now, at e.
		return l.decayed(s.Prev, room, e+1) - e
	}
	// Next window: this window's count is the previous one, and the
	// current one is empty.
	return l.Window - e + l.decayed(s.Level, limit-cost, 0)
}

// decayed returns the least elapsed time e' in [lo, W] at which
// weight(prev, W - e') <= room, for room >= 0. It searches rather than
// solving prev * (W - e') / W <= room: the weight is floored and rounded
// as a float, so only the expression the decision itself evaluates gives the
// exact answer. The weight never grows with e', and at most 51 steps are
// taken (W <= 2^50).
func (l *Limit) decayed(prev, room, lo int64) int64 {
	hi := l.Window
	for lo < hi {
		mid := lo + (hi-lo)/2
		if l.weight(prev, l.Window-mid) <= room {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// windowUndo gives cost back to the window it was taken from: this one, or
// the previous one if the window has rolled once since.
func (l *Limit) windowUndo(s *State, now, cost int64) {
	before := s.At
	l.roll(s, now)
	switch {
	case s.At == before:
		s.Level = max(0, s.Level-cost)
	case s.At-before == l.Window:
		s.Prev = max(0, s.Prev-cost)
	}
}

// slidingLog keeps the admission times of the last N events in a ring:
// Log[Head] is the oldest, Level how many there are. A request of cost c
// counts ceil(c) events (the log holds whole events) and is admitted when
// the events in (now - W, now] plus ceil(c) are at most N.
func (l *Limit) slidingLog(s *State, now, cost int64, commit bool) Decision {
	n := l.Events
	if int64(len(s.Log)) != n {
		*s = NewState(l) // defensive: a store should have made the ring
	}
	if s.Level > 0 {
		if newest := s.Log[(s.Head+s.Level-1)%n]; now < newest {
			now = newest // the clock ran backwards: no time has elapsed
		}
	}
	for s.Level > 0 && s.Log[s.Head] <= now-l.Window {
		s.Head = (s.Head + 1) % n
		s.Level--
	}
	k := ceilDiv(cost, Milli)
	if s.Level+k > n {
		need := s.Level + k - n
		oldest := s.Log[(s.Head+need-1)%n]
		return Decision{
			Remaining: n - s.Level,
			Reset:     s.Log[(s.Head+s.Level-1)%n] + l.Window - now,
			Wait:      oldest + l.Window - now,
		}
	}
	if commit {
		for i := int64(0); i < k; i++ {
			s.Log[(s.Head+s.Level)%n] = now
			s.Level++
		}
	}
	d := Decision{Allowed: true, Remaining: n - s.Level}
	if s.Level > 0 {
		d.Reset = s.Log[(s.Head+s.Level-1)%n] + l.Window - now
	}
	return d
}

func (l *Limit) slidingLogUndo(s *State, now, cost int64) {
	k := ceilDiv(cost, Milli)
	s.Level = max(0, s.Level-k)
}
