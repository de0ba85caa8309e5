package algorithms

import "math/bits"

// Seed merges into s what d tells of the state that made it: a decision
// another store (Redis) made on its own state of the key, for a request
// of cost that it charged there if charged. s is the local copy that a store
// keeps, so that a decision the other store cannot make in time goes on
// from where the shared state stood, not from a fresh key. Times are the
// deciding store's: s is read from d.At on, by that store's clock.
//
// A local copy never moves backwards. Replies to concurrent requests arrive in
// any order, so d may be older than what s already holds: s keeps, for
// every later time, the more restrictive of what it held and what d
// tells (the later TAT, the larger debt, the later window, the larger
// count in the same window, the later ban). What the local copy charged on its
// own while the other store could not answer stays too, until it ages
// out: those requests were admitted. Only Reseed, which follows a reset,
// moves a local copy back.
//
// A Decision tells a state only to a whole event and a whole µs, so what
// d adds is the least restrictive state d allows: seeded alone, read at
// any time from d.At on with nothing charged meanwhile, s never rejects a
// request the state that made d would admit. A local copy seeded from every
// decision made on the state, in any order, some twice, admits no
// request of whole events that the state after the last one would reject
// (the bucket family to a tick, so to a µs where a tick is finer). A
// concurrency limit is not seeded: its slots are leases that no decision
// times.
func (l *Limit) Seed(s *State, d Decision, cost int64, charged bool) {
	if !charged {
		cost = 0
	}
	cost = max(cost, 0)
	switch l.Kind {
	case TokenBucket, LeakyBucket:
		// Both debts drain one tick per tick: the larger one at the
		// later time is the larger one ever after.
		at := max(s.At, d.At)
		s.Level = max(l.drain(s.Level, at-s.At), l.drain(l.seedDebt(d), at-d.At))
		s.At = at
	case GCRA:
		var n State
		l.setTAT(&n, d.At, l.seedDebt(d))
		if n.At > s.At || n.At == s.At && n.Level > s.Level {
			s.At, s.Level = n.At, n.Level // the later TAT
		}
	case FixedWindow:
		// s's window starts at At for a calendar window, and holds At
		// for an epoch window (see roll).
		start, end, own := d.At-d.At%l.Window, int64(0), l.windowStart(s.At)
		if l.Calendar.Unit != NoUnit {
			p := l.Calendar.Period(d.At)
			start, end, own = p.Start, p.End, s.At
		}
		switch {
		case start < own:
			return // d's window no longer counts
		case start > own:
			s.At, s.Level, s.Prev, s.Head = start, 0, end, 0 // s's no longer does
		}
		if d.Reset > 0 {
			// The most room Remaining allows: the limit and the grant,
			// less the count. Within a window both the count and the
			// grant only grow. A grant the local copy was told of (see
			// Store.Grant) is known exactly, and the count is the least
			// that leaves that room; room beyond the limit and the grant
			// known is a grant the local copy was not told of.
			room, limit := (d.Remaining+1)*Milli-1, l.Events*Milli
			s.Head = max(s.Head, room-limit)
			s.Level = max(s.Level, limit+s.Head-room)
		}
	case SlidingWindow:
		l.seedSliding(s, d, cost)
	case SlidingLog:
		if charged {
			l.seedLog(s, d, cost)
		}
	case Ban:
		l.seedBan(s, d)
	}
}

// Reseed sets s to a copy of the state that made d, whatever s held: what
// a local copy follows once the key was reset on the other store, and d read
// its state since. Unlike Seed it may move s backwards. A sliding_log
// keeps, of the entries it holds, no more than the state that made d
// holds (the newest: entries since the reset are newer than any before
// it), since d does not tell their times.
func (l *Limit) Reseed(s *State, d Decision) {
	if l.Kind == Concurrency {
		return
	}
	if l.Kind == SlidingLog {
		l.expire(s, d.At)
		held := max(0, min(l.Events-d.Remaining, l.Events))
		l.dropOldest(s, s.Level-held)
		return
	}
	*s = State{}
	l.Seed(s, d, 0, false)
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

// seedSliding merges d into a sliding_window local copy. The window is known
// (d.At), and so is the weighted count to a thousandth of an event
// (Remaining), but not how it splits between this window and the
// previous one. So the local copy counts, in each window, what it saw charged
// there (Level, and Head for the previous window, see State), and keeps
// as the previous window's count (Prev) at least that, and at least the
// largest count whose weight ceil(p*toNext/W) is not above the rest of
// d's count. The rest weighs no more than the real counts at every later
// time (this window's count weighs until the next window ends, the
// previous one's less every µs until this one ends), but for the
// rounding up of the weight, by at most a thousandth of an event. A
// reply from the window before the local copy's adds its charge to that
// window's count; one from an earlier window counts no more.
func (l *Limit) seedSliding(s *State, d Decision, cost int64) {
	l.roll(s, d.At) // to d's window, if s is in an earlier one
	start := d.At - d.At%l.Window
	switch l.windowStart(s.At) {
	case start:
	case start + l.Window: // a late reply: its window is the previous one
		if s.Head < 0 {
			// Head is this window's grant (see State): the previous
			// window's count is in Prev alone, which may count the
			// charge twice (erring towards refusing).
			s.Prev += cost
			return
		}
		s.Head += cost
		s.Prev = max(s.Prev, s.Head)
		return
	default:
		return
	}
	if d.Reset <= 0 {
		return // both windows were empty
	}
	toNext := l.Window - (d.At - start)
	if cost > 0 && s.Prev > s.Head {
		// Prev may be a bound from a later decision, which counted this
		// charge in its rest: it weighs cost less at d.At.
		s.Prev = max(s.Head, l.prevFor(l.weight(s.Prev, toNext)-cost, toNext))
	}
	s.Level += cost
	s.Prev = max(s.Prev, s.Head, l.prevFor(l.seedUsed(d)-s.Level, toNext))
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

// seedLog merges a charged decision into a sliding_log local copy. A decision
// tells how many entries the log holds (Remaining) and when the newest
// expires (Reset), not when the others do, and any of them may expire the
// next µs. So the local copy keeps the entries it saw charged: the request's
// own, at d.At, go in among them in time order (a reply may come after a
// later one's), and the log keeps at most its events' worth, the newest.
// One instance's local copy then holds every entry it charged; the entries
// other instances charged are not known to it. While a grant the local copy was
// told of lasts, the log keeps that many whole events more.
func (l *Limit) seedLog(s *State, d Decision, cost int64) {
	n := l.Events
	if s.Prev > 0 && d.At < s.At {
		n += s.Prev / Milli // a grant the local copy was told of, while it lasts
	}
	k := min(ceilDiv(cost, Milli), n)
	if k == 0 {
		return
	}
	l.expire(s, d.At)
	// pos: how many entries are not after d.At. Replies mostly come in
	// order: look from the newest.
	pos := s.Level
	for pos > 0 && s.entry(pos-1) > d.At {
		pos--
	}
	if over := s.Level + k - n; over > 0 { // the oldest go: they expire first
		drop := min(over, pos)
		l.dropOldest(s, drop)
		pos -= drop
		k -= over - drop
	}
	s.resize(s.Level+k, n)
	c := int64(len(s.Log))
	for i := s.Level - 1; i >= pos; i-- {
		s.Log[(s.Head+i+k)%c] = s.entry(i)
	}
	for i := pos; i < pos+k; i++ {
		s.Log[(s.Head+i)%c] = d.At
	}
	s.Level += k
}

// expire drops a sliding_log's entries that have left the window at now.
func (l *Limit) expire(s *State, now int64) {
	for s.Level > 0 && s.Log[s.Head] <= now-l.Window {
		l.dropOldest(s, 1)
	}
}

// dropOldest drops a sliding_log's k oldest entries, if k > 0.
func (l *Limit) dropOldest(s *State, k int64) {
	for ; k > 0 && s.Level > 0; k-- {
		s.Head = (s.Head + 1) % int64(len(s.Log))
		s.Level--
	}
}

// seedBan merges a ban's decision: a rejection tells when the ban ends
// (Reset: a ban's Wait may also cover its zone's rate, see
// Decision.WaitAlso), an admission the strikes in the current strike
// window and when it ends. The later ban end wins, and the later strike
// window (windows do not overlap, and the same window ends at the same
// µs), or the most strikes in the same one. Strikes in a window that
// began before the ban ended were made before the ban began (a banned key
// gets no strikes), which cleared them.
func (l *Limit) seedBan(s *State, d Decision) {
	if !d.Allowed {
		s.At = max(s.At, d.At+d.Reset)
	} else if strikes := min(l.Events-d.Remaining, l.Events); strikes > 0 && d.Reset > 0 {
		switch end := d.At + d.Reset; {
		case end > s.Prev:
			s.Level, s.Prev = strikes, end
		case end == s.Prev:
			s.Level = max(s.Level, strikes)
		}
	}
	if s.Level > 0 && s.Prev-l.Window < s.At {
		s.Level, s.Prev = 0, 0
	}
}
