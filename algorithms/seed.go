package algorithms

import "math/bits"

// Seed sets s to a copy of the state that made d: a decision another store
// (Redis) made on its own state of the key, for a request of cost that it
// charged there if charged. It is what a local fallback keeps, so that a
// decision the other store cannot make in time goes on from where the
// shared state stood, not from a fresh key. Times are the deciding store's:
// s is read from d.At on, by that store's clock.
//
// A Decision tells a state only to a whole event and a whole µs, so Seed
// keeps the least restrictive state that d allows: read at any time from
// d.At on, with nothing charged meanwhile, s never rejects a request the
// state that made d would admit (a sliding_window to a thousandth of an
// event, see seedSliding). At d.At it decides requests of whole events as
// that state does, but for a sliding_log, which keeps only what it knows
// of the log (see seedLog). A concurrency limit is not seeded: its slots
// are leases that no decision times.
func (l *Limit) Seed(s *State, d Decision, cost int64, charged bool) {
	switch l.Kind {
	case TokenBucket, LeakyBucket:
		s.At, s.Level = d.At, l.seedDebt(d)
	case GCRA:
		l.setTAT(s, d.At, l.seedDebt(d))
	case FixedWindow:
		s.At, s.Level, s.Prev, s.Head = d.At-d.At%l.Window, 0, 0, 0
		if l.Calendar.Unit != NoUnit {
			p := l.Calendar.Period(d.At)
			s.At, s.Prev = p.Start, p.End
		}
		if d.Reset > 0 {
			// The most room Remaining allows; beyond the limit, a grant.
			room, limit := (d.Remaining+1)*Milli-1, l.Events*Milli
			s.Level, s.Head = max(0, limit-room), max(0, room-limit)
		}
	case SlidingWindow:
		l.seedSliding(s, d, cost, charged)
	case SlidingLog:
		l.seedLog(s, d, cost, charged)
	case Ban:
		if !d.Allowed {
			// Banned until then: Reset, since a ban's Wait also covers
			// its zone's rate (Decision.WaitAlso).
			s.At, s.Level, s.Prev = d.At+d.Reset, 0, 0
			return
		}
		s.At, s.Level, s.Prev = 0, max(0, l.Events-d.Remaining), d.At+d.Reset
		if s.Level == 0 || d.Reset <= 0 {
			s.Level, s.Prev = 0, 0
		}
	}
}

// seedDebt is the least debt, in ticks, that a bucket's Reset allows:
// Reset is the debt in µs rounded up.
func (l *Limit) seedDebt(d Decision) int64 {
	if d.Reset <= 0 {
		return 0
	}
	return (d.Reset-1)*l.scale() + 1
}

// seedUsed is the least count, in milli-units, that a window decision's
// Remaining (whole events of room) allows.
func (l *Limit) seedUsed(d Decision) int64 {
	return max(0, l.Events*Milli-(d.Remaining+1)*Milli+1)
}

// seedSliding seeds a sliding_window. The window is known (d.At), and so
// is the weighted count to a thousandth of an event (Remaining), but not
// how it splits between this window and the previous one, except that
// Reset tells whether this window counts anything. This window's count
// weighs until the next window ends, the previous one's only until this
// one ends, and less every µs. So this window keeps what this copy saw
// charged in it (its own count and the request's charge), and the rest
// is kept as the previous window's count: what this copy saw charged
// there (known only when it saw the window roll), or the largest count whose weight ceil(p*toNext/W) is not above
// the rest, if that is more. Both weigh no more than the real counts at
// every later time, but for the rounding up of the weight, by at most a
// thousandth of an event. Neither may make the whole pass Remaining's
// room, which only counts this copy admitted on its own can do.
func (l *Limit) seedSliding(s *State, d Decision, cost int64, charged bool) {
	limit := l.Events * Milli
	start := d.At - d.At%l.Window
	// What this copy saw charged in this window, and in the previous one
	// when it saw the window roll. Within a window, its previous count is
	// a bound from an earlier decision, not charges, and is not carried:
	// a reply that comes late would add its charge to it twice.
	var cur, prev int64
	switch s.At {
	case start:
		cur = s.Level
	case start - l.Window:
		prev = s.Level
	}
	if s.At != start {
		s.Head = 0 // a grant ends with its window
	}
	s.At, s.Level, s.Prev = start, 0, 0
	if d.Reset <= 0 {
		return // both windows empty
	}
	used := l.seedUsed(d)
	toNext := l.Window - (d.At - start)
	if d.Reset > toNext { // Reset passes this window: it counts something
		if charged {
			cur += max(cost, 0)
		}
		s.Level = min(cur, max(0, limit-d.Remaining*Milli))
	}
	lo := l.prevFor(used-s.Level, toNext)
	hi := l.prevFor(limit-d.Remaining*Milli-s.Level, toNext)
	s.Prev = max(lo, min(prev, hi))
}

// prevFor is the largest previous-window count, at most the limit, whose
// weight toNext µs before the window ends, ceil(p*toNext/W), is at most
// left.
func (l *Limit) prevFor(left, toNext int64) int64 {
	limit := l.Events * Milli
	if left <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(left), uint64(l.Window))
	if hi >= uint64(toNext) {
		return limit // the quotient passes 2^64
	}
	q, _ := bits.Div64(hi, lo, uint64(toNext))
	return int64(min(q, uint64(limit)))
}

// seedLog seeds a sliding_log. A decision tells how many entries the log
// holds (Remaining) and when the newest expires (Reset), not when the
// others do, and any of them may expire the next µs. So the log keeps what
// it already holds that is still in the window (the entries this copy saw
// charged), no more entries than the real log holds, and the request's own
// entries if it was charged. One instance's copy then holds every entry
// it charged; the entries other instances charged are not known to it.
// Entries it admitted itself while the store could not answer stay until
// they expire, though the store never saw them.
func (l *Limit) seedLog(s *State, d Decision, cost int64, charged bool) {
	n := l.Events
	for s.Level > 0 && s.Log[s.Head] <= d.At-l.Window {
		s.Head = (s.Head + 1) % int64(len(s.Log))
		s.Level--
	}
	held := max(0, min(n-d.Remaining, n)) // the real log's entries
	k := int64(0)
	if charged {
		k = min(ceilDiv(max(cost, 0), Milli), held)
		if s.Level > 0 && s.entry(s.Level-1) > d.At {
			k = 0 // a later decision was seeded first: keep the order
		}
	}
	for s.Level > held-k { // the oldest go first: they expire first
		s.Head = (s.Head + 1) % int64(len(s.Log))
		s.Level--
	}
	s.resize(s.Level+k, n)
	for i := int64(0); i < k; i++ {
		s.Log[(s.Head+s.Level)%int64(len(s.Log))] = d.At
		s.Level++
	}
}
