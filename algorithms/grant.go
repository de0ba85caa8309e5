package algorithms

import "errors"

// ErrNoGrant is the error of a grant to a limit whose algorithm has no
// window to grant quota in: the bucket family (a bucket holds at most its
// burst, so added tokens would be capped at a full bucket: a reset does
// that), sliding_log (its log has no window that starts or ends, so a
// grant would have no end), and the limits that are not rates.
var ErrNoGrant = errors.New("grants are for fixed_window and sliding_window: the other algorithms have no window for extra quota to end with")

// MaxGrant bounds a key's grant, in milli-units: MaxEvents events, so that
// the limit with it stays exact in a Lua twin's doubles.
const MaxGrant = MaxEvents * Milli

// Grantable reports whether l's keys can be granted extra quota (see
// Grant).
func (l *Limit) Grantable() bool {
	return l.Kind == FixedWindow || l.Kind == SlidingWindow
}

// Grant gives s amount milli-units of extra quota for the window that
// holds now: that window admits the limit's events and the grant, and the
// grant ends with it. For a sliding_window, the window's count may reach
// the limit and the grant less the previous window's weight, and the next
// window weighs the count less the grant: what the grant admitted ends
// with the window too. Grants add up, to at most MaxGrant. A grant never
// lets the key pass the limit by more than what was granted. It returns
// what Peek for one event returns after it.
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
	if l.Calendar.Unit != NoUnit {
		now = l.rollPeriod(s, now, &sp)
	} else {
		now = l.roll(s, now)
	}
	g := min(l.granted(s)+max(amount, 0), MaxGrant)
	if l.Kind == SlidingWindow {
		g = -g // see State
	}
	s.Head = g
	return l.decide(s, now, Milli, false, &sp), nil
}
