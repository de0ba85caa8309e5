package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

// The parity tests run the same steps through the Go algorithm (a State
// from algorithms.NewState) and through its Lua twin on a real Redis, with
// the time given by the test, and want identical Decisions at every step.

type op byte

const (
	take op = 'T'
	undo op = 'U'
	peek op = 'P'
)

// step is one call at now (µs) with cost (milli-units; peeks cost one
// event). An undo gives back what the ref-th most recent admitted take
// charged (0: the last one).
type step struct {
	op   op
	now  int64
	cost int64
	ref  int
}

func (s step) String() string {
	switch s.op {
	case take:
		return fmt.Sprintf("Take(now=%d, cost=%d)", s.now, s.cost)
	case undo:
		return fmt.Sprintf("Undo(now=%d, cost=%d, take -%d)", s.now, s.cost, s.ref)
	}
	return fmt.Sprintf("Peek(now=%d)", s.now)
}

const (
	ms  = int64(time.Millisecond / time.Microsecond)
	sec = int64(time.Second / time.Microsecond)
	// epoch is a realistic server clock, so that the traces also run
	// with 16-digit times.
	epoch = int64(1_767_225_600) * sec
)

func T(now, cost int64) step { return step{take, now, cost, 0} }
func U(now, cost int64) step { return step{undo, now, cost, 0} }
func P(now int64) step       { return step{peek, now, 0, 0} }

// UL gives back what the ref-th most recent admitted take charged: an
// undo of a request from long ago.
func UL(now, cost int64, ref int) step { return step{undo, now, cost, ref} }

// repeat returns n takes of cost at now, now+dt, now+2dt...
func repeat(n int, now, dt, cost int64) []step {
	var s []step
	for i := 0; i < n; i++ {
		s = append(s, T(now+int64(i)*dt, cost))
	}
	return s
}

func concat(parts ...[]step) []step {
	var s []step
	for _, p := range parts {
		s = append(s, p...)
	}
	return s
}

type trace struct {
	name  string
	limit algorithms.Limit
	steps []step
}

func parityTraces(t *testing.T) []trace {
	lim := func(kind algorithms.Kind, events int64, window time.Duration, burst int64, maxDelay time.Duration) algorithms.Limit {
		return mustLimit(t, kind, events, window, burst, maxDelay)
	}
	// bucketSteps exercise the bucket family: a burst, refill, fractional
	// costs, a cost above capacity, undo, and a clock that runs backwards.
	bucketSteps := []step{
		P(0), T(0, 1000), T(0, 1000), T(0, 1000), T(0, 1000), P(0),
		T(1, 1000), T(333_333, 1000), T(333_334, 1000), T(333_334, 1000),
		T(500_000, 500), T(500_000, 500), T(500_001, 499), T(600_000, 1),
		T(700_000, 3001), T(700_000, 3000), T(700_000, 0),
		U(700_000, 1000), T(700_001, 1000), U(700_001, 99_000),
		T(2*sec, 3000), T(2*sec, 1),
		T(sec, 1000), // backwards
		T(2*sec+1, 1000), U(sec, 1000), P(sec),
		T(10*sec, 1500), T(10*sec, 1500), T(10*sec, 1),
		P(10 * sec), U(10*sec, 1500), P(10 * sec),
	}
	windowSteps := []step{
		P(0), T(0, 1000), T(100*ms, 1000), T(200*ms, 1000), T(300*ms, 1000),
		T(999*ms, 500), P(999 * ms),
		T(sec, 1000), T(sec+100*ms, 2000), T(sec+100*ms, 1), T(sec+500*ms, 1000),
		T(sec+900*ms, 1000), T(1999*ms, 1000),
		T(500*ms, 1000), // backwards into the previous window
		U(sec+950*ms, 1000), T(sec+950*ms, 1000), T(sec+950*ms, 1000),
		T(2*sec, 1000), U(2*sec+1, 1000), // undo after a rollover
		T(2*sec+250*ms, 3000), T(2*sec+250*ms, 1500), T(2*sec+750*ms, 250),
		T(2*sec+750*ms, 3001), T(2*sec+750*ms, 0),
		T(5*sec, 1000), // a gap of more than a window
		T(5*sec+1, 999), T(5*sec+2, 1), T(5*sec+3, 1), P(5*sec + 3),
		U(5*sec+4, 10_000), P(5*sec + 4),
		T(20*sec, 0), P(20 * sec),
	}
	logSteps := []step{
		P(0), T(0, 1000), T(100*ms, 2000), T(200*ms, 1),
		T(999*ms, 1000), T(sec, 1000), T(sec, 1500), T(sec+100*ms, 1000),
		T(sec+100*ms, 3000), T(sec+100*ms, 3001), P(sec + 100*ms),
		U(sec+100*ms, 1000), T(sec+150*ms, 500), T(sec+150*ms, 500),
		T(sec, 1000), // backwards
		T(5*sec, 3000), U(5*sec, 2000), T(5*sec+1, 2000), T(5*sec+2, 1000),
		T(6*sec, 0), P(6 * sec), T(6*sec+1, 1000), U(8*sec, 1000), P(8 * sec),
	}
	shapeSteps := concat(
		[]step{P(0)},
		repeat(8, 0, 0, 1000),
		[]step{P(0), U(0, 1000), T(0, 1000), T(0, 1000)},
		repeat(6, 250*ms, 50*ms, 1000),
		[]step{T(300*ms, 4001), T(300*ms, 4000), T(300*ms, 500)},
		[]step{T(100*ms, 1000), U(100*ms, 2000), T(10*sec, 2500), P(10 * sec)},
	)
	// Values at the edges of what NewLimit allows: events 2^40 over 2^50
	// µs, costs near 2^50, the sliding-window weight's float products
	// far above 2^53.
	huge := time.Duration(algorithms.MaxSpan) * time.Microsecond
	bigCap := int64(1<<40) * 1000
	hugeSteps := []step{
		T(0, bigCap/3), T(1, bigCap/3), T(1<<49, bigCap/3+7), T(1<<49+1, bigCap),
		T(1<<50-1, bigCap-1), T(1<<50, 123_456_789_012), T(3<<49, bigCap/2), P(3 << 49),
		T(1<<51+12345, bigCap/5*4+1), T(1<<51+99999, bigCap/4), P(1<<51 + 99999),
	}
	// A long log: 2500 events in one take (more than one RPUSH batch),
	// then entries one by one, then half of them expire at once.
	longLog := concat(
		[]step{T(0, 2500*1000), T(1, 1000), U(2, 1000)},
		repeat(400, 10*sec, 1000, 1000),
		[]step{T(10*sec+200_000, 1000), T(60*sec+10*sec+100_000, 1000), P(70*sec + 100_000)},
		[]step{T(70*sec+100_500, 2000*1000), T(70*sec+100_500, 1900*1000), P(70*sec + 100_600)},
	)

	var traces []trace
	for _, k := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.LeakyBucket} {
		traces = append(traces,
			trace{k.String() + "/3per1s", lim(k, 3, time.Second, 0, 0), bucketSteps},
			trace{k.String() + "/2per1s_burst5", lim(k, 2, time.Second, 5, 0), bucketSteps},
			trace{k.String() + "/7per1s_odd_unit", lim(k, 7, time.Second, 0, 0), bucketSteps},
			trace{k.String() + "/huge", lim(k, 1<<40, huge, 0, 0), hugeSteps},
		)
	}
	traces = append(traces,
		trace{"leaky_bucket/shaping", lim(algorithms.LeakyBucket, 4, time.Second, 0, 500*time.Millisecond), shapeSteps},
		trace{"leaky_bucket/shaping_bucket_steps", lim(algorithms.LeakyBucket, 3, time.Second, 0, 2*time.Second), bucketSteps},
		trace{"leaky_bucket/shaping_huge", lim(algorithms.LeakyBucket, 1<<40, huge, 0, huge), hugeSteps},
	)
	for _, k := range []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindow} {
		traces = append(traces,
			trace{k.String() + "/3per1s", lim(k, 3, time.Second, 0, 0), windowSteps},
			trace{k.String() + "/4per1s", lim(k, 4, time.Second, 0, 0), windowSteps},
			trace{k.String() + "/huge", lim(k, 1<<40, huge, 0, 0), hugeSteps},
		)
	}
	// The floor of the weight admitted 249µs early here: 4 events in the
	// previous window weigh 3500.996 milli-events at 124751µs into the
	// next, and a request of 0.5 passed (TestSlidingWindow).
	exactSteps := []step{T(750*ms, 4000), P(sec + 124_751), T(sec+124_751, 500), T(sec+124_999, 500), T(sec+125_000, 500)}
	// Give-backs of takes from windows ago, and of shaped requests with
	// others queued behind them.
	lateSteps := []step{
		T(0, 1000), T(100*ms, 1000), T(1200*ms, 1000), UL(1300*ms, 1000, 2), T(1300*ms, 1000),
		T(1300*ms, 1000), UL(2500*ms, 1000, 1), T(2600*ms, 1000), UL(2600*ms, 1000, 0), P(2600 * ms),
		T(5*sec, 2000), T(5*sec, 1000), T(5*sec, 1000), UL(5200*ms, 1000, 1), T(5200*ms, 1000), P(5200 * ms),
	}
	traces = append(traces,
		trace{"sliding_window/exact_weight", lim(algorithms.SlidingWindow, 4, time.Second, 0, 0), exactSteps},
		trace{"sliding_window/late_undo", lim(algorithms.SlidingWindow, 3, time.Second, 0, 0), lateSteps},
		trace{"fixed_window/late_undo", lim(algorithms.FixedWindow, 3, time.Second, 0, 0), lateSteps},
		trace{"sliding_log/late_undo", lim(algorithms.SlidingLog, 3, time.Second, 0, 0), lateSteps},
		trace{"token_bucket/late_undo", lim(algorithms.TokenBucket, 3, time.Second, 0, 0), lateSteps},
		trace{"gcra/late_undo_fast", lim(algorithms.GCRA, 300_000, time.Second, 0, 0), lateSteps},
		trace{"leaky_bucket/shaping_late_undo", lim(algorithms.LeakyBucket, 2, time.Second, 0, 2*time.Second), lateSteps},
		trace{"token_bucket/300000per1s", lim(algorithms.TokenBucket, 300_000, time.Second, 0, 0), concat(repeat(400, 0, 1, 1000), bucketSteps)},
		trace{"sliding_window/7per700ms", lim(algorithms.SlidingWindow, 7, 700*time.Millisecond, 0, 0), windowSteps},
		trace{"sliding_log/3per1s", lim(algorithms.SlidingLog, 3, time.Second, 0, 0), logSteps},
		trace{"sliding_log/1per1s", lim(algorithms.SlidingLog, 1, time.Second, 0, 0), logSteps},
		trace{"sliding_log/windowsteps", lim(algorithms.SlidingLog, 4, time.Second, 0, 0), windowSteps},
		trace{"sliding_log/2500per60s", lim(algorithms.SlidingLog, 2500, time.Minute, 0, 0), longLog},
		trace{"token_bucket/2500per60s", lim(algorithms.TokenBucket, 2500, time.Minute, 0, 0), longLog},
		// The zero Limit admits nothing (but cost 0).
		trace{"zero_limit", algorithms.Limit{}, []step{P(0), T(0, 1000), P(0), T(0, 0), P(0), T(1, 1), U(1, 1000), P(1)}},
	)
	return traces
}

// tally counts the kinds of decisions a trace made, to show that it
// covers them; granted counts the peeks that told a grant.
type tally struct{ allowed, delayed, rejected, never, absent, granted int }

// runParity runs steps through l in Go and through the zone's script, and
// reports the first step where they differ.
func runParity(t *testing.T, zl storage.Limiter, key string, l algorithms.Limit, steps []step, checkTTL func(step) error) tally {
	t.Helper()
	var n tally
	ctx := context.Background()
	state := algorithms.NewState(&l)
	var admitted []algorithms.Decision
	for i, st := range steps {
		switch st.op {
		case take:
			want := l.Take(&state, st.now, st.cost)
			got, err := zl.Take(ctx, key, st.now, st.cost)
			if err != nil {
				t.Fatalf("step %d: %v: %v", i, st, err)
			}
			if got != want {
				t.Fatalf("step %d: %v = %+v, want %+v (Go)", i, st, got, want)
			}
			if got.Allowed {
				admitted = append(admitted, got)
			}
			switch {
			case got.Delay > 0:
				n.delayed++
			case got.Allowed:
				n.allowed++
			case got.Wait == algorithms.Never:
				n.never++
			default:
				n.rejected++
			}
		case undo:
			var taken algorithms.Decision
			if k := len(admitted) - 1 - st.ref; k >= 0 {
				taken = admitted[k]
			}
			l.Undo(&state, st.now, st.cost, taken)
			if err := zl.Undo(ctx, key, st.now, st.cost, taken); err != nil {
				t.Fatalf("step %d: %v: %v", i, st, err)
			}
		case peek:
			c := copyState(state)
			want := l.Peek(&c, st.now, algorithms.Milli)
			got, ok, err := zl.Peek(ctx, key, st.now)
			if err != nil {
				t.Fatalf("step %d: %v: %v", i, st, err)
			}
			if !ok {
				n.absent++
				// Redis holds no key: the Go state must decide as a
				// fresh one does.
				fresh := algorithms.NewState(&l)
				got = l.Peek(&fresh, st.now, algorithms.Milli)
			}
			if got != want {
				t.Fatalf("step %d: %v = %+v (ok=%v), want %+v (Go)", i, st, got, ok, want)
			}
		}
		if checkTTL != nil {
			if err := checkTTL(st); err != nil {
				t.Fatalf("step %d: %v: %v", i, st, err)
			}
		}
	}
	return n
}

// TestParityTraces runs the traces through EVALSHA of the scripts and
// FCALL of the library's functions.
func TestParityTraces(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	for _, mode := range []string{"evalsha", "fcall"} {
		s := newTestStore(c)
		if mode == "fcall" {
			withFunctions(t, s)
		}
		t.Run(mode, func(t *testing.T) { parityTraces1(t, c, s, mode) })
	}
}

func parityTraces1(t *testing.T, c *goredis.Client, s *Store, mode string) {
	for _, tr := range parityTraces(t) {
		for _, base := range []int64{0, epoch} {
			t.Run(fmt.Sprintf("%s/base=%d", tr.name, base), func(t *testing.T) {
				name := fmt.Sprintf("%s-%s@%d", mode, tr.name, base)
				zl := zoneOf(s, name, tr.limit)
				key := "k"
				rkey := s.Key(name, tr.limit.Kind, key)
				steps := make([]step, len(tr.steps))
				for i, st := range tr.steps {
					st.now += base
					steps[i] = st
				}
				// Every key Redis holds has a TTL.
				checkTTL := func(step) error {
					if v := pttl(t, c, rkey); v == -1 {
						return fmt.Errorf("key %s has no TTL", rkey)
					}
					return nil
				}
				runParity(t, zl, key, tr.limit, steps, checkTTL)
			})
		}
	}
}

// TestParityRandom runs seeded random steps (forward, still and backward
// clocks, all kinds of costs, undo and peek) for every algorithm, through
// EVALSHA of the scripts and FCALL of the library's functions.
func TestParityRandom(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []string{"evalsha", "fcall"} {
		s := newTestStore(srv.Client())
		if mode == "fcall" {
			withFunctions(t, s)
		}
		t.Run(mode, func(t *testing.T) { parityRandom(t, s, mode) })
	}
}

func parityRandom(t *testing.T, s *Store, mode string) {
	n := 6000 // per algorithm
	if testing.Short() {
		n = 600
	}
	windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 13 * time.Second, time.Hour}
	for kind := algorithms.TokenBucket; kind <= algorithms.LeakyBucket; kind++ {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(kind), 42))
			const configs = 12
			for ci := 0; ci < configs; ci++ {
				window := windows[rng.IntN(len(windows))]
				events := 1 + rng.Int64N(min(20, window.Microseconds()))
				if kind != algorithms.SlidingLog && rng.IntN(5) == 0 {
					// Large numbers: up to 2^40 events over up to 2^50 µs.
					window = time.Duration(1+rng.Int64N(algorithms.MaxSpan)) * time.Microsecond
					events = 1 + rng.Int64N(min(algorithms.MaxEvents, window.Microseconds()))
				}
				var burst int64
				var maxDelay time.Duration
				if kind == algorithms.TokenBucket || kind == algorithms.GCRA || kind == algorithms.LeakyBucket {
					if rng.IntN(2) == 0 {
						burst = 1 + rng.Int64N(min(2*events, algorithms.MaxEvents))
					}
				}
				if kind == algorithms.LeakyBucket && rng.IntN(2) == 0 {
					maxDelay = time.Duration(rng.Int64N(int64(2 * window)))
				}
				l, err := algorithms.NewLimit(kind, events, window, burst, maxDelay)
				if err != nil {
					continue // a random burst too long to refill, or the like
				}
				steps := randomSteps(rng, &l, n/configs, rng.IntN(2) == 0)
				name := fmt.Sprintf("%s-random-%s-%d", mode, kind, ci)
				n := runParity(t, zoneOf(s, name, l), "k", l, steps, nil)
				t.Logf("%s (events=%d window=%s burst=%d max_delay=%s): %d steps: %+v",
					name, events, window, l.Burst, maxDelay, len(steps), n)
			}
		})
	}
}

func randomSteps(rng *rand.Rand, l *algorithms.Limit, n int, atEpoch bool) []step {
	now := int64(rng.IntN(1000))
	if atEpoch {
		now += epoch
	}
	w := l.Window
	capacity := l.Capacity()
	var last int64 = algorithms.Milli
	steps := make([]step, 0, n)
	for len(steps) < n {
		switch r := rng.IntN(100); {
		case r < 20:
			// the same µs
		case r < 60:
			now += rng.Int64N(l.Unit + 1)
		case r < 75:
			now += rng.Int64N(w/4 + 1)
		case r < 85:
			now -= rng.Int64N(w/2 + 1) // backwards
			now = max(now, 0)
		case r < 95:
			now += rng.Int64N(3*w + 1)
		default:
			now += w - now%w // exactly at a window boundary
		}
		// Real clocks read about 2^50.6 µs; keep the walk below 2^52 so
		// that now + 2 * MaxSpan stays exact in doubles, as it does for
		// a real clock until the 23rd century.
		now = min(now, 1<<52)
		cost := randomCost(rng, capacity)
		switch r := rng.IntN(100); {
		case r < 80:
			steps = append(steps, T(now, cost))
			if cost <= capacity {
				last = cost
			}
		case r < 90:
			switch rng.IntN(5) {
			case 0:
				steps = append(steps, U(now, rng.Int64N(3*capacity+2000))) // more than any Take charged
			case 1:
				steps = append(steps, UL(now, rng.Int64N(last+1), rng.IntN(6))) // a take from long ago
			default:
				steps = append(steps, U(now, rng.Int64N(last+1)))
			}
		default:
			steps = append(steps, P(now))
		}
	}
	return steps
}

// randomCost draws a request cost in milli-units for the random traces:
// mostly one event, with fractions, zero, the exact capacity and costs
// above it mixed in.
func randomCost(rng *rand.Rand, capacity int64) int64 {
	switch r := rng.IntN(100); {
	case r < 50:
		return algorithms.Milli
	case r < 65:
		return rng.Int64N(capacity + 1)
	case r < 74:
		return 1 + rng.Int64N(algorithms.Milli-1)
	case r < 81:
		return capacity
	case r < 87:
		return capacity + 1 + rng.Int64N(2000)
	case r < 91:
		return 0
	default:
		return rng.Int64N(3*algorithms.Milli + 1)
	}
}
