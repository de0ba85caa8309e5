package algorithms

import "errors"

// ErrNoGrant is the error of a grant to a limit whose algorithm has no
// window to grant quota in: the bucket family (a bucket holds at most its
// burst, so added tokens would be capped at a full bucket: a reset does
// that), and the limits that are not rates.
var ErrNoGrant = errors.New("grants are for fixed_window, sliding_window and sliding_log: a bucket holds at most its burst (a reset fills it)")

// MaxGrant bounds a key's grant, in milli-units: MaxEvents events, so that
// the limit with it stays exact in a Lua twin's doubles.
const MaxGrant = MaxEvents * Milli

// MaxLogGrant bounds a sliding_log key's grant, in milli-units:
// MaxLogEvents events, as its log keeps a time for each event admitted.
const MaxLogGrant = MaxLogEvents * Milli

// Grantable reports whether l's keys can be granted extra quota (see
// Grant).
func (l *Limit) Grantable() bool {
	return l.Kind == FixedWindow || l.Kind == SlidingWindow || l.Kind == SlidingLog
}

// GrantCap is the most a key of l can be granted, in milli-units, its
// grants added up.
func (l *Limit) GrantCap() int64 {
	if l.Kind == SlidingLog {
		return MaxLogGrant
	}
	return MaxGrant
}

// Grant gives s amount milli-units of extra quota for the window that
// holds now: that window admits the limit's events and the grant, and the
// grant ends with it. For a sliding_window, the window's count may reach
// the limit and the grant less the previous window's weight, and the next
// window weighs the count less the grant: what the grant admitted ends
// with the window too. A sliding_log's window is the next W from the
// grant on: until then the log may hold the limit's events and the
// grant's whole events; each grant starts that window anew. Grants add
// up, to at most GrantCap. A grant never lets the key pass the limit by
// more than what was granted. It returns what Peek for one event returns
// after it.
// For a calendar window it is shorthand for GrantIn(s,
// l.Calendar.Span(now), now, amount).
func (l *Limit) Grant(s *State, now, amount int64) (Decision, error) {
	return l.GrantIn(s, l.Calendar.Span(now), now, amount)
}

// GrantIn is Grant with the calendar window's bounds given, as TakeIn.
func (l *Limit) GrantIn(s *State, sp Span, now, amount int64) (Decision, error) {
	if !l.Grantable() {
		return Decision{}, ErrNoGrant
	}
	if !l.holds(s, sp, now) {
		return Decision{}, ErrOutsideSpan
	}
	switch {
	case l.Calendar.Unit != NoUnit:
		now = l.rollPeriod(s, now, &sp)
	case l.Kind == SlidingLog:
		now = l.logNow(s, now)
	default:
		now, _ = l.roll(s, now)
	}
	g := min(l.granted(s)+max(amount, 0), l.GrantCap())
	switch l.Kind {
	case SlidingWindow:
		s.Head = -g // see State
	case SlidingLog:
		s.Prev, s.At = g, now+l.Window
	default:
		s.Head = g
	}
	var d Decision
	l.decide(s, now, Milli, false, &sp, &d)
	return d, nil
}

// Granted is the quota, in milli-units, granted to s's window at now (see
// Grant): what the key's grants add up to while their window lasts, 0
// once it has ended or the key was never granted. The bucket family takes
// no grants: for it, as for the limits that are not rates, it is 0. It
// reads s as Peek would bring it up to date with now, and changes
// nothing.
func (l *Limit) Granted(s *State, now int64) int64 {
	switch {
	case l.Kind == SlidingLog:
		if s.Level > 0 {
			now = max(now, s.entry(s.Level-1)) // as logNow holds the clock
		}
		if now >= s.At {
			return 0
		}
	case l.Kind != FixedWindow && l.Kind != SlidingWindow:
		return 0
	case l.Calendar.Unit != NoUnit:
		if max(now, s.At) >= s.Prev { // as rollPeriod
			return 0
		}
	default:
		if now = max(now, s.At); now-now%l.Window > s.At { // as roll
			return 0
		}
	}
	return l.granted(s)
}
