package algorithms

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"
)

// The property tests run random, seeded traces (monotonic times, random
// costs including fractions and costs above the capacity, some requests
// undone at once) and check the definitions directly: the contract's bound
// for each family, and that every Decision says exactly what the state then
// does.

// traces is how many random traces each property runs: fewer with -short,
// under the race detector (see raceOn) or for mutation testing (see
// mutationOn).
func traces() int {
	if testing.Short() || raceOn || mutationOn {
		return 30
	}
	return 300
}

// windowChoices are the windows random limits use, with their largest events.
var windowChoices = []struct{ w, maxN int64 }{
	{1, 1}, {7, 7}, {1000, 12}, {333_333, 12}, {sec, 12}, {60 * sec, 12},
}

// randLimit returns a random valid limit of kind; bucket kinds get a random
// burst, and leaky_bucket a max_delay when shaping.
func randLimit(t *testing.T, rng *rand.Rand, kind Kind, shaping bool) Limit {
	t.Helper()
	w := windowChoices[rng.IntN(len(windowChoices))]
	n := 1 + rng.Int64N(w.maxN)
	var burst int64
	var maxDelay time.Duration
	if kind == TokenBucket || kind == GCRA || kind == LeakyBucket {
		if rng.IntN(2) == 0 {
			burst = 1 + rng.Int64N(3*n)
		}
	}
	if shaping {
		maxDelay = time.Duration(1+rng.Int64N(3*w.w)) * time.Microsecond
	}
	return mustLimit(t, kind, n, time.Duration(w.w)*time.Microsecond, burst, maxDelay)
}

// request is one step of a trace.
type request struct {
	t, cost int64
	undo    bool // give the cost back at once if admitted
}

// randTrace returns n requests with monotonic times, starting at a random
// offset from t0 so that they straddle window starts in every way.
func randTrace(rng *rand.Rand, l *Limit, n int) []request {
	tr := make([]request, n)
	now := t0 + rng.Int64N(l.Window)
	capacity := l.Capacity()
	for i := range tr {
		switch r := rng.IntN(10); {
		case r < 3: // the same instant
		case r < 6:
			now += rng.Int64N(l.Unit + 1)
		case r < 9:
			now += rng.Int64N(l.Window + 1)
		default:
			now += rng.Int64N(3*l.Window + 1)
		}
		var cost int64
		switch r := rng.IntN(20); {
		case r < 9:
			cost = Milli
		case r < 13:
			cost = rng.Int64N(2*Milli + 1)
		case r < 15:
			cost = Milli / 2
		case r < 17:
			cost = rng.Int64N(capacity + 1)
		case r < 18:
			cost = 0
		case r < 19:
			cost = capacity
		default:
			cost = capacity + 1 + rng.Int64N(Milli)
		}
		tr[i] = request{t: now, cost: cost, undo: rng.IntN(20) == 0}
	}
	return tr
}

// admission is a request a trace admitted.
type admission struct {
	t, cost, delay int64
}

// replay runs tr against l from a fresh state, checking every decision
// with checkDecision, and returns what was admitted (minus what was undone).
func replay(t *testing.T, l *Limit, tr []request) []admission {
	t.Helper()
	s := NewState(l)
	var admitted []admission
	for i, r := range tr {
		before := clone(s)
		d := l.Take(&s, r.t, r.cost)
		checkDecision(t, i, l, before, s, r.t, r.cost, d)
		if !d.Allowed {
			continue
		}
		if r.undo {
			l.Undo(&s, r.t, r.cost, d)
			continue
		}
		admitted = append(admitted, admission{r.t, r.cost, d.Delay})
	}
	return admitted
}

// checkDecision checks d, the decision of Take(now, cost) on before that
// left after, against its definition: ranges, Peek agreeing with Take,
// Wait exactly the time until the request would be admitted, Reset exactly
// the time until the state is fresh, and Remaining exactly the whole events
// that could be taken now.
func checkDecision(t *testing.T, i int, l *Limit, before, after State, now, cost int64, d Decision) {
	t.Helper()
	call := fmt.Sprintf("step %d: %s: Take(%s, %s) = %+v", i, describe(l), at(now), events(cost), d)
	capacity := l.Capacity()
	g := clone(after)
	granted := l.Granted(&g, now) / Milli // whole events a grant adds to Remaining
	switch {
	case d.Remaining < 0 || d.Remaining > l.Burst+granted || d.Reset < 0 || d.Delay < 0 || d.Delay > l.MaxDelay:
		t.Fatalf("%s: out of range", call)
	case cost > capacity && (d.Allowed || d.Wait != Never):
		t.Fatalf("%s: want rejected with Wait Never, above the capacity %s", call, events(capacity))
	case cost <= capacity && d.Allowed && d.Wait != 0:
		t.Fatalf("%s: allowed, want Wait 0", call)
	case cost <= capacity && !d.Allowed && d.Wait <= 0:
		t.Fatalf("%s: rejected, want Wait > 0", call)
	}

	// Peek decides as Take does. A rejected Take charges nothing, so the
	// two agree entirely; an admitted one differs only in that Peek's
	// Remaining and Reset describe the state before the charge.
	p := clone(before)
	pd := l.Peek(&p, now, cost)
	if !d.Allowed && pd != d || pd.Allowed != d.Allowed || pd.Wait != d.Wait || pd.Delay != d.Delay {
		t.Fatalf("%s, but Peek = %+v", call, pd)
	}
	if d.Allowed && pd != l.Peek(&p, now, cost) {
		t.Fatalf("%s: Peek twice decides differently", call)
	}

	if !d.Allowed && d.Wait > 0 {
		c := clone(before)
		if w := l.Peek(&c, now+d.Wait-1, cost); w.Allowed {
			t.Fatalf("%s: but Peek %dµs later = %+v, admitted before Wait", call, d.Wait-1, w)
		}
		c = clone(before)
		if w := l.Peek(&c, now+d.Wait, cost); !w.Allowed {
			t.Fatalf("%s: but Peek Wait later = %+v, want admitted", call, w)
		}
	}

	c := clone(after)
	if !l.Fresh(&c, now+d.Reset) {
		t.Fatalf("%s: not fresh Reset later", call)
	}
	if d.Reset > 0 {
		c = clone(after)
		if l.Fresh(&c, now+d.Reset-1) {
			t.Fatalf("%s: fresh %dµs later, before Reset", call, d.Reset-1)
		}
	}

	// Remaining whole events can be taken now, without delay, and one more
	// cannot. (A shaping leaky bucket that is queueing reports 0; with a
	// grant, Remaining may pass what one request can take, the capacity.)
	// A sliding_log whose grant has ended may hold more entries than its
	// events, until they leave the window (see logNow): it then refuses
	// even a request of no cost.
	overfull := l.Kind == SlidingLog && after.Level > l.Events+granted
	c = clone(after)
	if r := l.Take(&c, now, min(d.Remaining, l.Burst)*Milli); !overfull && (!r.Allowed || d.Remaining > 0 && r.Delay != 0) {
		t.Fatalf("%s: but Take(Remaining = %d) = %+v", call, d.Remaining, r)
	}
	if more := (d.Remaining + 1) * Milli; more <= capacity {
		c = clone(after)
		if r := l.Peek(&c, now, more); r.Allowed && r.Delay == 0 {
			t.Fatalf("%s: but Remaining + 1 = %d events are admitted: %+v", call, d.Remaining+1, r)
		}
	}
}

func describe(l *Limit) string {
	s := fmt.Sprintf("%s %d/%dµs", l.Kind, l.Events, l.Window)
	if l.Burst != l.Events {
		s += fmt.Sprintf(" burst %d", l.Burst)
	}
	if l.MaxDelay > 0 {
		s += fmt.Sprintf(" max_delay %dµs", l.MaxDelay)
	}
	return s
}

// checkBucketBound checks that in any span [a, b] of release times
// (admission plus delay), the admitted cost is at most B + r(b - a):
// cost * W <= (B * W + N * (b - a)) * 1000. A limit with sub-µs ticks
// rounds a delay up to the µs, so its release times are known to a µs.
func checkBucketBound(t *testing.T, l *Limit, admitted []admission) {
	t.Helper()
	sum := make([]int64, len(admitted)+1) // sum[j] - sum[i]: cost of admitted[i:j]
	for i, a := range admitted {
		sum[i+1] = sum[i] + a.cost
		if i > 0 && a.t+a.delay < admitted[i-1].t+admitted[i-1].delay {
			t.Fatalf("%s: admission %d released at %s, before admission %d", describe(l), i, at(a.t+a.delay), i-1)
		}
	}
	for i := range admitted {
		for j := i; j < len(admitted); j++ {
			span := admitted[j].t + admitted[j].delay - admitted[i].t - admitted[i].delay
			if l.Scale > 1 && admitted[i].delay > 0 {
				span++
			}
			cost := sum[j+1] - sum[i]
			if cost*l.Window > (l.Burst*l.Window+l.Events*span)*Milli {
				t.Fatalf("%s: %s admitted in %dµs from %s, more than B + r*T", describe(l), events(cost), span, at(admitted[i].t))
			}
		}
	}
}

func TestPropertyBucket(t *testing.T) {
	tests := []struct {
		kind    Kind
		shaping bool
	}{
		{TokenBucket, false},
		{GCRA, false},
		{LeakyBucket, false},
		{LeakyBucket, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("alg=%s/shaping=%t", tt.kind, tt.shaping), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tt.kind)))
			for range traces() {
				l := randLimit(t, rng, tt.kind, tt.shaping)
				checkBucketBound(t, &l, replay(t, &l, randTrace(rng, &l, 200)))
			}
		})
	}
}

// TestPropertySlidingLog: no more than N events in any (t - W, t]; a
// fractional cost counts as its whole events rounded up.
func TestPropertySlidingLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 0))
	for range traces() {
		l := randLimit(t, rng, SlidingLog, false)
		admitted := replay(t, &l, randTrace(rng, &l, 200))
		i := 0
		var n int64
		for j, a := range admitted {
			n += ceilDiv(a.cost, Milli)
			for admitted[i].t <= a.t-l.Window {
				n -= ceilDiv(admitted[i].cost, Milli)
				i++
			}
			if n > l.Events {
				t.Fatalf("%s: %d events admitted in (%s, %s] (admissions %d to %d)", describe(&l), n, at(a.t-l.Window), at(a.t), i, j)
			}
		}
	}
}

// windowSums returns the cost admitted in each aligned window, by start.
func windowSums(l *Limit, admitted []admission) map[int64]int64 {
	sums := make(map[int64]int64)
	for _, a := range admitted {
		sums[a.t-a.t%l.Window] += a.cost
	}
	return sums
}

// TestPropertyFixedWindow: at most N in any aligned window, and so at most
// 2N in any span of W.
func TestPropertyFixedWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 0))
	for range traces() {
		l := randLimit(t, rng, FixedWindow, false)
		admitted := replay(t, &l, randTrace(rng, &l, 200))
		for start, sum := range windowSums(&l, admitted) {
			if sum > l.Capacity() {
				t.Fatalf("%s: %s admitted in the window from %s", describe(&l), events(sum), at(start))
			}
		}
		i := 0
		var sum int64
		for _, a := range admitted {
			sum += a.cost
			for admitted[i].t <= a.t-l.Window {
				sum -= admitted[i].cost
				i++
			}
			if sum > 2*l.Capacity() {
				t.Fatalf("%s: %s admitted in (%s, %s]", describe(&l), events(sum), at(a.t-l.Window), at(a.t))
			}
		}
	}
}

// TestFixedWindowBoundaryBurst: the known weakness of fixed windows, 2N in
// a span of W straddling a window start, does occur, and no more.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	l := mustLimit(t, FixedWindow, 10, time.Minute, 0, 0)
	s := NewState(&l)
	boundary := t0 + 60*sec
	var admitted []int64
	for now := boundary - 30*sec; now < boundary+30*sec; now += 100 * ms {
		if l.Take(&s, now, Milli).Allowed {
			admitted = append(admitted, now)
		}
	}
	if int64(len(admitted)) != 2*l.Events {
		t.Fatalf("%d events admitted in the minute around a window start, want 2N = %d", len(admitted), 2*l.Events)
	}
	first, last := admitted[0], admitted[len(admitted)-1]
	if first >= boundary || last < boundary || last-first >= l.Window {
		t.Errorf("2N admitted from %s to %s, want them within W = 60s across the start at %s", at(first), at(last), at(boundary))
	}
}

// TestPropertySlidingWindow: at most N within any aligned window, and at
// every admission prev * (W - e) / W + cur <= N, in exact arithmetic.
func TestPropertySlidingWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 0))
	for range traces() {
		l := randLimit(t, rng, SlidingWindow, false)
		admitted := replay(t, &l, randTrace(rng, &l, 200))
		limit := l.Capacity()
		sums := make(map[int64]int64)
		for _, a := range admitted {
			start := a.t - a.t%l.Window
			sums[start] += a.cost
			cur, prev, e := sums[start], sums[start-l.Window], a.t-start
			if cur > limit {
				t.Fatalf("%s: %s admitted in the window from %s", describe(&l), events(cur), at(start))
			}
			if mulCmp(prev, l.Window-e, limit-cur, l.Window) > 0 {
				t.Fatalf("%s: at %s, weighted count %s * %d/%d + %s is over N", describe(&l), at(a.t), events(prev), l.Window-e, l.Window, events(cur))
			}
		}
	}
}

// TestPropertyGCRAIsTokenBucket: gcra and token_bucket decide alike on every
// monotonic trace, Undo included.
func TestPropertyGCRAIsTokenBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 0))
	for range traces() {
		tb := randLimit(t, rng, TokenBucket, false)
		gcra := tb
		gcra.Kind = GCRA
		var ts, gs State
		for i, r := range randTrace(rng, &tb, 300) {
			td := tb.Take(&ts, r.t, r.cost)
			gd := gcra.Take(&gs, r.t, r.cost)
			if td != gd {
				t.Fatalf("step %d: %s: Take(%s, %s) = %+v, but gcra = %+v", i, describe(&tb), at(r.t), events(r.cost), td, gd)
			}
			if td.Allowed && r.undo {
				tb.Undo(&ts, r.t, r.cost, td)
				gcra.Undo(&gs, r.t, r.cost, gd)
			}
			if tf, gf := tb.Fresh(&ts, r.t), gcra.Fresh(&gs, r.t); tf != gf {
				t.Fatalf("step %d: %s: Fresh(%s) = %t, but gcra = %t", i, describe(&tb), at(r.t), tf, gf)
			}
		}
	}
}

// TestPropertyUndo: taking a request and undoing it at once leaves the
// decisions as if it had never come.
func TestPropertyUndo(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 0))
	for _, kind := range allKinds {
		t.Run("alg="+kind.String(), func(t *testing.T) {
			for range traces() / 3 {
				l := randLimit(t, rng, kind, kind == LeakyBucket && rng.IntN(2) == 0)
				with, without := NewState(&l), NewState(&l)
				for i, r := range randTrace(rng, &l, 100) {
					if r.undo {
						if d := l.Take(&with, r.t, r.cost); d.Allowed {
							l.Undo(&with, r.t, r.cost, d)
						}
						continue
					}
					wd, od := l.Take(&with, r.t, r.cost), l.Take(&without, r.t, r.cost)
					if wd != od {
						t.Fatalf("step %d: %s: Take(%s, %s) = %+v after undone requests, want %+v", i, describe(&l), at(r.t), events(r.cost), wd, od)
					}
				}
			}
		})
	}
}

// randLargeLimit returns a random valid limit of kind whose events and
// window are drawn on a log scale up to their bounds (MaxEvents,
// MaxSpan), so that the products a decision compares pass 2^64; a
// sliding_log's events stay few, as its log holds one time per event.
func randLargeLimit(t *testing.T, rng *rand.Rand, kind Kind) Limit {
	t.Helper()
	logScale := func(hi int64) int64 {
		b := rng.IntN(bits.Len64(uint64(hi)))
		return min(hi, int64(1)<<b+rng.Int64N(int64(1)<<b))
	}
	for {
		w := logScale(MaxSpan)
		n := logScale(min(w, MaxEvents))
		if kind == SlidingLog {
			n = 1 + rng.Int64N(min(w, 12))
		}
		var burst int64
		if kind == TokenBucket || kind == GCRA || kind == LeakyBucket {
			if rng.IntN(2) == 0 {
				burst = 1 + rng.Int64N(min(3*n, MaxEvents))
			}
		}
		if l, err := NewLimit(kind, n, time.Duration(w)*time.Microsecond, burst, 0); err == nil {
			return l
		}
	}
}

// TestPropertyDecisionsExact: every decision is exact by checkDecision's
// definitions (Wait, Reset and Remaining against what Peek decides later
// and now) for limits up to the bounds (randLargeLimit) and, for the
// kinds that take grants, with grants of random size given between the
// requests, the window's and the next's.
func TestPropertyDecisionsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 0))
	for _, kind := range []Kind{FixedWindow, SlidingWindow, SlidingLog, TokenBucket, GCRA, LeakyBucket} {
		t.Run("alg="+kind.String(), func(t *testing.T) {
			for range traces() {
				l := randLargeLimit(t, rng, kind)
				if rng.IntN(2) == 0 {
					l = randLimit(t, rng, kind, false)
				}
				s := NewState(&l)
				for i, r := range randTrace(rng, &l, 100) {
					if l.Grantable() && rng.IntN(8) == 0 {
						amount := rng.Int64N(3*Milli + 1)
						if rng.IntN(4) == 0 {
							amount = rng.Int64N(l.Capacity() + 1)
						}
						if _, err := l.Grant(&s, r.t, amount); err != nil {
							t.Fatal(err)
						}
					}
					before := clone(s)
					d := l.Take(&s, r.t, r.cost)
					checkDecision(t, i, &l, before, s, r.t, r.cost, d)
					if d.Allowed && r.undo {
						l.Undo(&s, r.t, r.cost, d)
					}
				}
			}
		})
	}
}

// FuzzTake runs any limit NewLimit accepts over a sequence of operations,
// with times jumping forwards and backwards, and checks that nothing panics
// and every Decision is in range.
//
// ops is read 4 bytes at a time: the operation and the scale of the time
// step, the time step (its sign from the first byte), and the cost.
func FuzzTake(f *testing.F) {
	f.Add(uint8(TokenBucket), int64(10), int64(sec), int64(50), int64(0), t0, []byte{0, 0, 100, 100, 4, 1, 0, 253, 0x81, 0, 10, 250})
	f.Add(uint8(GCRA), int64(3), int64(sec), int64(0), int64(0), t0, []byte{0, 0, 0, 253, 0x83, 1, 0, 251, 8, 0, 1, 120, 3, 0, 0, 0})
	f.Add(uint8(SlidingWindow), int64(4), int64(sec), int64(0), int64(0), t0+123, []byte{12, 0, 7, 200, 16, 0, 1, 252, 0x90, 0, 2, 230})
	f.Add(uint8(SlidingLog), int64(5), int64(7), int64(0), int64(0), int64(0), []byte{0, 0, 0, 250, 1, 0, 0, 49, 3, 0, 0, 0, 0x84, 0, 3, 253})
	f.Add(uint8(FixedWindow), MaxEvents, MaxSpan, int64(0), int64(0), int64(1)<<52, []byte{0, 0, 0, 250, 0, 0, 0, 251, 0x1c, 255, 255, 250})
	f.Add(uint8(LeakyBucket), int64(2), int64(sec), int64(0), int64(sec), t0, []byte{0, 0, 0, 250, 0, 0, 0, 253, 0, 0, 0, 253, 3, 0, 0, 0, 0x84, 0, 9, 240})
	f.Add(uint8(LeakyBucket), int64(1), MaxSpan, int64(0), MaxSpan, int64(0), []byte{0, 0, 0, 252, 0, 0, 0, 250, 0, 0, 0, 250, 0x9c, 255, 255, 1})
	f.Add(uint8(SlidingWindow), MaxEvents, MaxEvents, int64(0), int64(0), t0, []byte{0x14, 0, 1, 250, 0x14, 0, 1, 250, 0x94, 0, 1, 249})
	f.Fuzz(func(t *testing.T, kind uint8, n, w, burst, maxDelay, start int64, ops []byte) {
		if w > MaxSpan+1 || w < -1 || maxDelay > MaxSpan+1 || maxDelay < -1 {
			return // time.Duration(w) * time.Microsecond would wrap around
		}
		l, err := NewLimit(Kind(kind), n, time.Duration(w)*time.Microsecond, burst, time.Duration(maxDelay)*time.Microsecond)
		if err != nil {
			return
		}
		if l.Kind == SlidingLog && l.Events > 1000 && len(ops) > 64 {
			return // keep each run quick
		}
		const horizon = int64(1) << 53 // 2255: later clocks are out of scope
		now := start & (horizon/2 - 1)
		capacity := l.Capacity()
		s := NewState(&l)
		var last int64     // the cost of the last admitted Take, for Undo
		var lastD Decision // and its Decision
		for ; len(ops) >= 4; ops = ops[4:] {
			step := int64(ops[1])<<8 | int64(ops[2])
			step *= [...]int64{1, l.Unit, l.Window / 16, l.Window, l.Window * 16, 1 << 20, 1 << 30, 1 << 40}[ops[0]>>2&7]
			if ops[0]&0x80 != 0 {
				step = -step
			}
			now = min(max(now+step, 0), horizon)
			var cost int64
			switch c := int64(ops[3]); {
			case c < 200:
				cost = c * 10
			case c < 250:
				cost = (c - 200) * capacity / 50
			case c == 250:
				cost = capacity
			case c == 251:
				cost = capacity + 1
			case c == 252:
				cost = math.MaxInt64 / 4
			default:
				cost = Milli
			}
			var d Decision
			switch ops[0] & 3 {
			case 0, 1:
				d = l.Take(&s, now, cost)
				if d.Allowed {
					last, lastD = cost, d
				}
			case 2:
				d = l.Peek(&s, now, cost)
			case 3:
				l.Undo(&s, now, last, lastD)
				last = 0
				d = l.Peek(&s, now, 0)
			}
			if d.Remaining < 0 || d.Remaining > l.Burst || d.Reset < 0 || d.Wait < Never || d.Delay < 0 || d.Delay > l.MaxDelay {
				t.Fatalf("%s: at %d, cost %d: %+v out of range", describe(&l), now, cost, d)
			}
			if d.Allowed != (d.Wait == 0) {
				t.Fatalf("%s: at %d, cost %d: %+v: Allowed and Wait disagree", describe(&l), now, cost, d)
			}
			if (cost > capacity) != (d.Wait == Never) && ops[0]&3 != 3 {
				t.Fatalf("%s: at %d, cost %d: %+v: Wait Never iff cost > capacity %d", describe(&l), now, cost, d, capacity)
			}
		}
	})
}
