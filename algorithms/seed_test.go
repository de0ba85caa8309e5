package algorithms

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// TestPropertySeed runs random traces against one shared state while a
// local copy is seeded from this instance's decisions, as on_storage_error
// local keeps it. In every mode, right after a seed the copy holds no more
// than the shared state does (its Remaining at the decision's time is no
// less than the decision's).
//
//   - alone: this instance makes every decision. The copy must decide
//     every whole-event request at the decision's time exactly as the
//     shared state does (the bucket family to a tick, so only where a tick
//     is a µs), and never reject, at any later time with nothing charged
//     meanwhile, what the shared state would admit (a sliding_window to a
//     thousandth of an event).
//   - shared: other instances charge the shared state too, and replies can
//     be seeded out of order. The copy must still never reject what the
//     shared state would admit.
//   - outage: some requests are decided on the copy alone, as when the
//     store cannot answer (the store may or may not have charged them).
func TestPropertySeed(t *testing.T) {
	kinds := []struct {
		kind    Kind
		shaping bool
	}{
		{TokenBucket, false}, {GCRA, false}, {LeakyBucket, false}, {LeakyBucket, true},
		{FixedWindow, false}, {SlidingWindow, false}, {SlidingLog, false},
	}
	for _, k := range kinds {
		for mode, modeName := range []string{"alone", "shared", "outage"} {
			name := k.kind.String()
			if k.shaping {
				name += "/shaping"
			}
			t.Run(name+"/"+modeName, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(k.kind)*3+uint64(mode), 17))
				for range traces() {
					l := randLimit(t, rng, k.kind, k.shaping)
					seedTrace(t, rng, &l, mode)
					if t.Failed() {
						return
					}
				}
			})
		}
	}
}

const (
	seedAlone = iota
	seedShared
	seedOutage
)

// pendingSeed is a decision whose seed is held back, to arrive after a
// later one.
type pendingSeed struct {
	d       Decision
	cost    int64
	charged bool
}

func seedTrace(t *testing.T, rng *rand.Rand, l *Limit, mode int) {
	t.Helper()
	shared, local := NewState(l), NewState(l)
	slack := int64(0)
	if l.Kind == SlidingWindow {
		slack = 1
	}
	var history []string // what the shared state and the copy saw, for a failure
	fail := func(format string, args ...any) {
		t.Helper()
		for _, h := range history[max(0, len(history)-8):] {
			t.Log(h)
		}
		t.Errorf(format, args...)
	}
	var held *pendingSeed
	// A sliding_window copy may count a late reply's charge in this
	// window twice, once as its own and once within the bound a later
	// decision told of the previous window (see seedSliding): by less
	// than the charge, until the window ends.
	var late, lateWindow int64
	for i, r := range randTrace(rng, l, 60) {
		mine := mode != seedShared || rng.IntN(2) == 0
		if mode == seedOutage && rng.IntN(3) == 0 {
			// The store does not answer in time: the copy decides, and
			// the store may have decided it too.
			if rng.IntN(2) == 0 {
				l.Take(&shared, r.t, r.cost)
			}
			d := l.Take(&local, r.t, r.cost)
			history = append(history, fmt.Sprintf("step %d at %s, cost %s, decided on the copy alone: %+v; the copy %+v", i, at0(r.t), events(r.cost), d, local))
			continue
		}
		var d Decision
		charged := false
		if mine && rng.IntN(8) == 0 {
			// Another zone rejected the request: nothing was charged,
			// and this zone's decision is what it would have decided.
			d = l.Peek(&shared, r.t, r.cost)
		} else {
			d = l.Take(&shared, r.t, r.cost)
			charged = d.Allowed
		}
		history = append(history, fmt.Sprintf("step %d at %s, cost %s, mine %v: %+v, charged %v; shared %+v", i, at0(r.t), events(r.cost), mine, d, charged, shared))
		if !mine {
			continue
		}
		if mode == seedShared && held == nil && rng.IntN(8) == 0 {
			held = &pendingSeed{d, r.cost, charged} // its reply comes late
			continue
		}
		if !seedForward(t, rng, l, &local, seeded{d, r.cost, charged}, r.t) {
			return
		}
		history = append(history, fmt.Sprintf("  the copy: %+v", local))
		stale := false
		if held != nil {
			if !seedForward(t, rng, l, &local, seeded{held.d, held.cost, held.charged}, r.t) {
				return
			}
			history = append(history, fmt.Sprintf("  then the late reply %+v: the copy %+v", held.d, local))
			if w := d.At - d.At%l.Window; l.Kind == SlidingWindow && held.charged && held.d.At-held.d.At%l.Window == w {
				if w != lateWindow {
					lateWindow, late = w, 0
				}
				late += held.cost
			}
			held, stale = nil, true
		}
		// In an outage the copy keeps what it admitted on its own, which
		// the shared state may not have counted.
		if c := clone(local); !stale && mode != seedOutage && l.Peek(&c, d.At, 0).Remaining < d.Remaining {
			fail("%s, step %d: seeded from %+v (charged %v), the copy %+v holds more than the shared state %+v",
				describe(l), i, d, charged, local, shared)
			return
		}
		if d.At-d.At%l.Window != lateWindow {
			late = 0
		}
		if mode == seedOutage {
			continue
		}
		for range 8 {
			at := d.At
			if rng.IntN(4) != 0 {
				at += rng.Int64N(3*l.Window + 1)
			}
			c := seedCost(rng, l)
			s, c2 := clone(shared), clone(local)
			want, got := l.Peek(&s, at, c+slack+late), l.Peek(&c2, at, c)
			if want.Allowed && !got.Allowed {
				fail("%s, step %d: seeded from %+v (charged %v), the copy %+v rejects %s at %s, which the shared state %+v admits",
					describe(l), i, d, charged, local, events(c), atRel(at, d.At), shared)
				return
			}
		}
		if mode != seedAlone || ((l.Kind == TokenBucket || l.Kind == GCRA || l.Kind == LeakyBucket) && l.Scale != 1) {
			continue
		}
		for c := int64(Milli); c <= l.Capacity(); c += Milli {
			s, c2 := clone(shared), clone(local)
			want, got := l.Peek(&s, d.At, c), l.Peek(&c2, d.At, c)
			if want.Allowed != got.Allowed {
				fail("%s, step %d: seeded from %+v (charged %v), the copy %+v decides %s at the decision's time %v, the shared state %+v %v",
					describe(l), i, d, charged, local, events(c), got.Allowed, shared, want.Allowed)
				return
			}
		}
	}
}

// seedForward seeds the copy s from x, and checks that it moved no
// backwards: at random times from the decision's time and now on, the
// copy admits no request of whole events that it would have rejected
// before (a sliding_window to a thousandth of an event).
func seedForward(t *testing.T, rng *rand.Rand, l *Limit, s *State, x seeded, now int64) bool {
	t.Helper()
	before := clone(*s)
	l.Seed(s, x.d, x.cost, x.charged)
	slack := int64(0)
	if l.Kind == SlidingWindow {
		slack = 1
	}
	for range 4 {
		at := max(x.d.At, now) + rng.Int64N(2*l.Window+1)
		c := Milli * (1 + rng.Int64N(max(1, l.Capacity()/Milli)))
		b, a := clone(before), clone(*s)
		if got, was := l.Peek(&a, at, c), l.Peek(&b, at, max(0, c-slack)); got.Allowed && !was.Allowed {
			t.Errorf("%s: seeded from %+v (cost %s, charged %v), the copy %+v went back from %+v: it admits %s at %s, which it rejected before",
				describe(l), x.d, events(x.cost), x.charged, *s, before, events(c), atRel(at, x.d.At))
			return false
		}
	}
	return true
}

// seedCost is a random cost up to the capacity, often whole events.
func seedCost(rng *rand.Rand, l *Limit) int64 {
	if rng.IntN(2) == 0 {
		return Milli * (1 + rng.Int64N(max(1, l.Capacity()/Milli)))
	}
	return rng.Int64N(l.Capacity() + 1)
}

func atRel(at, from int64) string {
	return fmt.Sprintf("%s (the decision's time + %dµs)", at0(at), at-from)
}

func at0(t int64) string { return fmt.Sprintf("t0+%dµs", t-t0) }

// TestSeedBan copies a ban and its strikes.
func TestSeedBan(t *testing.T) {
	l, err := NewBan(3, time.Minute, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var shared, local State
	now := t0
	for i := range 3 {
		d := l.Strike(&shared, now+int64(i))
		l.Seed(&local, d, 0, false)
		if got, want := l.Peek(&local, now+int64(i), 0), l.Peek(&shared, now+int64(i), 0); got != want {
			t.Fatalf("strike %d: the copy decides %+v, the shared state %+v", i+1, got, want)
		}
	}
	end := shared.At
	if d := l.Peek(&local, end-1, 0); d.Allowed {
		t.Fatalf("the copy's ban ended before the shared one's end: %+v", d)
	}
	if d := l.Peek(&local, end, 0); !d.Allowed {
		t.Fatalf("the copy's ban outlasts the shared one: %+v", d)
	}
	// A ban's decision whose Wait covers its zone's rate (WaitAlso): the
	// copy's ban ends with the shared one, at Reset, not at the Wait.
	d := l.Peek(&shared, now, 0)
	d.WaitAlso(Decision{Wait: d.Wait + 3600*second})
	local = State{}
	l.Seed(&local, d, 0, false)
	if local.At != end {
		t.Fatalf("seeded from a ban whose Wait covers its rate: the copy's ban ends at %s, want %s", at0(local.At), at0(end))
	}
	// A shared decision that admits does not lift a ban the copy holds:
	// it may be a reply from before the ban that came late. An unban,
	// followed by Reseed, does.
	local = State{At: now + 600_000_000}
	l.Seed(&local, l.Peek(&State{}, now, 0), 0, false)
	if d := l.Peek(&local, now, 0); d.Allowed {
		t.Fatalf("a late admission lifted the copy's ban: %+v", d)
	}
	l.Reseed(&local, l.Peek(&State{}, now, 0))
	if d := l.Peek(&local, now, 0); !d.Allowed || d.Remaining != 3 {
		t.Fatalf("after an unban, the copy decides %+v, want admitted with 3 strikes left", d)
	}
	// A late reply from before a ban brings back no strikes the ban
	// cleared.
	var s2 State
	l.Seed(&s2, Decision{Reset: 600 * second, Wait: 600 * second, At: now + 3}, 0, false)
	l.Seed(&s2, Decision{Allowed: true, Remaining: 1, Reset: 60*second - 1, At: now + 1}, 0, false)
	if d := l.Peek(&s2, now+3+600*second, 0); !d.Allowed || d.Remaining != 3 {
		t.Fatalf("after the ban, the copy seeded with a late reply decides %+v, want admitted with 3 strikes left", d)
	}
}

// TestSeedConcurrencyIsNotSeeded: slots are leases no decision times.
func TestSeedConcurrencyIsNotSeeded(t *testing.T) {
	l, err := NewConcurrency(2, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s := State{Level: 1}
	l.Seed(&s, Decision{At: t0, Remaining: 0, Reset: second, Wait: second}, Milli, false)
	if s.At != 0 || s.Level != 1 || s.Prev != 0 || s.Log != nil {
		t.Fatalf("a concurrency state changed: %+v", s)
	}
}

// TestSeedKeepsWhatOnlyTheCopyCounted: requests the copy admitted on its
// own while the store could not answer, in the previous window, still
// weigh once the store answers again (a seed never moves a copy back:
// those requests were admitted, whether or not the store counted them),
// until they age out; a reset on the store, followed by Reseed, forgets
// them.
func TestSeedKeepsWhatOnlyTheCopyCounted(t *testing.T) {
	l := mustLimit(t, SlidingWindow, 10, time.Minute, 0, 0)
	w0 := t0 - t0%l.Window
	var shared, local State
	for range 10 {
		if d := l.Take(&local, w0+sec, Milli); !d.Allowed {
			t.Fatalf("the copy on its own: %+v", d)
		}
	}
	now := w0 + l.Window + 30*sec
	d := l.Take(&shared, now, Milli)
	l.Seed(&local, d, Milli, true)
	// Half of the 10 still weigh, and the request.
	if got := l.Peek(&local, now, 0); got.Remaining != 4 {
		t.Fatalf("after the seed the copy %+v has %d events left, want 4", local, got.Remaining)
	}
	if got := l.Peek(&local, now+l.Window, 0); got.Remaining != l.Peek(&shared, now+l.Window, 0).Remaining {
		t.Fatalf("a window later the copy %+v has %d events left, the shared state %+v %d", local, got.Remaining, shared, l.Peek(&shared, now+l.Window, 0).Remaining)
	}
	l.Reseed(&local, d)
	if got := l.Peek(&local, now, 0); got.Remaining != d.Remaining {
		t.Fatalf("after a reseed the copy %+v has %d events left at the decision's time, the shared state %d", local, got.Remaining, d.Remaining)
	}
}

// TestSeedOutOfOrder: replies seeded 1, 3, 2 leave the copy where reply 3
// left it. Before, reply 2 took the copy back, and it admitted a 4th
// request of 3.
func TestSeedOutOfOrder(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog} {
		t.Run(kind.String(), func(t *testing.T) {
			l := mustLimit(t, kind, 3, time.Minute, 0, 0)
			var shared, local State
			var ds [3]Decision
			for i := range ds {
				ds[i] = l.Take(&shared, t0+int64(i)*ms, Milli)
			}
			for _, i := range []int{0, 2, 1} {
				l.Seed(&local, ds[i], Milli, true)
			}
			if d := l.Take(&local, t0+3*ms, Milli); d.Allowed {
				t.Fatalf("seeded 1, 3, 2, the copy %+v admitted a 4th request of 3: %+v", local, d)
			}
		})
	}
}

// TestReseedLog: after a reset, a sliding_log copy keeps no more of its
// entries than the store's log holds, the newest.
func TestReseedLog(t *testing.T) {
	l := mustLimit(t, SlidingLog, 3, time.Minute, 0, 0)
	var local State
	for i := range 3 {
		l.Take(&local, t0+int64(i)*sec, Milli)
	}
	l.Reseed(&local, Decision{Allowed: true, Remaining: 2, Reset: 59 * sec, At: t0 + 3*sec})
	if local.Level != 1 || local.entry(0) != t0+2*sec {
		t.Fatalf("reseeded with 1 entry held, the copy %+v, want its newest entry only", local)
	}
}

// TestPropertySeedOutOfOrder: replies reach the copy in any order, some
// twice (a copy is seeded by each request's own reply, and concurrent
// requests' replies race), and the copy never moves backwards. Each trace
// is a real sequence of decisions this instance made alone on the shared
// state; the copy is seeded from a shuffle of them with duplicates. At the
// last decision's time and at random later times, nothing charged
// meanwhile, the copy must admit no request of whole events that the
// shared state after the last decision would reject (for a bucket whose
// tick is finer than a µs, that the shared state would reject a µs later:
// a Decision tells the debt to a µs). Before, the copy took whichever
// reply came last: seeded from decisions 1, 3, 2 of 3 events, it admitted
// a 4th.
func TestPropertySeedOutOfOrder(t *testing.T) {
	kinds := []struct {
		kind    Kind
		shaping bool
	}{
		{TokenBucket, false}, {GCRA, false}, {LeakyBucket, false}, {LeakyBucket, true},
		{FixedWindow, false}, {SlidingWindow, false}, {SlidingLog, false},
	}
	for _, k := range kinds {
		name := k.kind.String()
		if k.shaping {
			name += "/shaping"
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(k.kind), 29))
			for range traces() {
				l := randLimit(t, rng, k.kind, k.shaping)
				seedShuffled(t, rng, &l)
				if t.Failed() {
					return
				}
			}
		})
	}
	t.Run("ban", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(uint64(Ban), 29))
		for range traces() {
			seedBanShuffled(t, rng)
			if t.Failed() {
				return
			}
		}
	})
}

// seeded is one decision as the copy is seeded from it.
type seeded struct {
	d       Decision
	cost    int64
	charged bool
}

// shuffled returns the indices 0..n-1 in a random order, with some of
// them repeated.
func shuffled(rng *rand.Rand, n int) []int {
	order := rng.Perm(n)
	for range rng.IntN(n/2 + 1) {
		at := rng.IntN(len(order) + 1)
		order = append(order[:at], append([]int{rng.IntN(n)}, order[at:]...)...)
	}
	return order
}

func seedShuffled(t *testing.T, rng *rand.Rand, l *Limit) {
	t.Helper()
	shared := NewState(l)
	var ds []seeded
	for _, r := range randTrace(rng, l, 2+rng.IntN(12)) {
		if rng.IntN(8) == 0 {
			// Another zone rejected the request: nothing charged.
			ds = append(ds, seeded{l.Peek(&shared, r.t, r.cost), r.cost, false})
			continue
		}
		d := l.Take(&shared, r.t, r.cost)
		ds = append(ds, seeded{d, r.cost, d.Allowed})
	}
	last := ds[len(ds)-1].d.At
	for range 4 {
		order := shuffled(rng, len(ds))
		var local State
		for _, i := range order {
			l.Seed(&local, ds[i].d, ds[i].cost, ds[i].charged)
		}
		for range 8 {
			at := last
			if rng.IntN(3) != 0 {
				at += rng.Int64N(3*l.Window + 1)
			}
			ref := at
			if (l.Kind == TokenBucket || l.Kind == GCRA || l.Kind == LeakyBucket) && l.Scale != 1 {
				ref++
			}
			for c := int64(Milli); c <= l.Capacity(); c += Milli {
				s, c2 := clone(shared), clone(local)
				want, got := l.Peek(&s, ref, c), l.Peek(&c2, at, c)
				if got.Allowed && !want.Allowed {
					t.Errorf("%s: seeded in the order %v from %+v, the copy %+v admits %s at %s, which the shared state %+v after the last decision rejects (%+v)",
						describe(l), order, ds, local, events(c), atRel(at, last), shared, want)
					return
				}
			}
		}
	}
}

// seedBanShuffled runs strikes and looks at a ban, seeds a copy from the
// decisions shuffled, and checks that the copy bans the key whenever the
// shared state does, and that a strike bans it in the copy whenever it
// would in the shared state.
func seedBanShuffled(t *testing.T, rng *rand.Rand) {
	t.Helper()
	after := 1 + rng.Int64N(4)
	window := time.Duration(1+rng.Int64N(100)) * time.Second
	hold := time.Duration(1+rng.Int64N(100)) * time.Second
	l, err := NewBan(after, window, hold)
	if err != nil {
		t.Fatal(err)
	}
	var shared State
	var ds []seeded
	now := t0
	for range 2 + rng.IntN(12) {
		now += rng.Int64N(max(l.Window, l.Hold) / 2)
		if rng.IntN(2) == 0 {
			ds = append(ds, seeded{d: l.Strike(&shared, now)})
		} else {
			ds = append(ds, seeded{d: l.Peek(&shared, now, 0)})
		}
	}
	last := ds[len(ds)-1].d.At
	for range 4 {
		order := shuffled(rng, len(ds))
		var local State
		for _, i := range order {
			l.Seed(&local, ds[i].d, 0, false)
		}
		for range 8 {
			at := last
			if rng.IntN(3) != 0 {
				at += rng.Int64N(2*max(l.Window, l.Hold) + 1)
			}
			s, c := shared, local
			if want, got := l.Peek(&s, at, 0), l.Peek(&c, at, 0); got.Allowed && !want.Allowed {
				t.Errorf("ban of %d in %s for %s: seeded in the order %v from %+v, the copy %+v lets the key in at %s, which the shared state %+v bans",
					after, window, hold, order, ds, local, atRel(at, last), shared)
				return
			}
			if want, got := l.Strike(&s, at), l.Strike(&c, at); got.Allowed && !want.Allowed {
				t.Errorf("ban of %d in %s for %s: seeded in the order %v from %+v, the copy %+v is not banned by a strike at %s, which bans the shared state %+v",
					after, window, hold, order, ds, local, atRel(at, last), shared)
				return
			}
		}
	}
}

// TestSeedAllocs: merging a reply into a copy allocates nothing once a
// sliding_log's ring has grown to its entries.
func TestSeedAllocs(t *testing.T) {
	for _, kind := range allKinds {
		l := mustLimit(t, kind, 100, time.Second, 0, 0)
		var shared, local State
		now := t0
		for range 200 {
			now += 3 * ms
			d := l.Take(&shared, now, 1500)
			l.Seed(&local, d, 1500, d.Allowed)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			now += 3 * ms
			d := l.Take(&shared, now, 1500)
			l.Seed(&local, d, 1500, d.Allowed)
			l.Seed(&local, d, 0, false)
		})
		if allocs != 0 {
			t.Errorf("%s: Seed allocates %v times, want 0", kind, allocs)
		}
	}
}

// TestSeedFollowsGrant: a copy told of a grant (Grant on the copy, as
// the store does for the grants of the store it copies), then seeded with
// the shared state's decisions, admits on its own what the shared state
// still admits: no more (the limit and the grant, less what was used of
// it), and, for the windows, no less. Before, a fixed_window copy seeded
// after a grant kept its count at 0 while the decision's room exceeded
// the limit, and admitted the whole grant again.
func TestSeedFollowsGrant(t *testing.T) {
	for _, kind := range []Kind{FixedWindow, SlidingWindow, SlidingLog} {
		for _, c := range []struct{ spent, grant, used int }{{3, 5, 3}, {3, 5, 1}, {1, 2, 0}, {0, 4, 4}} {
			l := mustLimit(t, kind, 3, time.Hour, 0, 0)
			now := t0 - t0%l.Window + sec
			var shared, local State
			step := func() int64 { now += sec; return now }
			for range c.spent {
				l.Seed(&local, l.Take(&shared, step(), Milli), Milli, true)
			}
			d, err := l.Grant(&shared, step(), int64(c.grant)*Milli)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Grant(&local, now, int64(c.grant)*Milli); err != nil {
				t.Fatal(err)
			}
			l.Seed(&local, d, 0, false)
			for range c.used {
				l.Seed(&local, l.Take(&shared, step(), Milli), Milli, true)
			}
			admits := func(s State) int {
				n := 0
				for at := now + sec; l.Take(&s, at, Milli).Allowed; at += sec {
					n++
				}
				return n
			}
			want, got := admits(shared), admits(local)
			if got > want || got < want {
				t.Errorf("%s %+v: the copy admits %d on its own, the shared state %d", kind, c, got, want)
			}
		}
	}
}

// TestSeedFresh: a decision of a fresh bucket (Reset 0) seeded into a
// fresh copy leaves it deciding as a fresh state, at a µs tick and at a
// fine one (999999/s: ticks of 1/1024 µs).
func TestSeedFresh(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		for _, events := range []int64{10, 999_999} {
			l := mustLimit(t, kind, events, time.Second, 0, 0)
			var shared, fresh, local State
			d := l.Peek(&shared, t0, 0)
			l.Seed(&local, d, 0, false)
			for i, cost := range []int64{l.Capacity(), Milli} {
				if got, want := l.Take(&local, t0, cost), l.Take(&fresh, t0, cost); got != want {
					t.Fatalf("%s: step %d: the seeded copy decides %+v, a fresh state %+v", describe(&l), i, got, want)
				}
			}
		}
	}
}

// TestPrevFor: prevFor is the largest count, at most the limit, whose
// weight toNext µs before the window's end is at most left: floor(left *
// W / toNext), computed in big integers here, for counts and windows up
// to their bounds, quotients past 64 bits among them.
func TestPrevFor(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 5))
	for i := 0; i < 100_000; i++ {
		w := 1 + rng.Int64N(MaxSpan)
		n := 1 + rng.Int64N(min(w, MaxEvents))
		l := Limit{Kind: SlidingWindow, Events: n, Window: w}
		left, toNext := rng.Int64N(n*Milli+1)-1, 1+rng.Int64N(w)
		switch i % 4 {
		case 0:
			toNext = 1 + rng.Int64N(3)
		case 1: // left * W exactly toNext * 2^64
			l.Window, l.Events, toNext, left = 1<<32, 1<<32, 1, 1<<32
		}
		want := new(big.Int)
		if left > 0 {
			want.Mul(big.NewInt(left), big.NewInt(l.Window))
			want.Quo(want, big.NewInt(toNext))
		}
		if lim := big.NewInt(l.Events * Milli); want.Cmp(lim) > 0 {
			want = lim
		}
		if got := l.prevFor(left, toNext); got != want.Int64() {
			t.Fatalf("prevFor(%d, %d) in %d per %d µs = %d, want %s", left, toNext, l.Events, l.Window, got, want)
		}
	}
}

// TestSeedBanStrikesBeforeBanEnd: strikes a shared decision tells whose
// strike window began before the ban the copy holds ended were made
// before that ban (a banned key gets none): the copy forgets them. A
// window that begins as the ban ends keeps them.
func TestSeedBanStrikesBeforeBanEnd(t *testing.T) {
	l, err := NewBan(3, time.Minute, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	banEnd := t0 + 600*sec
	for _, c := range []struct {
		name         string
		at, reset    int64
		wantLeftThen int64
	}{
		{"a window from 40 s before the ban's end", banEnd - 10*sec, 30 * sec, 3},
		{"a window from the ban's end", banEnd, 60 * sec, 2},
	} {
		var local State
		l.Seed(&local, Decision{Reset: 600 * sec, Wait: 600 * sec, At: t0}, 0, false)
		l.Seed(&local, Decision{Allowed: true, Remaining: 2, Reset: c.reset, At: c.at}, 0, false)
		if d := l.Peek(&local, banEnd+1, 0); !d.Allowed || d.Remaining != c.wantLeftThen {
			t.Errorf("%s: after the ban %+v, want %d strikes left", c.name, d, c.wantLeftThen)
		}
	}
}

// TestReseedLogKeepsWhatItHolds: a reseed of a sliding_log copy from a
// decision that tells as many entries as it holds keeps them all.
func TestReseedLogKeepsWhatItHolds(t *testing.T) {
	l := mustLimit(t, SlidingLog, 5, time.Minute, 0, 0)
	var s State
	for i := range int64(3) {
		l.Take(&s, t0+i, Milli)
	}
	l.Reseed(&s, Decision{Allowed: true, Remaining: 2, Reset: 60 * sec, At: t0 + 2})
	if s.Level != 3 {
		t.Fatalf("after a reseed telling 3 entries: %d held, want 3", s.Level)
	}
}

// TestSeedSlidingUncharged: a reply that charged nothing and tells less
// than the copy holds leaves the previous window's count as it was (the
// bound of a charged reply's rest is not taken for it: that would round
// 1000 milli-units, weighing 334 a third of a window from its end, up to
// 1002).
func TestSeedSlidingUncharged(t *testing.T) {
	l := mustLimit(t, SlidingWindow, 10, time.Minute, 0, 0)
	start := t0 - t0%l.Window
	s := State{At: start, Prev: Milli}
	l.Seed(&s, Decision{Allowed: true, Remaining: 9, Reset: 60 * sec, At: start + 40*sec}, 0, false)
	if s.Prev != Milli || s.Level != 0 {
		t.Fatalf("after an uncharged reply: Prev %d, Level %d; want %d and 0", s.Prev, s.Level, Milli)
	}
}

// TestSeedLogGrantBound: a sliding_log copy told of a grant keeps at most
// the limit's events and the grant's while the grant lasts (seedLog's
// s.Prev / Milli, which a * would inflate), and only the limit's once it
// has ended, at its end's very µs (Granted's now >= s.At: the grant's
// `d.At < s.At`, which a <= would stretch by one µs).
func TestSeedLogGrantBound(t *testing.T) {
	l := mustLimit(t, SlidingLog, 3, time.Minute, 0, 0)
	var granted State
	if _, err := l.Grant(&granted, t0, 2*Milli); err != nil {
		t.Fatal(err)
	}
	end := granted.At
	for _, c := range []struct {
		name string
		at   int64
		cost int64
		want int64
	}{
		{"within the grant, more than it covers", t0 + 1, 9 * Milli, 5},
		{"at the grant's end", end, 5 * Milli, 3},
		{"just before the grant's end", end - 1, 5 * Milli, 5},
	} {
		s := granted
		l.Seed(&s, Decision{Allowed: true, Remaining: 0, Reset: time.Minute.Microseconds(), At: c.at}, c.cost, true)
		if s.Level != c.want {
			t.Errorf("%s: %d entries kept, want %d", c.name, s.Level, c.want)
		}
	}
}
