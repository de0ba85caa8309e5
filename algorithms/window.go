package algorithms

import (
	"cmp"
	"math"
	"math/bits"
)

// The window family counts cost in milli-units against Events * Milli,
// and a fixed_window or sliding_window against a grant on top (see
// Limit.Grant). Windows are aligned to multiples of W
// since the Unix epoch, or for a calendar window to the periods of its
// Calendar, so every instance and store agrees on where a window starts.

// roll brings an epoch window's state up to date with now and returns
// the (possibly adjusted) now, which it keeps in At, and e, the µs of its
// window elapsed at now (one division, where the decision needs both).
// The clock running backwards counts as no time elapsed: now never goes
// before the latest time the state has seen (At), so that a decision is
// never dated before one made earlier on the state (see
// storage.ResetAt). The window is the one that holds At (see
// windowStart).
func (l *Limit) roll(s *State, now int64) (int64, int64) {
	now = max(now, s.At)
	e := now % l.Window
	start := now - e
	if start > s.At {
		if start-s.At <= l.Window { // At was in the window before
			// What a grant admitted ends with its window: the next one
			// weighs only the rest.
			s.Prev = max(0, s.Level-l.granted(s))
		} else {
			s.Prev = 0
		}
		s.Level = 0
		// A sliding_window keeps in Head what was charged in the previous
		// window (see State); a grant ends with its window.
		s.Head = 0
		if l.Kind == SlidingWindow {
			s.Head = s.Prev
		}
	}
	s.At = now
	return now, e
}

// windowStart is the start of the epoch window that holds t.
func (l *Limit) windowStart(t int64) int64 {
	return t - t%l.Window
}

// granted is the quota, in milli-units, granted to s's current window
// (see Limit.Grant): a fixed_window keeps it in Head, a sliding_window as
// a negative Head, a sliding_log in Prev (see State).
func (l *Limit) granted(s *State) int64 {
	switch l.Kind {
	case FixedWindow:
		return s.Head
	case SlidingWindow:
		return max(0, -s.Head)
	case SlidingLog:
		return s.Prev
	}
	return 0
}

// fixedWindow: At = the latest time seen (the window is the one that
// holds it), Level = count in the window.
func (l *Limit) fixedWindow(s *State, now, cost int64, commit bool, d *Decision) {
	now, e := l.roll(s, now)
	l.fixed(s, now, cost, commit, l.Window-e, d)
}

// holds reports whether a decision on s at now can be made with sp: for
// a calendar window, whether the state's window still holds now (the
// clock held, as roll holds it) or sp holds it.
func (l *Limit) holds(s *State, sp Span, now int64) bool {
	if l.Kind != FixedWindow || l.Calendar.Unit == NoUnit {
		return true
	}
	now = max(now, s.At)
	return now < s.Prev || (sp.Start <= now && now < sp.End)
}

// rollPeriod brings a calendar window's state up to date with now: when
// its window is over, the period of sp that holds now starts (holds has
// checked there is one). As roll, it holds a clock that ran backwards.
func (l *Limit) rollPeriod(s *State, now int64, sp *Span) int64 {
	now = max(now, s.At)
	if now >= s.Prev {
		s.At, s.Prev = sp.Start, sp.Mid
		if now >= sp.Mid {
			s.At, s.Prev = sp.Mid, sp.End
		}
		s.Level, s.Head = 0, 0
	}
	return now
}

// fixedPeriod is fixedWindow on a calendar: At = window start, Prev =
// window end, Level = count in the window.
func (l *Limit) fixedPeriod(s *State, now, cost int64, commit bool, sp *Span, d *Decision) {
	now = l.rollPeriod(s, now, sp)
	l.fixed(s, now, cost, commit, s.Prev-now, d)
}

// fixed decides, into *d, a fixed window whose state is up to date with
// now and whose window ends toNext µs after now.
func (l *Limit) fixed(s *State, now, cost int64, commit bool, toNext int64, d *Decision) {
	limit := l.Events*Milli + s.Head
	if s.Level+cost > limit {
		*d = Decision{Remaining: (limit - s.Level) / Milli, Reset: toNext, Wait: toNext, At: now}
		return
	}
	if commit {
		s.Level += cost
	}
	*d = Decision{Allowed: true, Remaining: (limit - s.Level) / Milli, At: now}
	if s.Level > 0 || s.Head > 0 {
		d.Reset = toNext
	}
}

// slidingWindow: At = the latest time seen (the current window is the one
// that holds it), Level = this window's count, Prev = the previous
// window's. The previous count weighs in proportion to how much of the
// sliding window still overlaps it, prev * (W - elapsed) / W, and a
// request of cost c is admitted exactly when that weight plus Level plus c
// is at most N: the products are compared exactly, in 128 bits (the Lua
// twin compares them in 26-bit limbs), so that no rounding admits more.
func (l *Limit) slidingWindow(s *State, now, cost int64, commit bool, d *Decision) {
	now, e := l.roll(s, now)
	g := max(0, -s.Head) // the grant (see State)
	limit := l.Events*Milli + g
	toNext := l.Window - e
	weighted := l.weight(s.Prev, toNext)
	if weighted+s.Level+cost > limit {
		*d = Decision{
			Remaining: max(0, limit-weighted-s.Level) / Milli,
			Reset:     l.slidingReset(s, toNext, g),
			Wait:      l.slidingWait(s, e, cost, g),
			At:        now,
		}
		return
	}
	if commit {
		s.Level += cost
	}
	*d = Decision{
		Allowed:   true,
		Remaining: (limit - weighted - s.Level) / Milli,
		Reset:     l.slidingReset(s, toNext, g),
		At:        now,
	}
}

// slidingReset is the µs until a sliding_window whose window ends toNext
// µs from now, granted g, is fresh.
func (l *Limit) slidingReset(s *State, toNext, g int64) int64 {
	switch {
	case s.Level > g:
		return toNext + l.Window
	case s.Prev > 0 || s.Level > 0 || g > 0:
		return toNext
	}
	return 0
}

// weight is the previous window's count prev as it weighs toNext µs before
// the current window ends: ceil(prev * toNext / W), exactly. Since the
// count is whole, weight + level + cost <= limit holds exactly when
// prev * toNext / W + level + cost <= limit does.
func (l *Limit) weight(prev, toNext int64) int64 {
	if prev <= 0 || toNext <= 0 {
		return 0
	}
	// The product in 128 bits, divided exactly: one multiplication and
	// one division. A decision is within a window (toNext <= W), so the
	// quotient is at most prev and fits; hi < W is exactly that it fits
	// in 64 bits. One that would not (toNext far beyond W: no caller)
	// weighs more than any limit, rather than have Div64 panic.
	hi, lo := bits.Mul64(uint64(prev), uint64(toNext))
	if hi >= uint64(l.Window) {
		return math.MaxInt64 / 4
	}
	q, r := bits.Div64(hi, lo, uint64(l.Window))
	if r != 0 {
		q++
	}
	return int64(min(q, math.MaxInt64/4))
}

// mulCmp compares a*b with c*d, for non-negative arguments, exactly.
func mulCmp(a, b, c, d int64) int {
	h1, l1 := bits.Mul64(uint64(a), uint64(b))
	h2, l2 := bits.Mul64(uint64(c), uint64(d))
	if h1 != h2 {
		return cmp.Compare(h1, h2)
	}
	return cmp.Compare(l1, l2)
}

// slidingWait is the µs until a rejected request of cost fits: until the
// previous window's weight has decayed enough, or, when this window alone
// is too full, into the next window until this window's weight has.
func (l *Limit) slidingWait(s *State, e, cost, g int64) int64 {
	limit := l.Events * Milli
	if room := limit + g - s.Level - cost; room >= 0 {
		// It fits at the latest at the next window start (the weight is 0
		// at e' = W) and not now, at e.
		return l.decayed(s.Prev, room, e+1) - e
	}
	// Next window: this window's count, less what its grant admitted, is
	// the previous one, and the current one is empty.
	return l.Window - e + l.decayed(max(0, s.Level-g), limit-cost, 0)
}

// decayed returns the least elapsed time e' in [lo, W] at which
// prev * (W - e') <= room * W, that is weight(prev, W - e') <= room, for
// room >= 0. The weight never grows with e', and at most 51 steps are
// taken (W <= 2^50).
func (l *Limit) decayed(prev, room, lo int64) int64 {
	hi := l.Window
	for lo < hi {
		mid := lo + (hi-lo)/2
		if mulCmp(prev, l.Window-mid, room, l.Window) <= 0 {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// windowUndo gives cost back to the window the decision taken charged it
// in, if the state still counts that window: as this window's count, or
// (sliding_window) as the previous one's. Cost charged in a window that no
// longer counts is forgotten already; giving it to a later window would
// mint quota.
func (l *Limit) windowUndo(s *State, now, cost int64, taken Decision) {
	if l.Calendar.Unit != NoUnit {
		// Only the state's own window: a later one needs no bounds to
		// know it was not charged.
		if max(now, s.At) < s.Prev && s.At <= taken.At && taken.At < s.Prev {
			s.Level = max(0, s.Level-cost)
		}
		return
	}
	now, e := l.roll(s, now)
	charged, start := l.windowStart(taken.At), now-e
	switch {
	case charged == start:
		s.Level = max(0, s.Level-cost)
	case charged == start-l.Window && l.Kind == SlidingWindow:
		s.Prev = max(0, s.Prev-cost)
		if s.Head > 0 { // not a grant (see State)
			s.Head = max(0, s.Head-cost)
		}
	}
}

// slidingLog keeps the admission times of the events in the window in a
// ring, oldest first: Log[Head] is the oldest, Level how many there are. A
// request of cost c counts ceil(c) events (the log holds whole events) and
// is admitted when the events in (now - W, now] plus ceil(c) are at most
// N, and the whole events of a grant while it lasts (Prev milli-units
// until At, see Limit.Grant). The ring grows with the entries, doubling up
// to N and the grant, and halves when at most a quarter full, so that a
// key holds memory in proportion to its events.
func (l *Limit) slidingLog(s *State, now, cost int64, commit bool, d *Decision) {
	n := l.Events
	now = l.logNow(s, now)
	g := s.Prev / Milli
	k := ceilDiv(cost, Milli)
	if s.Level+k > n+g {
		need := s.Level + k - n - g
		wait := s.entry(need-1) + l.Window - now
		if g > 0 && now+wait >= s.At {
			// The grant ends first: then the log must hold at most N.
			wait = max(s.At, s.entry(s.Level+k-n-1)+l.Window) - now
		}
		*d = Decision{
			Remaining: max(0, n+g-s.Level), // a log may hold more (see logNow)
			Reset:     l.logReset(s, now),
			Wait:      wait,
			At:        now,
		}
		return
	}
	if commit {
		s.resize(s.Level+k, n+g)
		c := int64(len(s.Log))
		i := s.Head + s.Level // where the next entry goes, before wrapping
		for range k {
			if i >= c {
				i -= c
			}
			s.Log[i] = now
			i++
		}
		s.Level += k
	}
	*d = Decision{Allowed: true, Remaining: n + g - s.Level, Reset: l.logReset(s, now), At: now}
}

// logNow brings a sliding_log up to date with now and returns the
// (possibly held) now: a clock that ran backwards counts as no time
// elapsed, entries that have left the window are dropped, and a grant
// that has ended is forgotten. A log may hold more entries than its
// limit (the limit was lowered, or a grant ended): each counts until it
// leaves the window, so that a later grant admits only what it grants.
func (l *Limit) logNow(s *State, now int64) int64 {
	if s.Level > 0 {
		now = max(now, s.entry(s.Level-1)) // a clock that ran backwards: no time has elapsed
	}
	for s.Level > 0 && s.Log[s.Head] <= now-l.Window {
		if s.Head++; s.Head == int64(len(s.Log)) {
			s.Head = 0
		}
		s.Level--
	}
	if s.Prev > 0 && now >= s.At {
		s.At, s.Prev = 0, 0 // the grant has ended
	}
	return now
}

// logReset is the µs until a sliding_log's state is fresh: its newest
// entry has left the window and its grant has ended.
func (l *Limit) logReset(s *State, now int64) int64 {
	var end int64
	if s.Level > 0 {
		end = s.entry(s.Level-1) + l.Window
	}
	if s.Prev > 0 {
		end = max(end, s.At)
	}
	return max(0, end-now)
}

// entry is the i-th oldest entry of a sliding_log's ring, for i below
// its Level (at most the ring's length): Head + i is then below twice the
// length, and one subtraction wraps it, where a remainder would be a
// division on every decision's path.
func (s *State) entry(i int64) int64 {
	j := s.Head + i
	if c := int64(len(s.Log)); j >= c {
		j -= c
	}
	return s.Log[j]
}

// minLog is the smallest ring a sliding_log keeps once it has entries.
const minLog = 4

// resize makes the ring's capacity fit need entries (at most n): doubled
// when it is too small, halved when need is at most a quarter of it. The
// entries keep their order, the oldest at Head = 0.
func (s *State) resize(need, n int64) {
	c := int64(len(s.Log))
	newCap := c
	switch {
	case need > c:
		newCap = min(n, max(minLog, 2*c, need))
	case c > minLog && need <= c/4:
		newCap = max(minLog, c/2)
	}
	if newCap == c {
		return
	}
	log := make([]int64, newCap)
	for i := int64(0); i < s.Level; i++ {
		log[i] = s.entry(i)
	}
	s.Log, s.Head = log, 0
}

// slidingLogUndo removes up to ceil(cost) entries made at taken.At, the
// request's own (entries of one time are interchangeable), if they are
// still in the log. It drops nothing else: an entry that has expired for
// now may count again for a clock that runs backwards.
func (l *Limit) slidingLogUndo(s *State, now, cost int64, taken Decision) {
	k := ceilDiv(cost, Milli)
	c := int64(len(s.Log))
	// Entries only grow along the ring: find the run at taken.At and close
	// the gap by moving the newer entries down.
	// Not found, first is Level: the run is empty and nothing moves.
	first := s.Level
	for i := int64(0); i < s.Level; i++ {
		if s.entry(i) == taken.At {
			first = i
			break
		}
	}
	run := int64(0)
	for first+run < s.Level && run < k && s.entry(first+run) == taken.At {
		run++
	}
	for i := first + run; i < s.Level; i++ {
		s.Log[(s.Head+i-run)%c] = s.entry(i)
	}
	s.Level -= run
}
