package algorithms

import (
	"fmt"
	"time"
)

// The two limits a zone can hold beside (or instead of) a rate:
//
// A Concurrency limit admits a request while fewer than Events requests
// of the key are in flight; Take takes a slot and Undo gives it back when
// the request ends. Its State is Level = requests in flight. A request
// counts as one, whatever its cost. (The Redis store keeps each slot as a
// lease that expires Window µs after its last renewal, so that a dead
// instance's slots come back; in one process a slot is given back by the
// request that holds it, and there is nothing to expire.)
//
// A Ban refuses every request of a key for Hold µs once the zone has
// rejected the key Events times within Window µs. Take and Peek only look
// (a ban is never charged by a request); Strike records a rejection. Its
// State is At = the end of the ban (µs), Level = strikes in the current
// strike window, Prev = the end of that window.

// second is what a rejected concurrency request is told to wait: a slot
// frees when another request ends, which no clock predicts.
const second int64 = 1_000_000

// MinLease is the shortest concurrency lease: a lease is renewed every
// third of it, and a renewal must have time to reach the store.
const MinLease = time.Second

// NewConcurrency returns a limit of slots requests in flight per key, held
// in a shared store as leases of lease each.
func NewConcurrency(slots int64, lease time.Duration) (Limit, error) {
	if slots <= 0 {
		return Limit{}, fmt.Errorf("concurrency: must be greater than 0, got %d", slots)
	}
	if slots > MaxEvents {
		return Limit{}, fmt.Errorf("concurrency: must be at most %d, got %d", MaxEvents, slots)
	}
	if lease < MinLease {
		return Limit{}, fmt.Errorf("concurrency_lease: must be at least %s, got %s", MinLease, lease)
	}
	if lease.Microseconds() > MaxSpan {
		return Limit{}, fmt.Errorf("concurrency_lease: must be at most %s, got %s", time.Duration(MaxSpan)*time.Microsecond, lease)
	}
	return Limit{Kind: Concurrency, Events: slots, Burst: slots, Window: lease.Microseconds(), Scale: 1, Unit: 1}, nil
}

// NewBan returns a limit that bans a key for hold once it has been
// rejected after times within window.
func NewBan(after int64, window, hold time.Duration) (Limit, error) {
	if hold <= 0 {
		return Limit{}, fmt.Errorf("ban: must be greater than 0, got %s", hold)
	}
	if hold.Microseconds() > MaxSpan {
		return Limit{}, fmt.Errorf("ban: must be at most %s, got %s", time.Duration(MaxSpan)*time.Microsecond, hold)
	}
	if after <= 0 {
		return Limit{}, fmt.Errorf("ban_after: must be greater than 0, got %d", after)
	}
	if after > MaxEvents {
		return Limit{}, fmt.Errorf("ban_after: must be at most %d, got %d", MaxEvents, after)
	}
	w := window.Microseconds()
	if w <= 0 || w > MaxSpan {
		return Limit{}, fmt.Errorf("window: a ban counts rejections within the zone's window, which must be in [1µs, %s], got %s", time.Duration(MaxSpan)*time.Microsecond, window)
	}
	return Limit{Kind: Ban, Events: after, Burst: after, Window: w, Hold: hold.Microseconds(), Scale: 1, Unit: 1}, nil
}

// slots decides a concurrency request: admitted while a slot is free.
// Remaining is the slots free after the decision; Reset is 0 when none is
// taken, else one second (when a slot frees is not known).
func (l *Limit) slots(s *State, now int64, commit bool) Decision {
	if s.Level >= l.Events {
		return Decision{Reset: second, Wait: second, At: now}
	}
	level := s.Level + 1
	if commit {
		s.Level = level
	}
	return Decision{Allowed: true, Remaining: l.Events - level, Reset: second, At: now}
}

// banned reports whether a ban holds the key at now: then the request is
// refused until its end, with Wait (and Reset) the time left. Otherwise
// it is admitted, Remaining being the rejections the key may still have
// in this strike window before a ban, and Reset the time until its
// strikes are forgotten.
func (l *Limit) banned(s *State, now int64) Decision {
	if now < s.At {
		return Decision{Reset: s.At - now, Wait: s.At - now, At: now}
	}
	if s.Level == 0 || now >= s.Prev {
		return Decision{Allowed: true, Remaining: l.Events, At: now}
	}
	return Decision{Allowed: true, Remaining: l.Events - s.Level, Reset: s.Prev - now, At: now}
}

// WaitAlso makes a ban's rejection d wait for o too: the decision its
// zone's rate would make on the request at the same time, nothing charged.
// A banned client told to come back when the ban ends, while the rate
// would still refuse it then, would come back to a rejection, and its
// strike. d.Wait becomes the time until both admit (Never if o never
// does), and d.Reset stays the ban's end. An admission d, or o, leaves d
// as it is.
func (d *Decision) WaitAlso(o Decision) {
	switch {
	case d.Allowed || o.Allowed:
	case o.Wait == Never || d.Wait == Never:
		d.Wait = Never
	default:
		d.Wait = max(d.Wait, o.Wait)
	}
}

// Strike records one rejection of the key at now and returns the ban
// decision after it: once Events rejections fall within one strike window
// (which starts at the first of them), the key is banned for Hold and its
// strikes start again from none. A key already banned is left as it is.
// Strike is only for a Ban limit.
func (l *Limit) Strike(s *State, now int64) Decision {
	if now < s.At {
		return l.banned(s, now)
	}
	if s.Level == 0 || now >= s.Prev {
		s.Level, s.Prev = 0, now+l.Window
	}
	s.Level++
	if s.Level >= l.Events {
		s.At, s.Level, s.Prev = now+l.Hold, 0, 0
	}
	return l.banned(s, now)
}
