// Package algorithms holds Tollgate's rate-limiting algorithms as pure
// functions: a decision is a function of (limit, state, now, cost) that
// returns a new state and a Decision. Nothing here reads a clock, does I/O,
// takes a lock or allocates; the stores in package storage run decisions
// atomically, and each Redis Lua script is a twin of the Go code here.
//
// Units. Time is an int64 count of microseconds since the Unix epoch (the
// resolution of Redis TIME, and small enough that Lua's doubles hold it
// exactly). Cost is an int64 count of thousandths of an event ("milli"), so
// fractional costs such as 0.5 are exact.
//
// The bucket family (token bucket, GCRA, leaky bucket) keeps its state as
// time: a full bucket is zero "debt", each request adds the time it takes the
// bucket to refill its cost, and debt drains at one tick per tick, a tick
// being 1/Scale µs (Scale is 1 for all but fast rates, see Limit). Integer
// time is exact and needs no division at decision time, so a Lua twin that
// adds and compares integers reproduces it bit for bit.
//
// Nothing here allocates but a sliding_log's log, which grows with its
// entries (doubling, up to events) and shrinks when it is mostly empty, so
// that a key costs memory in proportion to what it holds.
package algorithms

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Kind names an algorithm.
type Kind uint8

// The algorithms of the contract. TokenBucket is the zero value and default.
const (
	TokenBucket Kind = iota
	GCRA
	SlidingWindow
	SlidingLog
	FixedWindow
	LeakyBucket
	// Concurrency and Ban are not rate algorithms but the other limits a
	// zone can hold (see guard.go); ParseKind does not accept them.
	Concurrency
	Ban
)

var kindNames = [...]string{
	TokenBucket:   "token_bucket",
	GCRA:          "gcra",
	SlidingWindow: "sliding_window",
	SlidingLog:    "sliding_log",
	FixedWindow:   "fixed_window",
	LeakyBucket:   "leaky_bucket",
	Concurrency:   "concurrency",
	Ban:           "ban",
}

// String returns the configuration name of k, such as "token_bucket".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// ParseKind returns the Kind for a configuration name. The empty string is
// the default, TokenBucket.
func ParseKind(name string) (Kind, error) {
	if name == "" {
		return TokenBucket, nil
	}
	for k, n := range kindNames[:LeakyBucket+1] {
		if n == name {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of token_bucket, gcra, sliding_window, sliding_log, fixed_window, leaky_bucket)", name)
}

// Milli is the number of cost units in one event.
const Milli = 1000

// Never is the Decision.Wait of a request that can never be admitted: its
// cost is above the limit's capacity.
const Never int64 = -1

// Limits on configuration, chosen so that every intermediate value stays
// below 2^53 (exact in Lua's doubles) and no int64 product overflows.
const (
	// MaxSpan is the longest window or bucket refill time: 2^50 µs, about
	// 35 years.
	MaxSpan int64 = 1 << 50
	// MaxEvents bounds events and burst.
	MaxEvents int64 = 1 << 40
	// MaxLogEvents bounds events for sliding_log, which stores one
	// timestamp per event.
	MaxLogEvents int64 = 100_000
	// MaxScale is the finest tick of the bucket family: 1/1024 µs.
	MaxScale int64 = 1024
	// maxExact bounds every value a Lua twin handles: 2^53.
	maxExact int64 = 1 << 53
)

// precision is the least refill time of one event in ticks: rounding it up
// to a whole tick then costs at most 1/precision (0.1%) of the rate.
const precision = 1000

// Limit is one zone's limit: Events per Window, with a bucket capacity of
// Burst. Build it with NewLimit, which validates it and derives the
// constants a decision needs; the zero Limit admits nothing.
type Limit struct {
	Kind     Kind
	Events   int64 // N, > 0
	Window   int64 // W in µs, > 0
	Burst    int64 // B, the bucket capacity in events; Events for the window algorithms
	MaxDelay int64 // µs a leaky_bucket shaper may delay a request; 0 polices

	// Scale is the bucket family's ticks per µs: 1, or for a rate so fast
	// that an event refills in under 1000 µs, the least power of two
	// (at most MaxScale) that makes it at least 1000 ticks, so that
	// rounding Unit up costs at most 0.1% of the rate.
	Scale int64
	// Unit is the refill time of one event in ticks: ceil(W * Scale / N).
	// Rounding up means the bucket family never admits more than N per W.
	Unit int64
	// Tau is the bucket capacity as time, in ticks: Burst * Unit.
	Tau int64
	// Hold is how long a Ban lasts, in µs; 0 for every other kind.
	Hold int64
	// Calendar, for a fixed_window made by NewCalendarLimit, aligns its
	// windows to the calendar; Window is then the nominal length (see
	// Calendar.Nominal). The zero Calendar aligns windows to the epoch.
	Calendar Calendar
}

// NewLimit validates a limit and derives its constants. burst 0 means
// events. maxDelay applies only to LeakyBucket.
func NewLimit(kind Kind, events int64, window time.Duration, burst int64, maxDelay time.Duration) (Limit, error) {
	if kind > LeakyBucket {
		return Limit{}, fmt.Errorf("algorithm: unknown kind %d", kind)
	}
	if events <= 0 {
		return Limit{}, fmt.Errorf("events: must be greater than 0, got %d", events)
	}
	if events > MaxEvents {
		return Limit{}, fmt.Errorf("events: must be at most %d, got %d", MaxEvents, events)
	}
	if kind == SlidingLog && events > MaxLogEvents {
		return Limit{}, fmt.Errorf("events: sliding_log keeps one timestamp per event and allows at most %d, got %d", MaxLogEvents, events)
	}
	w := window.Microseconds()
	if window <= 0 {
		return Limit{}, fmt.Errorf("window: must be greater than 0, got %s", window)
	}
	if w <= 0 {
		return Limit{}, fmt.Errorf("window: must be at least 1µs, got %s", window)
	}
	if w > MaxSpan {
		return Limit{}, fmt.Errorf("window: must be at most %s, got %s", time.Duration(MaxSpan)*time.Microsecond, window)
	}
	if burst < 0 {
		return Limit{}, fmt.Errorf("burst: must not be negative, got %d", burst)
	}
	if burst > MaxEvents {
		return Limit{}, fmt.Errorf("burst: must be at most %d, got %d", MaxEvents, burst)
	}
	if burst == 0 {
		burst = events
	}
	if maxDelay < 0 {
		return Limit{}, fmt.Errorf("max_delay: must not be negative, got %s", maxDelay)
	}
	if maxDelay > 0 && kind != LeakyBucket {
		return Limit{}, fmt.Errorf("max_delay: only leaky_bucket can delay requests, not %s; got %s", kind, maxDelay)
	}
	md := maxDelay.Microseconds()
	if md > MaxSpan {
		return Limit{}, fmt.Errorf("max_delay: must be at most %s, got %s", time.Duration(MaxSpan)*time.Microsecond, maxDelay)
	}
	if w/events == 0 {
		return Limit{}, fmt.Errorf("events: %d per %s is more than one per microsecond, the finest rate Tollgate keeps per key", events, window)
	}
	scale := int64(1)
	if kind == TokenBucket || kind == GCRA || kind == LeakyBucket {
		// w/events >= 1, so w*scale < 2^60 for any scale up to 1024.
		for w*scale/events < precision && w*scale%events != 0 && scale < MaxScale {
			scale *= 2
		}
	}
	unit := (w*scale + events - 1) / events
	// Unit rounds W/N up, so Tau = N * Unit may pass W, and MaxSpan, by
	// less than N µs; that is no overflow (< MaxSpan + MaxEvents). Only a
	// burst beyond events must refill within MaxSpan.
	hi, tau := bits.Mul64(uint64(burst), uint64(unit))
	if burst > events && (hi != 0 || tau > uint64(MaxSpan*scale)) {
		return Limit{}, fmt.Errorf("burst: %d events of %s each take longer than %s to refill", burst, time.Duration(unit/scale)*time.Microsecond, time.Duration(MaxSpan)*time.Microsecond)
	}
	// A shaping bucket's debt reaches Tau + MaxDelay ticks: it must stay
	// exact in a double. Only a fine tick comes near (a µs tick keeps both
	// near MaxSpan; Tau stays below 2^52 ticks, and were it above, the
	// bound would be negative and refuse every max_delay).
	if md >= (maxExact/2-int64(tau))/scale {
		return Limit{}, fmt.Errorf("burst and max_delay: %d events per %s refill in %d/%d µs each, and a burst of %d with max_delay %s is too long to keep at that precision; lower burst or max_delay",
			events, window, unit, scale, burst, maxDelay)
	}
	if kind != TokenBucket && kind != GCRA && kind != LeakyBucket && burst != events {
		return Limit{}, fmt.Errorf("burst: %s has no bucket; its capacity is events (%d), got burst %d", kind, events, burst)
	}
	return Limit{Kind: kind, Events: events, Window: w, Burst: burst, MaxDelay: md, Scale: scale, Unit: unit, Tau: int64(tau)}, nil
}

// Capacity is the most cost, in milli-units, one request can ever be
// admitted with.
func (l *Limit) Capacity() int64 {
	return l.Burst * Milli
}

// CostMilli converts a cost in events to milli-units, rounding up so that a
// cost is never under-charged. It reports false for a cost that is not a
// finite number >= 0. A cost too large to represent is clamped to a value
// above every capacity.
func CostMilli(cost float64) (int64, bool) {
	if math.IsNaN(cost) || math.IsInf(cost, 0) || cost < 0 {
		return 0, false
	}
	m := cost * Milli
	if m >= float64(math.MaxInt64/4) {
		return math.MaxInt64 / 4, true
	}
	// A decimal cost is not exact in binary, and neither is the product:
	// 2.007 * 1000 is 2007.0000000000002, which must charge 2007, not 2008.
	// A product within a few ulps of a whole number of milli-units is that
	// number; anything further above one rounds up.
	r := math.Round(m)
	if math.Abs(m-r) > r*0x1p-50 {
		r = math.Ceil(m)
	}
	return int64(r), true
}

// State is one key's limiter state. Its zero value is a fresh key: a full
// bucket or an empty window. Which fields an algorithm uses:
//
//	token_bucket, leaky_bucket: At = last refill/leak (µs), Level = debt in ticks
//	gcra:                       the theoretical arrival time: At µs + Level ticks (0 <= Level < Scale)
//	fixed_window:               At = the latest time seen (its window holds it), Level = count (milli), Head = grant (milli)
//	  with a calendar:          At = window start, Prev = window end (µs), the rest the same
//	sliding_window:             At = the latest time seen (its window holds it), Level = count, Prev = previous window's count, Head = see below (a grant when negative)
//	sliding_log:                Log = ring of admission times, Head = oldest, Level = how many, Prev = grant (milli) until At
//
// A sliding_window also keeps in Head what was charged in the previous
// window: the same as Prev, but in a local copy seeded from another
// store's decisions (see Seed), whose Prev may be a bound those decisions
// tell, more than the local copy saw charged. A fixed_window's Head is its
// grant: extra quota given to the key for its current window (see
// Limit.Grant), in milli-units, which ends with the window. A
// sliding_window keeps its grant as a negative Head: a local copy told
// of a grant (the store follows the grants of the store it copies) then
// keeps the previous window's count in Prev alone, until the window
// ends. The grant is not a field of its own so that a memory store's
// slot stays small (32 bytes for an epoch-aligned window: see
// storage/memory/table.go).
//
// A sliding_log's ring grows with its entries, from none.
type State struct {
	At    int64
	Level int64
	Prev  int64
	Head  int64
	Log   []int64
}

// NewState returns a fresh state for l. It allocates nothing: a
// sliding_log's ring grows as entries arrive.
func NewState(l *Limit) State {
	return State{}
}

// Decision is the outcome of one request against one limit.
type Decision struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Entry is set by a store whose keys' states may be replaced while a
	// request runs (the memory store: a key evicted or swept comes back
	// as a new entry): the entry that decided, so that a give-back
	// finds whether the state it would give back to is the one charged.
	// 0: not known (give back to the key's state). The algorithms leave
	// it as it is; it fills padding after Allowed.
	Entry uint32
	// Remaining is the whole events still available after this decision.
	Remaining int64
	// Reset is µs until the quota is whole again (the state is fresh).
	Reset int64
	// Wait is µs until this request could be admitted: 0 when allowed,
	// Never when its cost is above the capacity.
	Wait int64
	// Delay is µs an admitted request must wait before it proceeds
	// (leaky_bucket shaping); 0 otherwise.
	Delay int64
	// At is the time, in µs on the store's clock, the decision was made
	// at, as the algorithm held it (a clock that ran backwards reads as
	// the latest time the state had seen). Undo needs it to find the
	// window, log entries or debt a request was charged with.
	At int64
}

// Take decides one request of cost milli-units at now and, if it is
// admitted, charges it to s. A rejected request leaves s as it was, apart
// from bringing it up to date with now (expired entries dropped, windows
// rolled), which changes no decision. For a calendar window it is
// shorthand for TakeIn(s, l.Calendar.Span(now), now, cost).
func (l *Limit) Take(s *State, now, cost int64) (d Decision) {
	l.decide(s, now, cost, true, nil, &d)
	return d
}

// TakeTo is Take, writing the Decision to *d. A caller that keeps the
// Decision in memory (a store writing it where it returns it from) saves
// a copy of it: a Decision returned by value and then stored is written
// twice, and read back in wider loads than it was written with, which
// stalls the processor.
func (l *Limit) TakeTo(d *Decision, s *State, now, cost int64) {
	l.decide(s, now, cost, true, nil, d)
}

// Peek reports what Take would decide for cost at now without charging it.
// It may bring s up to date with now, as Take does.
func (l *Limit) Peek(s *State, now, cost int64) (d Decision) {
	l.decide(s, now, cost, false, nil, &d)
	return d
}

// TakeIn is Take with the calendar window's bounds given: sp, computed on
// any clock near the one now is read on (see Span). When s's window is
// over and sp holds neither its period nor now, TakeIn decides nothing and
// returns ErrOutsideSpan. A limit without a calendar ignores sp.
func (l *Limit) TakeIn(s *State, sp Span, now, cost int64) (Decision, error) {
	if !l.holds(s, sp, now) {
		return Decision{}, ErrOutsideSpan
	}
	var d Decision
	l.decide(s, now, cost, true, &sp, &d)
	return d, nil
}

// PeekIn is Peek with the calendar window's bounds given, as TakeIn.
func (l *Limit) PeekIn(s *State, sp Span, now, cost int64) (Decision, error) {
	if !l.holds(s, sp, now) {
		return Decision{}, ErrOutsideSpan
	}
	var d Decision
	l.decide(s, now, cost, false, &sp, &d)
	return d, nil
}

// decide decides at now into *d, which it sets whole; sp is a calendar
// window's span, which holds has checked, or nil: for a calendar window,
// then, the span that holds now (Take's and Peek's shorthand, kept out of
// them so that they inline). The hot deciders write the Decision's fields
// through d rather than return it, so that no layer copies it.
func (l *Limit) decide(s *State, now, cost int64, commit bool, sp *Span, d *Decision) {
	switch l.Kind {
	case Concurrency:
		*d = l.slots(s, now, commit)
		return
	case Ban:
		*d = l.banned(s, now)
		return
	}
	cost = max(cost, 0) // a negative cost would credit the key
	if cost > l.Capacity() {
		l.decide(s, now, 0, false, sp, d)
		d.Allowed, d.Wait, d.Delay = false, Never, 0
		return
	}
	switch l.Kind {
	case TokenBucket, LeakyBucket:
		l.bucket(s, now, cost, commit, d)
	case GCRA:
		l.gcra(s, now, cost, commit, d)
	case FixedWindow:
		if l.Calendar.Unit != NoUnit {
			if sp == nil {
				held := l.Calendar.Span(now)
				sp = &held
			}
			l.fixedPeriod(s, now, cost, commit, sp, d)
			return
		}
		l.fixedWindow(s, now, cost, commit, d)
	case SlidingWindow:
		l.slidingWindow(s, now, cost, commit, d)
	case SlidingLog:
		l.slidingLog(s, now, cost, commit, d)
	default:
		*d = Decision{Wait: Never}
	}
}

// Undo gives back cost milli-units that the admitted Take whose Decision
// is taken charged, at now, as when a delayed client goes away. It gives
// back to where the request was charged, or nothing: a window algorithm
// returns the cost to the window it was charged in while that window still
// counts, a sliding_log removes the request's own entries, and the bucket
// family gives back only what the charge still holds. It never gives back
// more than was taken, so no undo mints quota.
func (l *Limit) Undo(s *State, now, cost int64, taken Decision) {
	if l.Kind == Concurrency {
		s.Level = max(s.Level-1, 0)
		return
	}
	// Nothing admitted costs more than the capacity: clamping keeps
	// cost*Unit from overflowing for any argument.
	cost = min(max(cost, 0), l.Capacity())
	switch l.Kind {
	case TokenBucket, LeakyBucket:
		l.bucketUndo(s, now, cost, taken)
	case GCRA:
		l.gcraUndo(s, now, cost, taken)
	case FixedWindow, SlidingWindow:
		l.windowUndo(s, now, cost, taken)
	case SlidingLog:
		l.slidingLogUndo(s, now, cost, taken)
	}
}

// Fresh reports whether s is, at now, the same as a fresh state, so that a
// store may forget the key. A state that holds the clock ahead of now (it
// has seen a later time: the clock ran backwards, or a reset left it
// there, see HeldAt) is not, until now reaches that time: a fresh state
// would date the next decision earlier than the ones before.
func (l *Limit) Fresh(s *State, now int64) bool {
	if l.Kind == Concurrency {
		return s.Level == 0
	}
	d := l.Peek(s, now, 0)
	return d.Reset <= 0 && d.At <= now
}

// inc is the refill time in ticks of cost milli-units: ceil(cost * Unit /
// 1000). cost <= Capacity, so cost*Unit <= Tau*1000 < 2^63.
func (l *Limit) inc(cost int64) int64 {
	return (cost*l.Unit + Milli - 1) / Milli
}

// scale is Scale, or 1 for the zero Limit.
func (l *Limit) scale() int64 {
	return max(l.Scale, 1)
}

// ticks converts µs to ticks.
func (l *Limit) ticks(micros int64) int64 {
	return micros * l.scale()
}

// floorMicros converts ticks to µs, rounding towards zero as Go's division
// does. Scale is a power of two (see NewLimit): a non-negative count of
// ticks is shifted, which costs a decision a cycle where a division costs
// tens.
func (l *Limit) floorMicros(ticks int64) int64 {
	sc := l.scale()
	if ticks >= 0 && sc&(sc-1) == 0 {
		return ticks >> bits.TrailingZeros64(uint64(sc))
	}
	return ticks / sc
}

// micros converts ticks to µs, rounding up.
func (l *Limit) micros(ticks int64) int64 {
	if ticks <= 0 {
		return 0
	}
	return l.floorMicros(ticks + l.scale() - 1)
}

// wholeUnits converts bucket room in ticks to whole events.
func (l *Limit) wholeUnits(room int64) int64 {
	if room <= 0 {
		return 0
	}
	return room / l.Unit
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	return (a + b - 1) / b
}
