package algorithms

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestLeaseSize(t *testing.T) {
	tests := []struct{ want, room, n int64 }{
		{100, 800, 100},
		{100, 799, 99},
		{1000, 80, 10},
		{10, 16, 2},
		{10, 15, 0}, // 1/8 of 15 is 1: not worth a lease
		{1, 800, 0},
		{0, 800, 0},
		{10, -5, 0},
	}
	for _, tt := range tests {
		if got := LeaseSize(tt.want, tt.room); got != tt.n {
			t.Errorf("LeaseSize(%d, %d) = %d, want %d", tt.want, tt.room, got, tt.n)
		}
	}
}

// TestLeaseTakeShrinksNearTheLimit: a key's leases shrink with what it
// has left, to none near the limit.
func TestLeaseTakeShrinksNearTheLimit(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, FixedWindow, SlidingWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			l := mustNew(t, kind, 1000, sec, 0)
			s := NewState(&l)
			var sizes []int64
			now := int64(5 * sec)
			for range 200 {
				d, n, _ := l.LeaseTake(&s, nil, now, Milli, 1000, 10*ms)
				if !d.Allowed {
					break
				}
				sizes = append(sizes, n)
			}
			if len(sizes) < 3 || sizes[0] == 0 || sizes[len(sizes)-1] != 0 {
				t.Fatalf("lease sizes %v: want leases that shrink to none", sizes)
			}
			for i := 1; i < len(sizes); i++ {
				if sizes[i] > sizes[i-1] {
					t.Fatalf("lease sizes %v: lease %d grew", sizes, i)
				}
			}
		})
	}
}

// TestLeaseEndIsASmallerLease: a bucket lease that ends early leaves the
// debt of a lease of the events spent that lived until then.
func TestLeaseEndIsASmallerLease(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		l := mustNew(t, kind, 100, sec, 200)
		const t0, life = 10 * sec, 250 * ms
		_ = t0
		for _, tc := range []struct{ unspent, elapsed int64 }{{0, 0}, {5, 10 * ms}, {20, 100 * ms}, {20, life}, {3, 2 * life}} {
			a := NewState(&l)
			_, n, lived := l.LeaseTake(&a, nil, t0, Milli, 20, life)
			if n != 20 || lived != life {
				t.Fatalf("%s: LeaseTake leased %d for %dµs, want 20 for %dµs", kind, n, lived, life)
			}
			l.LeaseEnd(&a, t0+tc.elapsed, tc.unspent, life, t0)

			b := NewState(&l)
			var d Decision
			l.decide(&b, t0, Milli, true, nil, &d)
			spent, lived2 := n-tc.unspent, min(tc.elapsed, life)
			if spent > 0 || lived2 > 0 {
				l.debit(&b, nil, t0, spent*l.Unit+l.ticks(lived2), &d)
			}
			now := t0 + tc.elapsed
			pa, pb := l.Peek(&a, now, Milli), l.Peek(&b, now, Milli)
			if tc.elapsed > life {
				// The lease outlived its life: its charge drained by the
				// time it exceeded it too, at most.
				if pa.Reset > pb.Reset {
					t.Errorf("%s %+v: Reset %d after the end, want at most %d", kind, tc, pa.Reset, pb.Reset)
				}
				continue
			}
			if pa != pb {
				t.Errorf("%s %+v: after LeaseEnd %+v, want %+v (a lease of %d that lived %dµs)", kind, tc, pa, pb, spent, lived2)
			}
		}
	}
}

// TestLeaseLifeOfABucket: a bucket's lease lives no longer than the
// bucket takes to refill half of what the request leaves, so that the
// refill it is charged leaves room for a lease; a window's lives as long
// as asked (within its window).
func TestLeaseLifeOfABucket(t *testing.T) {
	for _, tc := range []struct {
		name             string
		kind             Kind
		events, w, burst int64
		life             int64
		wantN, wantLived int64 // want 1000 events
	}{
		// 999 left: 499.5 ms of refill is half; 500 events charged, 499 room.
		{"burst of a second", TokenBucket, 1000, sec, 1000, 500 * ms, 499 / 8, 499500},
		{"gcra, burst of a second", GCRA, 1000, sec, 1000, 500 * ms, 499 / 8, 499500},
		// 99 left: 49.5 ms; 50 charged, 49 room (500 ms would leave none).
		{"burst of 100 ms", TokenBucket, 1000, sec, 100, 500 * ms, 49 / 8, 49500},
		// 199 left at 100/s: 995 ms is half; 250 ms is shorter.
		{"burst of two seconds", TokenBucket, 100, sec, 200, 250 * ms, (199 - 25) / 8, 250 * ms},
		{"fixed_window", FixedWindow, 1000, 10 * sec, 0, 500 * ms, 999 / 8, 500 * ms},
	} {
		l := mustNew(t, tc.kind, tc.events, tc.w, tc.burst)
		s := NewState(&l)
		d, n, lived := l.LeaseTake(&s, nil, 10*sec, Milli, 1000, tc.life)
		if !d.Allowed || n != tc.wantN || lived != tc.wantLived {
			t.Errorf("%s: LeaseTake(life %dµs) = %+v, %d, %d; want admitted, %d for %dµs", tc.name, tc.life, d, n, lived, tc.wantN, tc.wantLived)
		}
	}
}

// TestLeaseWindowEndsWithIt: a fixed_window's lease lives no longer than
// its window, and what it gives back after the window is forgotten.
func TestLeaseWindowEndsWithIt(t *testing.T) {
	l := mustNew(t, FixedWindow, 100, sec, 0)
	s := NewState(&l)
	d, n, lived := l.LeaseTake(&s, nil, 5*sec+900*ms, Milli, 20, 250*ms)
	if n != 12 || lived != 100*ms {
		t.Fatalf("LeaseTake = %+v, %d, %d; want 12 events ((100-1)/8) for 100ms", d, n, lived)
	}
	l.LeaseEnd(&s, 6*sec+10*ms, n, lived, d.At)
	if p := l.Peek(&s, 6*sec+10*ms, Milli); p.Remaining != 100 {
		t.Fatalf("after a return in the next window: remaining %d, want 100 (a fresh window)", p.Remaining)
	}
	s = NewState(&l)
	d, n, _ = l.LeaseTake(&s, nil, 5*sec, Milli, 20, 250*ms)
	l.LeaseEnd(&s, 5*sec+10*ms, n-3, 250*ms, d.At)
	if p := l.Peek(&s, 5*sec+10*ms, Milli); p.Remaining != 96 {
		t.Fatalf("after a lease of 12 returned 9: remaining %d, want 96 (100 - 1 - 3 spent)", p.Remaining)
	}
}

// instance is one instance's lease in the simulation.
type instance struct {
	n, left, taken, life int64 // left in milli-units
}

// TestPropertyLeases runs random traces of several instances deciding
// one key from leases and directly, on one shared state under one fake
// clock: instances take leases of random sizes and lives, spend them,
// return them early, late or never (an instance that dies), and the
// admitted requests, however they were decided, must keep the
// algorithm's bound: B + r*t in any span for a bucket (not only from the
// first request), N in each window for a fixed_window.
func TestPropertyLeases(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(44, uint64(kind)))
			for range traces() {
				l := randLeaseLimit(t, rng, kind)
				admitted, leased := leaseTrace(t, rng, &l)
				if leased == 0 {
					continue
				}
				if kind == SlidingWindow {
					checkSlidingBound(t, &l, admitted)
					continue
				}
				if kind == FixedWindow {
					for start, sum := range windowSums(&l, admitted) {
						if sum > l.Capacity() {
							t.Fatalf("%s: %s admitted in the window from %s", describe(&l), events(sum), at(start))
						}
					}
					continue
				}
				checkBucketBound(t, &l, admitted)
			}
		})
	}
}

func randLeaseLimit(t *testing.T, rng *rand.Rand, kind Kind) Limit {
	t.Helper()
	n := 10 + rng.Int64N(200)
	w := []int64{100 * ms, sec, 10 * sec}[rng.IntN(3)]
	var burst int64
	if kind != FixedWindow && kind != SlidingWindow && rng.IntN(2) == 0 {
		burst = 1 + rng.Int64N(2*n)
	}
	return mustNew(t, kind, n, w, burst)
}

// leaseTrace runs one random trace of 3 instances and returns what was
// admitted, in time order, and how many leases were taken.
func leaseTrace(t *testing.T, rng *rand.Rand, l *Limit) (admitted []admission, leases int) {
	t.Helper()
	s := NewState(l)
	var in [3]instance
	now := int64(sec) + rng.Int64N(l.Window)
	for range 600 {
		now += rng.Int64N(l.Window / 20)
		i := &in[rng.IntN(len(in))]
		cost := []int64{Milli, Milli, Milli, 500, 2 * Milli}[rng.IntN(5)]
		live := i.n > 0 && now < i.taken+i.life
		switch r := rng.IntN(20); {
		case r == 0:
			*i = instance{} // it dies: its lease is never returned
			continue
		case r == 1 && i.n > 0:
			l.LeaseEnd(&s, now, i.left/Milli, i.life, i.taken)
			*i = instance{}
			continue
		}
		if live && i.left >= cost {
			i.left -= cost
			admitted = append(admitted, admission{now, cost, 0})
			continue
		}
		var d Decision
		if rng.IntN(4) == 0 {
			d = l.Take(&s, now, cost)
		} else {
			if i.n > 0 {
				l.LeaseEnd(&s, now, i.left/Milli, i.life, i.taken)
			}
			life := 1 + rng.Int64N(l.Window/2)
			var n, lived int64
			d, n, lived = l.LeaseTake(&s, nil, now, cost, 1+rng.Int64N(l.Events), life)
			*i = instance{}
			if n > 0 {
				*i = instance{n: n, left: n * Milli, taken: d.At, life: lived}
				leases++
			}
		}
		if d.Allowed {
			admitted = append(admitted, admission{now, cost, 0})
		}
	}
	return admitted, leases
}

func mustNew(t *testing.T, kind Kind, n, w, burst int64) Limit {
	t.Helper()
	l, err := NewLimit(kind, n, time.Duration(w)*time.Microsecond, burst, 0)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLeasable(t *testing.T) {
	for _, tc := range []struct {
		kind     Kind
		maxDelay int64
		want     bool
	}{
		{TokenBucket, 0, true}, {GCRA, 0, true}, {FixedWindow, 0, true},
		{LeakyBucket, 0, true}, {LeakyBucket, sec, false},
		{SlidingWindow, 0, true}, {SlidingLog, 0, false},
	} {
		l := mustNew(t, tc.kind, 10, sec, 0)
		l.MaxDelay = tc.maxDelay
		if got := l.Leasable(); got != tc.want {
			t.Errorf("%s max_delay %d: Leasable() = %v, want %v", tc.kind, tc.maxDelay, got, tc.want)
		}
	}
	c, _ := NewConcurrency(3, MinLease)
	if c.Leasable() {
		t.Error("concurrency: Leasable() = true")
	}
}

// checkSlidingBound checks the sliding_window's definition on what was
// admitted, at each admission: the previous window's count weighted by
// the part of the sliding window still over it, plus this window's, is
// at most N (as TestPropertySlidingWindow).
func checkSlidingBound(t *testing.T, l *Limit, admitted []admission) {
	t.Helper()
	limit := l.Capacity()
	sums := make(map[int64]int64)
	for _, a := range admitted {
		start := a.t - a.t%l.Window
		sums[start] += a.cost
		cur, prev, e := sums[start], sums[start-l.Window], a.t-start
		if cur > limit {
			t.Fatalf("%s: %s admitted in the window from %s", describe(l), events(cur), at(start))
		}
		if mulCmp(prev, l.Window-e, limit-cur, l.Window) > 0 {
			t.Fatalf("%s: at %s, weighted count %s * %d/%d + %s is over N", describe(l), at(a.t), events(prev), l.Window-e, l.Window, events(cur))
		}
	}
}

// TestLeaseRoomBucket: a bucket's lease takes at most an eighth of what
// the request leaves, less the refill of the lease's life: 100/s, 99
// left, a life of 100 ms (10 events) leaves 89, an eighth of it 11; a
// lease of no life is none.
func TestLeaseRoomBucket(t *testing.T) {
	l := mustLimit(t, TokenBucket, 100, time.Second, 0, 0)
	var s State
	if d, n, lived := l.LeaseTake(&s, nil, t0, Milli, 1000, 100*ms); !d.Allowed || n != 11 || lived != 100*ms {
		t.Fatalf("LeaseTake = %+v, %d, %d; want admitted, 11 leased for 100 ms", d, n, lived)
	}
	var z State
	if d, n, _ := l.LeaseTake(&z, nil, t0, Milli, 1000, 0); !d.Allowed || n != 0 {
		t.Fatalf("LeaseTake of no life = %+v, %d; want admitted, none leased", d, n)
	}
}

// TestLeaseMark: a rejection is told when the leases are back, if what
// is left with what they hold could admit it.
func TestLeaseMark(t *testing.T) {
	const at = 1_000_000
	out := LeaseMark{Back: at + 400_000, Leased: 5}
	tests := []struct {
		name string
		m    LeaseMark
		d    Decision
		need int64
		wait int64
	}{
		{"a rejection told when the leases are back", out, Decision{Wait: 60_000_000, At: at}, 1, 400_000},
		{"what the leases hold and what is left", out, Decision{Remaining: 3, Wait: 60_000_000, At: at}, 8, 400_000},
		{"more than the leases could give back", out, Decision{Remaining: 3, Wait: 60_000_000, At: at}, 9, 60_000_000},
		{"a rejection that waits less keeps its wait", out, Decision{Wait: 300_000, At: at}, 1, 300_000},
		{"leases back already tell nothing", out, Decision{Wait: 60_000_000, At: at + 400_000}, 1, 60_000_000},
		{"no lease", LeaseMark{}, Decision{Wait: 60_000_000, At: at}, 1, 60_000_000},
		{"a cost above the capacity never fits", out, Decision{Wait: Never, At: at}, 1, Never},
		{"an admission waits for nothing", out, Decision{Allowed: true, At: at}, 1, 0},
	}
	for _, tt := range tests {
		d := tt.d
		tt.m.Wait(&d, tt.need)
		if d.Wait != tt.wait {
			t.Errorf("%s: %+v.Wait(%+v, %d): Wait %d, want %d", tt.name, tt.m, tt.d, tt.need, d.Wait, tt.wait)
		}
	}

	// Leases taken while one is out add up; returns take theirs off; a
	// lease taken once every lease is back starts again.
	var m LeaseMark
	steps := []struct {
		what             string
		at, n, back      int64 // a lease taken (n > 0) or returned (n < 0)
		wantBack, wantIn int64
	}{
		{"a lease", at, 10, at + 400, at + 400, 10},
		{"another while it is out", at + 100, 6, at + 500, at + 500, 16},
		{"the first returned", 0, -10, 0, at + 500, 6},
		{"more returned than out", 0, -10, 0, at + 500, 0},
		{"one taken once all are back", at + 500, 4, at + 900, at + 900, 4},
	}
	for i, st := range steps {
		if st.n > 0 {
			m.Take(st.at, st.n, st.back)
		} else {
			m.Return(-st.n)
		}
		if m.Back != st.wantBack || m.Leased != st.wantIn {
			t.Fatalf("step %d (%s): %+v, want Back %d, Leased %d", i, st.what, m, st.wantBack, st.wantIn)
		}
	}
}

func TestLeaseNeed(t *testing.T) {
	tb, fw := mustNew(t, TokenBucket, 10, 60_000_000, 300), mustNew(t, FixedWindow, 500, 60_000_000, 0)
	for _, tt := range []struct {
		l          Limit
		cost, need int64
	}{{tb, 1000, 1}, {tb, 1500, 2}, {tb, 1, 1}, {fw, 1000, 1}, {fw, 2001, 3}, {fw, 0, 0}} {
		if got := tt.l.LeaseNeed(tt.cost); got != tt.need {
			t.Errorf("%s: LeaseNeed(%d) = %d, want %d", tt.l.Kind, tt.cost, got, tt.need)
		}
	}
}

// TestLeaseBack: a lease is back at its end plus the delay, and a window's
// no later than the window's end.
func TestLeaseBack(t *testing.T) {
	const sec = 1_000_000
	start := int64(1_767_225_600) * sec // a minute's start
	tb, fw, sw := mustNew(t, TokenBucket, 10, 60*sec, 300), mustNew(t, FixedWindow, 500, 60*sec, 0), mustNew(t, SlidingWindow, 500, 60*sec, 0)
	life, delay := int64(250_000), int64(150_000)
	tests := []struct {
		name        string
		l           Limit
		at          int64 // the lease's time
		lived, back int64
	}{
		{"token_bucket", tb, start + 59*sec, life, start + 59*sec + life + delay},
		{"fixed_window mid-window", fw, start + 10*sec, life, start + 10*sec + life + delay},
		{"fixed_window near its end", fw, start + 60*sec - 300_000, life, start + 60*sec},
		{"fixed_window's lease that ends with it", fw, start + 60*sec - 100_000, 100_000, start + 60*sec},
		{"sliding_window mid-window", sw, start + 10*sec, life, start + 10*sec + life + delay},
		{"sliding_window near its end", sw, start + 60*sec - 300_000, life, start + 60*sec},
	}
	for _, tt := range tests {
		s := NewState(&tt.l)
		d, n, lived := tt.l.LeaseTake(&s, nil, tt.at, Milli, 10, life)
		if n == 0 || lived != tt.lived {
			t.Fatalf("%s: LeaseTake at %d: %d events for %dµs, want a lease for %dµs", tt.name, tt.at, n, lived, tt.lived)
		}
		if got := tt.l.LeaseBack(&d, lived, delay); got != tt.back {
			t.Errorf("%s: LeaseBack(%+v, %d, %d) = %d, want %d", tt.name, d, lived, delay, got, tt.back)
		}
	}
}
