package algorithms

// Quota leases. A store shared by several instances may let one of them
// decide a hot key in memory from a lease: whole events of the key's quota
// debited from the shared state, in the same atomic step as a request's
// own decision, before the instance spends them. What the shared state
// holds plus what every instance holds in leases never passes the limit,
// whoever spends what: the lease is charged as if it were spent at once.
//
// A window algorithm (fixed_window, with or without a calendar, and
// sliding_window) charges a lease to the window it is taken in, and the
// lease ends with that window: spent inside it, it is counted where it was
// spent. What is left of it is given back to that window, wherever it
// still counts (a sliding_window's previous window), or to nothing. A
// sliding_window admits a request while the previous window's weighted
// count plus this window's is within the limit; the weight only falls
// within a window, so a lease that passed that check when it was taken
// passes it whenever it is spent in the same window.
//
// A bucket (token_bucket, gcra, a policing leaky_bucket) must also hold
// its promise of at most burst + rate x t in ANY span t, not only from the
// first request: a lease spent late must not add to what the bucket
// refilled meanwhile. So a lease of n events that lives life µs charges
// n events plus life's worth of refill: the debt it adds drains only once
// the lease is over, as if every event of it were spent at the lease's
// last instant. When the lease ends at elapsed µs (on the shared state's
// clock) with unspent events, it gives back the unspent events and the
// refill it did not live, unspent + (life - elapsed) of refill, which is
// exactly the charge of a lease of the events spent that lived elapsed:
// never more than the charge still holds, since nothing charged after the
// lease can have drained before it (see LeaseEnd).
//
// A lease's size is chosen by the caller from the key's demand on its
// instance, and bounded here by a share of what the key has left: near
// the limit a lease shrinks below MinQuotaLease and the key goes back to one
// decision a round trip, exact at the edge.

// QuotaLeaseShare bounds a lease to 1/QuotaLeaseShare of the events a key has left
// after the request that takes it: several instances leasing at once
// leave most of the quota to the others, and a key near its limit leases
// nothing.
const QuotaLeaseShare = 8

// MinQuotaLease is the fewest events leased: a lease of one event saves no
// round trip.
const MinQuotaLease = 2

// Leasable reports whether l's keys may be decided from leases: the
// bucket family while it polices (a shaping leaky_bucket orders requests
// by their place in one queue, which only the shared state knows) and
// the window algorithms of a count, fixed_window and sliding_window.
// sliding_log, concurrency and ban do not lease.
func (l *Limit) Leasable() bool {
	switch l.Kind {
	case TokenBucket, GCRA, FixedWindow, SlidingWindow:
		return true
	case LeakyBucket:
		return l.MaxDelay == 0
	}
	return false
}

// LeaseSize is the events a lease takes when want are wanted and room are
// left for it: at most room/QuotaLeaseShare, and none below MinQuotaLease.
func LeaseSize(want, room int64) int64 {
	n := min(want, room/QuotaLeaseShare)
	if n < MinQuotaLease {
		return 0
	}
	return n
}

// leaseLife is how long a lease asked to live life µs lives after an
// admitted request's decision d: life, or, for a bucket, no longer than
// the bucket takes to refill half of what d leaves (rounded down to a µs),
// so that the refill a lease is charged (see LeaseDebit) is at most half
// of it and the lease's share is taken from the rest. A bucket whose
// burst is a second of its rate leases for half a second; one with less
// room, for less.
func (l *Limit) leaseLife(d *Decision, life int64) int64 {
	if l.window() {
		return life
	}
	return min(life, max(d.Remaining, 0)*l.Unit/(2*l.scale()))
}

// leaseRoom is the events a lease living life µs may take after an
// admitted request's decision d: what d leaves, less, for a bucket, the
// refill of life (rounded up to whole events), which the lease is also
// charged.
func (l *Limit) leaseRoom(d *Decision, life int64) int64 {
	if l.window() {
		return d.Remaining
	}
	return d.Remaining - ceilDiv(l.ticks(life), l.Unit)
}

// LeaseDebit is what a lease of n events living life µs charges, as the
// algorithm counts cost (a Lua twin's x): ticks for the bucket family (n
// events and life's refill), milli-units for a window.
func (l *Limit) LeaseDebit(n, life int64) int64 {
	if l.window() {
		return n * Milli
	}
	return n*l.Unit + l.ticks(life)
}

// LeaseCredit is what a lease that lived life µs gives back when it ends
// elapsed µs after it was taken with unspent events: for a window, the
// unspent events (in milli-units); for a bucket, the unspent events and
// the refill it did not live, in ticks, never below 0.
func (l *Limit) LeaseCredit(unspent, life, elapsed int64) int64 {
	unspent = max(unspent, 0)
	if l.window() {
		return unspent * Milli
	}
	return max(0, unspent*l.Unit+l.ticks(life-max(elapsed, 0)))
}

// LeaseTake decides a request of cost milli-units at now as Take does
// and, if it is admitted, leases LeaseSize(want, room) events of what is
// left for up to life µs. It returns the request's decision, the events
// leased (0: none) and the lease's life: life, or for a window the time
// to the window's end if sooner, or for a bucket less when it has little
// room (see leaseLife). The decision tells what is left after
// the lease, plus the lease (the events the caller then holds). A
// calendar window's span is sp (nil: the span of now, as Take).
func (l *Limit) LeaseTake(s *State, sp *Span, now, cost, want, life int64) (d Decision, n, lived int64) {
	l.decide(s, now, cost, true, sp, &d)
	if !d.Allowed || want <= 0 || life <= 0 || !l.Leasable() {
		return d, 0, 0
	}
	life = l.leaseLife(&d, life)
	n = LeaseSize(want, l.leaseRoom(&d, life))
	if n == 0 || life <= 0 {
		return d, 0, 0
	}
	var after Decision
	l.debit(s, sp, d.At, l.LeaseDebit(n, life), &after)
	if !after.Allowed {
		return d, 0, 0 // cannot happen: the room was checked
	}
	lived = life
	switch l.Kind {
	case FixedWindow:
		lived = min(life, after.Reset)
	case SlidingWindow:
		lived = min(life, l.Window-after.At%l.Window)
	}
	d.Remaining, d.Reset = after.Remaining+n, after.Reset
	return d, n, lived
}

// debit charges x as the algorithm counts cost (see LeaseDebit) at now,
// deciding into *d as a take of that amount would, with no capacity check:
// the caller has checked the room.
func (l *Limit) debit(s *State, sp *Span, now, x int64, d *Decision) {
	switch l.Kind {
	case TokenBucket, LeakyBucket:
		l.bucket(s, now, 0, false, d)
		l.meterInc(&s.Level, now, x, true, d)
	case GCRA:
		debt := l.gcraDebt(s, now)
		l.meterInc(&debt, now, x, true, d)
		if d.Allowed {
			l.setTAT(s, now, debt)
		}
	case FixedWindow:
		if l.Calendar.Unit != NoUnit {
			if sp == nil {
				held := l.Calendar.Span(now)
				sp = &held
			}
			now = l.rollPeriod(s, now, sp)
			l.fixed(s, now, x, true, s.Prev-now, d)
			return
		}
		now, e := l.roll(s, now)
		l.fixed(s, now, x, true, l.Window-e, d)
	case SlidingWindow:
		l.slidingWindow(s, now, x, true, d)
	}
}

// window reports whether l counts cost in windows (a lease's debit and
// credit are milli-units).
func (l *Limit) window() bool {
	return l.Kind == FixedWindow || l.Kind == SlidingWindow
}

// LeaseEnd gives back, at now, what is left of a lease taken at taken
// (its decision's At) that lived life µs: unspent events (see
// LeaseCredit). A window gets them back only while the lease's window
// lasts; a bucket never gets back more debt than it holds.
//
// Why a bucket's credit never mints: write the debt at now as the most,
// over every start s, of what was charged since s less the refill since
// s. Over starts up to the lease's time ta the lease's charge, n events
// plus life's refill, counts whole; over later starts it does not count,
// and those sums are at most what was charged after ta, so at least
// charge - (now - ta) of refill below the former. The credit is at most
// that much (unspent <= n), and it takes the debt exactly to what a lease
// of the events spent, living now - ta, would have left.
func (l *Limit) LeaseEnd(s *State, now, unspent, life int64, taken int64) {
	switch l.Kind {
	case TokenBucket, LeakyBucket:
		var d Decision
		l.bucket(s, now, 0, false, &d)
		s.Level -= min(l.LeaseCredit(unspent, life, s.At-taken), s.Level)
	case GCRA:
		debt := l.gcraDebt(s, now)
		if debt == 0 {
			return
		}
		l.setTAT(s, now, debt-min(l.LeaseCredit(unspent, life, now-taken), debt))
	case FixedWindow, SlidingWindow:
		l.windowUndo(s, now, l.LeaseCredit(unspent, life, 0), Decision{At: taken})
	}
}

// LeaseBack is when a lease that LeaseTake took, deciding d, for lived µs
// is back at the latest, on the store's clock: at its end plus delay µs,
// the time its holder takes to give back what is left of it, and for a
// window no later than the window's end (the lease's end, if it ends
// with the window: what is left of it then counts for nothing more).
func (l *Limit) LeaseBack(d *Decision, lived, delay int64) int64 {
	back := d.At + lived + delay
	switch l.Kind {
	case FixedWindow:
		back = min(back, d.At+d.Reset) // a charged window is fresh at its end
	case SlidingWindow:
		back = min(back, d.At+l.Window-d.At%l.Window)
	}
	return back
}

// LeaseNeed is the whole events a request of cost milli-units needs, as
// LeaseMark.Wait compares them with what is left and leased: a bucket's
// cost rounded up to ticks, then to events.
func (l *Limit) LeaseNeed(cost int64) int64 {
	if l.window() {
		return ceilDiv(cost, Milli)
	}
	return ceilDiv(l.inc(cost), l.Unit)
}

// LeaseMark is what a store shared by instances keeps on a key of the
// leases out on it, beside the key's State (not in it: a store that does
// not lease keeps nothing): Back, when the latest lease taken is back at
// the latest (LeaseBack), and Leased, the events of the leases taken
// since the one before was back, less those returned, at most what the
// leases out hold. The zero LeaseMark is a key without leases.
type LeaseMark struct {
	Back, Leased int64
}

// Take records a lease of n events taken at at, back at back.
func (m *LeaseMark) Take(at, n, back int64) {
	if m.Back <= at {
		m.Leased = 0 // every lease taken before is back
	}
	m.Back, m.Leased = max(m.Back, back), m.Leased+n
}

// Return records the return (or the end, with nothing left to return) of
// a lease of n events.
func (m *LeaseMark) Return(n int64) {
	if n > 0 && m.Back > 0 {
		m.Leased = max(0, m.Leased-n)
	}
}

// Wait caps the Wait of d, the rejection of a request of need whole
// events (LeaseNeed), at m.Back when what is left with what the leases
// hold could admit it: the quota the leases hold may be back that soon.
// It is a hint: the leases may be spent meanwhile, or what comes back
// taken first by another request. A rejection that can never be admitted
// (Wait Never) keeps its Wait.
func (m LeaseMark) Wait(d *Decision, need int64) {
	if !d.Allowed && d.Wait > 0 && d.Wait != Never && m.Back > d.At && need <= d.Remaining+m.Leased {
		d.Wait = min(d.Wait, m.Back-d.At)
	}
}
