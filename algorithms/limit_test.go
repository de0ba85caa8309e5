package algorithms

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// The tests step through a fixed time grid. t0 is a realistic clock reading
// (2027) aligned to an hour, so that every window the tests use starts at t0.
const (
	t0  int64 = 1_800_000_000_000_000
	ms  int64 = 1000
	sec int64 = 1000 * ms
)

// allKinds is every algorithm, in declaration order.
var allKinds = []Kind{TokenBucket, GCRA, SlidingWindow, SlidingLog, FixedWindow, LeakyBucket}

// op is what a step does to the state.
type op uint8

const (
	take  op = iota // Take, checking the Decision
	peek            // Peek, checking the Decision
	undo            // Undo; want is ignored
	fresh           // Fresh; want.Allowed is the expected result
)

func (o op) String() string {
	return [...]string{"Take", "Peek", "Undo", "Fresh"}[o]
}

// step is one call on a time grid: at t, with cost in milli-units.
type step struct {
	op   op
	t    int64
	cost int64
	want Decision
}

// at names a grid time, as in "t0+1.5s".
func at(t int64) string {
	d := time.Duration(t-t0) * time.Microsecond
	if d < 0 {
		return fmt.Sprintf("t0-%s", -d)
	}
	return fmt.Sprintf("t0+%s", d)
}

// events writes a cost in milli-units as events, as in "1.5".
func events(cost int64) string {
	if cost%Milli == 0 {
		return fmt.Sprint(cost / Milli)
	}
	return strings.TrimRight(fmt.Sprintf("%d.%03d", cost/Milli, cost%Milli), "0")
}

func mustLimit(t testing.TB, kind Kind, n int64, window time.Duration, burst int64, maxDelay time.Duration) Limit {
	t.Helper()
	l, err := NewLimit(kind, n, window, burst, maxDelay)
	if err != nil {
		t.Fatalf("NewLimit(%s, %d, %s, %d, %s): %v", kind, n, window, burst, maxDelay, err)
	}
	return l
}

// run applies steps in order to a fresh state of l.
func run(t *testing.T, l Limit, steps []step) {
	t.Helper()
	s := NewState(&l)
	var taken Decision // the last admitted Take's, for Undo
	for i, st := range steps {
		var got Decision
		switch st.op {
		case take:
			got = l.Take(&s, st.t, st.cost)
			if got.Allowed {
				taken = got
			}
		case peek:
			got = l.Peek(&s, st.t, st.cost)
		case undo:
			l.Undo(&s, st.t, st.cost, taken)
			continue
		case fresh:
			if got, want := l.Fresh(&s, st.t), st.want.Allowed; got != want {
				t.Errorf("step %d: Fresh(%s) = %t, want %t", i, at(st.t), got, want)
			}
			continue
		}
		if st.want.At == 0 {
			got.At = 0 // the tables give At only where it matters
		}
		if got.Allowed != st.want.Allowed {
			t.Errorf("step %d: %s(%s, %s) = %t, want %t", i, st.op, at(st.t), events(st.cost), got.Allowed, st.want.Allowed)
		}
		if got != st.want {
			t.Errorf("step %d: %s(%s, %s) = %+v, want %+v", i, st.op, at(st.t), events(st.cost), got, st.want)
		}
	}
}

// clone returns a copy of s that shares nothing with it.
func clone(s State) State {
	if s.Log != nil {
		s.Log = append([]int64(nil), s.Log...)
	}
	return s
}

func TestNewLimit(t *testing.T) {
	tests := []struct {
		name     string
		kind     Kind
		events   int64
		window   time.Duration
		burst    int64
		maxDelay time.Duration
		want     Limit
	}{
		{"defaults", TokenBucket, 10, time.Second, 0, 0,
			Limit{Kind: TokenBucket, Events: 10, Window: sec, Burst: 10, Scale: 1, Unit: 100 * ms, Tau: sec}},
		{"burst", TokenBucket, 10, time.Second, 50, 0,
			Limit{Kind: TokenBucket, Events: 10, Window: sec, Burst: 50, Scale: 1, Unit: 100 * ms, Tau: 5 * sec}},
		{"unit rounds up", GCRA, 3, time.Second, 0, 0,
			Limit{Kind: GCRA, Events: 3, Window: sec, Burst: 3, Scale: 1, Unit: 333_334, Tau: 1_000_002}},
		{"smaller burst", LeakyBucket, 10, time.Minute, 1, 2 * time.Second,
			Limit{Kind: LeakyBucket, Events: 10, Window: 60 * sec, Burst: 1, MaxDelay: 2 * sec, Scale: 1, Unit: 6 * sec, Tau: 6 * sec}},
		{"window burst equal to events", FixedWindow, 5, time.Hour, 5, 0,
			Limit{Kind: FixedWindow, Events: 5, Window: 3600 * sec, Burst: 5, Scale: 1, Unit: 720 * sec, Tau: 3600 * sec}},
		{"one per microsecond", SlidingWindow, 1000, time.Millisecond, 0, 0,
			Limit{Kind: SlidingWindow, Events: 1000, Window: ms, Burst: 1000, Scale: 1, Unit: 1, Tau: ms}},
		{"largest log", SlidingLog, MaxLogEvents, time.Minute, 0, 0,
			Limit{Kind: SlidingLog, Events: MaxLogEvents, Window: 60 * sec, Burst: MaxLogEvents, Scale: 1, Unit: 600, Tau: 60 * sec}},
		{"largest", TokenBucket, MaxEvents, time.Duration(MaxSpan) * time.Microsecond, 0, 0,
			Limit{Kind: TokenBucket, Events: MaxEvents, Window: MaxSpan, Burst: MaxEvents, Scale: 1, Unit: 1 << 10, Tau: MaxSpan}},
		// Unit rounds up, so Tau passes MaxSpan a little: still accepted.
		{"longest window, default burst", TokenBucket, 10, time.Duration(MaxSpan) * time.Microsecond, 0, 0,
			Limit{Kind: TokenBucket, Events: 10, Window: MaxSpan, Burst: 10, Scale: 1, Unit: 112_589_990_684_263, Tau: 1_125_899_906_842_630}},
		{"longest window, largest log", SlidingLog, MaxLogEvents, time.Duration(MaxSpan) * time.Microsecond, 0, 0,
			Limit{Kind: SlidingLog, Events: MaxLogEvents, Window: MaxSpan, Burst: MaxLogEvents, Scale: 1, Unit: 11_258_999_069, Tau: 1_125_899_906_900_000}},
		{"sub-microsecond window truncated", FixedWindow, 1, 1500 * time.Nanosecond, 0, 0,
			Limit{Kind: FixedWindow, Events: 1, Window: 1, Burst: 1, Scale: 1, Unit: 1, Tau: 1}},
		// Fast rates keep the bucket's debt in ticks of 1/Scale µs, so that
		// rounding an event's refill time up costs at most 0.1%: 300000/s
		// is 3.33µs an event, 1707 ticks of 1/512µs (was 4µs: 250000/s).
		{"300000/s", TokenBucket, 300_000, time.Second, 0, 0,
			Limit{Kind: TokenBucket, Events: 300_000, Window: sec, Burst: 300_000, Scale: 512, Unit: 1707, Tau: 300_000 * 1707}},
		{"999999/s", GCRA, 999_999, time.Second, 0, 0,
			Limit{Kind: GCRA, Events: 999_999, Window: sec, Burst: 999_999, Scale: 1024, Unit: 1025, Tau: 999_999 * 1025}},
		{"exact needs no ticks", LeakyBucket, 500_000, time.Second, 0, 0,
			Limit{Kind: LeakyBucket, Events: 500_000, Window: sec, Burst: 500_000, Scale: 1, Unit: 2, Tau: sec}},
		{"1000/s is exact", TokenBucket, 1000, time.Second, 0, 0,
			Limit{Kind: TokenBucket, Events: 1000, Window: sec, Burst: 1000, Scale: 1, Unit: 1000, Tau: sec}},
		{"999/s", TokenBucket, 999, time.Second, 0, 0,
			Limit{Kind: TokenBucket, Events: 999, Window: sec, Burst: 999, Scale: 1, Unit: 1002, Tau: 999 * 1002}},
		// The edges of the tick: exactly 1000 ticks an event (7003µs / 7,
		// 1000 and a remainder) needs none finer; 9µs / 6 is exact at
		// ticks of 1/2µs, and stops there.
		{"1000 ticks and a remainder", TokenBucket, 7, 7003 * time.Microsecond, 0, 0,
			Limit{Kind: TokenBucket, Events: 7, Window: 7003, Burst: 7, Scale: 1, Unit: 1001, Tau: 7007}},
		{"exact at a finer tick", GCRA, 6, 9 * time.Microsecond, 0, 0,
			Limit{Kind: GCRA, Events: 6, Window: 9, Burst: 6, Scale: 2, Unit: 3, Tau: 18}},
		// The longest max_delay, and a burst that refills in exactly
		// MaxSpan: accepted. A fast rate's burst refills in ticks: its
		// bound is MaxSpan * Scale ticks.
		{"longest max_delay", LeakyBucket, 10, time.Second, 0, time.Duration(MaxSpan) * time.Microsecond,
			Limit{Kind: LeakyBucket, Events: 10, Window: sec, Burst: 10, MaxDelay: MaxSpan, Scale: 1, Unit: 100 * ms, Tau: sec}},
		{"burst refilling in MaxSpan", TokenBucket, 1, time.Duration(MaxSpan/2) * time.Microsecond, 2, 0,
			Limit{Kind: TokenBucket, Events: 1, Window: MaxSpan / 2, Burst: 2, Scale: 1, Unit: MaxSpan / 2, Tau: MaxSpan}},
		{"a fast rate's long burst", TokenBucket, 300_000, time.Second, 2_000_000_000, 0,
			Limit{Kind: TokenBucket, Events: 300_000, Window: sec, Burst: 2_000_000_000, Scale: 512, Unit: 1707, Tau: 2_000_000_000 * 1707}},
		{"window kinds keep µs", SlidingWindow, 300_000, time.Second, 0, 0,
			Limit{Kind: SlidingWindow, Events: 300_000, Window: sec, Burst: 300_000, Scale: 1, Unit: 4, Tau: 1_200_000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewLimit(tt.kind, tt.events, tt.window, tt.burst, tt.maxDelay)
			if err != nil {
				t.Fatalf("NewLimit(%s, %d, %s, %d, %s): %v", tt.kind, tt.events, tt.window, tt.burst, tt.maxDelay, err)
			}
			if got != tt.want {
				t.Errorf("NewLimit(%s, %d, %s, %d, %s) = %+v, want %+v", tt.kind, tt.events, tt.window, tt.burst, tt.maxDelay, got, tt.want)
			}
		})
	}
}

func TestNewLimitErrors(t *testing.T) {
	maxSpan := time.Duration(MaxSpan) * time.Microsecond
	tests := []struct {
		name     string
		kind     Kind
		events   int64
		window   time.Duration
		burst    int64
		maxDelay time.Duration
		want     string // the whole error text
	}{
		{"unknown kind", LeakyBucket + 1, 10, time.Second, 0, 0,
			"algorithm: unknown kind 6"},
		{"events 0", TokenBucket, 0, time.Second, 0, 0,
			"events: must be greater than 0, got 0"},
		{"events negative", FixedWindow, -5, time.Second, 0, 0,
			"events: must be greater than 0, got -5"},
		{"events too many", TokenBucket, MaxEvents + 1, maxSpan, 0, 0,
			"events: must be at most 1099511627776, got 1099511627777"},
		{"sliding_log events", SlidingLog, MaxLogEvents + 1, time.Hour, 0, 0,
			"events: sliding_log keeps one timestamp per event and allows at most 100000, got 100001"},
		{"window 0", TokenBucket, 10, 0, 0, 0,
			"window: must be greater than 0, got 0s"},
		{"window negative", SlidingWindow, 10, -time.Second, 0, 0,
			"window: must be greater than 0, got -1s"},
		{"window under a microsecond", GCRA, 1, 999 * time.Nanosecond, 0, 0,
			"window: must be at least 1µs, got 999ns"},
		{"window too long", FixedWindow, 10, maxSpan + time.Microsecond, 0, 0,
			"window: must be at most 312749h58m26.842624s, got 312749h58m26.842625s"},
		{"burst negative", TokenBucket, 10, time.Second, -1, 0,
			"burst: must not be negative, got -1"},
		{"burst too many", GCRA, 10, time.Second, MaxEvents + 1, 0,
			"burst: must be at most 1099511627776, got 1099511627777"},
		{"max_delay negative", LeakyBucket, 10, time.Second, 0, -time.Second,
			"max_delay: must not be negative, got -1s"},
		{"max_delay too long", LeakyBucket, 10, time.Second, 0, maxSpan + time.Microsecond,
			"max_delay: must be at most 312749h58m26.842624s, got 312749h58m26.842625s"},
		{"max_delay on token_bucket", TokenBucket, 10, time.Second, 0, time.Second,
			"max_delay: only leaky_bucket can delay requests, not token_bucket; got 1s"},
		{"max_delay on gcra", GCRA, 10, time.Second, 0, time.Millisecond,
			"max_delay: only leaky_bucket can delay requests, not gcra; got 1ms"},
		{"max_delay on sliding_window", SlidingWindow, 10, time.Second, 0, time.Second,
			"max_delay: only leaky_bucket can delay requests, not sliding_window; got 1s"},
		{"more than one per microsecond", TokenBucket, 2000, time.Millisecond, 0, 0,
			"events: 2000 per 1ms is more than one per microsecond, the finest rate Tollgate keeps per key"},
		{"more than one per microsecond, window", SlidingLog, 3, 2 * time.Microsecond, 0, 0,
			"events: 3 per 2µs is more than one per microsecond, the finest rate Tollgate keeps per key"},
		{"burst refill overflows", TokenBucket, 1, maxSpan, 2, 0,
			"burst: 2 events of 312749h58m26.842624s each take longer than 312749h58m26.842624s to refill"},
		{"burst refill overflows int64", LeakyBucket, 1, maxSpan, MaxEvents, 0,
			"burst: 1099511627776 events of 312749h58m26.842624s each take longer than 312749h58m26.842624s to refill"},
		{"burst refill overflows, longest window", TokenBucket, 10, maxSpan, 11, 0,
			"burst: 11 events of 31274h59m50.684263s each take longer than 312749h58m26.842624s to refill"},
		{"burst on fixed_window", FixedWindow, 10, time.Second, 20, 0,
			"burst: fixed_window has no bucket; its capacity is events (10), got burst 20"},
		{"burst on sliding_window", SlidingWindow, 10, time.Second, 5, 0,
			"burst: sliding_window has no bucket; its capacity is events (10), got burst 5"},
		{"burst on sliding_log", SlidingLog, 10, time.Second, 11, 0,
			"burst: sliding_log has no bucket; its capacity is events (10), got burst 11"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := NewLimit(tt.kind, tt.events, tt.window, tt.burst, tt.maxDelay)
			if err == nil {
				t.Fatalf("NewLimit(%s, %d, %s, %d, %s) = %+v, want error %q", tt.kind, tt.events, tt.window, tt.burst, tt.maxDelay, l, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("NewLimit(%s, %d, %s, %d, %s) error = %q, want %q", tt.kind, tt.events, tt.window, tt.burst, tt.maxDelay, err, tt.want)
			}
		})
	}
}

// TestNewLimitFineTickDelay: a shaping bucket on ticks finer than a µs
// keeps its debt, up to Tau + MaxDelay, exact in a double: at 999999/s
// (ticks of 1/1024 µs, Tau 999999 * 1025 ticks) max_delay may be at most
// (2^52 - Tau) / 1024 µs, less a µs.
func TestNewLimitFineTickDelay(t *testing.T) {
	const most = (maxExact/2 - 999_999*1025) / 1024 // 4398045510128 µs
	if _, err := NewLimit(LeakyBucket, 999_999, time.Second, 0, time.Duration(most-1)*time.Microsecond); err != nil {
		t.Fatalf("max_delay %dµs: %v, want accepted", most-1, err)
	}
	_, err := NewLimit(LeakyBucket, 999_999, time.Second, 0, time.Duration(most)*time.Microsecond)
	if want := "burst and max_delay: 999999 events per 1s refill in 1025/1024 µs each, and a burst of 999999 with max_delay 1221h40m45.510128s is too long to keep at that precision; lower burst or max_delay"; err == nil || err.Error() != want {
		t.Fatalf("max_delay %dµs: %v, want %q", most, err, want)
	}
}

func TestParseKind(t *testing.T) {
	for _, k := range allKinds {
		got, err := ParseKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v, want %v, nil", k.String(), got, err, k)
		}
	}
	if got, err := ParseKind(""); err != nil || got != TokenBucket {
		t.Errorf(`ParseKind("") = %v, %v, want token_bucket, nil`, got, err)
	}
	for _, name := range []string{"leaky", "Token_Bucket", " gcra", "Kind(6)"} {
		if got, err := ParseKind(name); err == nil {
			t.Errorf("ParseKind(%q) = %v, nil, want an error", name, got)
		}
	}
	// The first kind past the names, and one further.
	for _, k := range []Kind{Ban + 1, 9} {
		if got, want := k.String(), fmt.Sprintf("Kind(%d)", k); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
}

func TestCostMilli(t *testing.T) {
	tests := []struct {
		cost   float64
		want   int64
		wantOK bool
	}{
		{0, 0, true},
		{1, 1000, true},
		{0.5, 500, true},
		{0.0004, 1, true}, // rounds up: a positive cost is never free
		{0.0015, 2, true},
		{1e-300, 1, true},
		{math.SmallestNonzeroFloat64, 1, true},
		{1.1, 1100, true},
		{2.007, 2007, true}, // 2.007 * 1000 is 2007.0000000000002 in float64
		{0.007, 7, true},
		{1.0000000000001, 1001, true}, // a real excess is still charged
		{123456789.0001, 123456789001, true},
		{1e16, math.MaxInt64 / 4, true}, // clamped above every capacity
		{math.MaxFloat64, math.MaxInt64 / 4, true},
		{math.Copysign(0, -1), 0, true},
		{-1, 0, false},
		{-1e-300, 0, false},
		{math.NaN(), 0, false},
		{math.Inf(1), 0, false},
		{math.Inf(-1), 0, false},
	}
	for _, tt := range tests {
		got, ok := CostMilli(tt.cost)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("CostMilli(%v) = %d, %t, want %d, %t", tt.cost, got, ok, tt.want, tt.wantOK)
		}
	}
}

// TestCostMilliDecimals: every cost written with up to three decimals is
// charged exactly, whatever float64 makes of it.
func TestCostMilliDecimals(t *testing.T) {
	for _, base := range []int64{0, 1_000_000, 987_654_321_000} {
		for m := base; m < base+100_000; m++ {
			s := fmt.Sprintf("%d.%03d", m/Milli, m%Milli)
			got, ok := ParseCost(s)
			if !ok || got != m {
				t.Fatalf("ParseCost(%q) = %d, %t, want %d, true", s, got, ok, m)
			}
		}
	}
}

func TestCapacity(t *testing.T) {
	tests := []struct {
		kind   Kind
		events int64
		window time.Duration
		burst  int64
		want   int64
	}{
		{TokenBucket, 10, time.Second, 0, 10_000},
		{TokenBucket, 10, time.Second, 50, 50_000},
		{LeakyBucket, 10, time.Hour, 1, 1000},
		{SlidingLog, 7, time.Minute, 0, 7000},
		{FixedWindow, MaxEvents, time.Duration(MaxSpan) * time.Microsecond, 0, MaxEvents * Milli},
	}
	for _, tt := range tests {
		l := mustLimit(t, tt.kind, tt.events, tt.window, tt.burst, 0)
		if got := l.Capacity(); got != tt.want {
			t.Errorf("%s %d burst %d: Capacity() = %d, want %d", tt.kind, tt.events, tt.burst, got, tt.want)
		}
	}
}

// TestOverCapacity: a cost above the capacity is never admitted, charges
// nothing and says so with Wait = Never, whatever the state.
func TestOverCapacity(t *testing.T) {
	for _, kind := range allKinds {
		t.Run("alg="+kind.String(), func(t *testing.T) {
			var maxDelay time.Duration
			if kind == LeakyBucket {
				maxDelay = time.Hour
			}
			l := mustLimit(t, kind, 4, time.Second, 0, maxDelay)
			s := NewState(&l)
			for i, cost := range []int64{4001, 5000, math.MaxInt64 / 4, 4001} {
				d := l.Take(&s, t0, cost)
				want := Decision{Remaining: 4, Wait: Never, At: t0}
				if d != want {
					t.Errorf("step %d: Take(t0, %s) = %+v, want %+v", i, events(cost), d, want)
				}
			}
			if d := l.Take(&s, t0, 4000); !d.Allowed || d.Remaining != 0 {
				t.Errorf("Take(t0, 4) after rejections = %+v, want allowed with 0 remaining", d)
			}
			d := l.Take(&s, t0, 4001)
			if d.Allowed || d.Wait != Never || d.Delay != 0 || d.Remaining != 0 || d.Reset <= 0 {
				t.Errorf("Take(t0, 4.001) on a used state = %+v, want rejected, Wait Never, Remaining 0, Reset > 0", d)
			}
		})
	}
}

// TestZeroLimit: the zero Limit has no capacity; it must not panic.
func TestZeroLimit(t *testing.T) {
	var l Limit
	var s State
	if d := l.Take(&s, t0, 1); d.Allowed || d.Wait != Never {
		t.Errorf("zero Limit: Take(t0, 0.001) = %+v, want rejected with Wait Never", d)
	}
	l.Undo(&s, t0, 1, Decision{})
	if !l.Fresh(&s, t0) {
		t.Errorf("zero Limit: Fresh(t0) = false, want true")
	}
}

// TestHuge drives every algorithm at the largest configuration NewLimit
// accepts, with costs at and around the clamp and times far from t0:
// nothing may overflow, so decisions stay exact and in range.
func TestHuge(t *testing.T) {
	maxSpan := time.Duration(MaxSpan) * time.Microsecond
	const late = t0 + 1<<51 // 2098
	configs := []struct {
		kind   Kind
		events int64
		window time.Duration
		burst  int64
	}{
		{TokenBucket, MaxEvents, maxSpan, 0},
		{GCRA, MaxEvents, maxSpan, 0},
		{LeakyBucket, MaxEvents, maxSpan, 0},
		{FixedWindow, MaxEvents, maxSpan, 0},
		{SlidingWindow, MaxEvents, maxSpan, 0},
		{SlidingLog, MaxLogEvents, maxSpan, 0},
		{TokenBucket, 1, maxSpan, 0},
		{GCRA, MaxEvents, time.Duration(MaxEvents) * time.Microsecond, 0},
		{SlidingWindow, 1, maxSpan, 0},
		{SlidingWindow, MaxEvents, time.Duration(MaxEvents) * time.Microsecond, 0},
		{FixedWindow, 1, time.Microsecond, 0},
		{LeakyBucket, 1, time.Microsecond, MaxEvents},
	}
	for _, c := range configs {
		t.Run(fmt.Sprintf("alg=%s/events=%d/window=%dµs", c.kind, c.events, c.window.Microseconds()), func(t *testing.T) {
			l := mustLimit(t, c.kind, c.events, c.window, c.burst, 0)
			capacity := l.Capacity()
			s := NewState(&l)
			check := func(i int, now, cost int64, d Decision) {
				t.Helper()
				if d.Remaining < 0 || d.Remaining > l.Burst || d.Reset < 0 || d.Wait < Never || d.Delay != 0 {
					t.Fatalf("step %d: Take(%s, %s) = %+v: out of range", i, at(now), events(cost), d)
				}
				if d.Allowed && d.Wait != 0 || !d.Allowed && d.Wait == 0 {
					t.Fatalf("step %d: Take(%s, %s) = %+v: Allowed and Wait disagree", i, at(now), events(cost), d)
				}
			}
			steps := []struct {
				now, cost int64
				allowed   bool
			}{
				{t0, capacity, true},
				{t0, 1, false},
				{t0, capacity + 1, false},
				{t0, math.MaxInt64 / 4, false},
				{late, 0, true},
				{late, capacity - Milli, true},
				{late, Milli, true},
				{late, Milli, false},
				{late + MaxSpan, math.MaxInt64 / 4, false},
				{late + 2*MaxSpan, capacity, true},
				{late + 4*MaxSpan, 1, true},
			}
			var last Decision
			for i, st := range steps {
				d := l.Take(&s, st.now, st.cost)
				check(i, st.now, st.cost, d)
				if d.Allowed != st.allowed {
					t.Errorf("step %d: Take(%s, %s) = %t, want %t", i, at(st.now), events(st.cost), d.Allowed, st.allowed)
				}
				last = d
			}
			l.Undo(&s, late+4*MaxSpan, 1, last)
			if !l.Fresh(&s, late+4*MaxSpan) {
				t.Errorf("Fresh after Undo of the only request = false, want true")
			}
		})
	}
}

func TestAllocs(t *testing.T) {
	for _, kind := range allKinds {
		l := mustLimit(t, kind, 100, time.Second, 0, 0)
		s := NewState(&l)
		now := t0
		allocs := testing.AllocsPerRun(1000, func() {
			now += 3 * ms
			if d := l.Take(&s, now, 1500); d.Allowed {
				l.Undo(&s, now, 500, d)
			}
			l.Peek(&s, now, Milli)
			l.Fresh(&s, now)
		})
		if allocs != 0 {
			t.Errorf("%s: Take, Undo, Peek, Fresh allocate %v times, want 0", kind, allocs)
		}
	}
}

// TestUndoClampsCost: an Undo can give back at most the capacity, however
// large its argument, and a negative cost neither credits nor charges.
func TestUndoClampsCost(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog} {
		l, err := NewLimit(kind, 3, time.Hour, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := NewState(&l)
		now := int64(1_000_000_000)
		var d Decision
		for i := 0; i < 3; i++ {
			d = l.Take(&s, now, Milli)
		}
		l.Undo(&s, now, math.MaxInt64, d)
		if d := l.Peek(&s, now, 0); d.Remaining != 3 || d.Reset != 0 {
			t.Errorf("%s: after Undo(MaxInt64): Remaining %d, Reset %d; want 3, 0 (fresh, not overflowed)", kind, d.Remaining, d.Reset)
		}
		if d := l.Take(&s, now, -5*Milli); !d.Allowed || d.Remaining != 3 {
			t.Errorf("%s: Take(-5): %+v, want allowed with 3 remaining (no credit)", kind, d)
		}
	}
}

// TestCostMilliClampEdge: a cost whose milli-units are exactly 2^61 is
// clamped to MaxInt64/4, the clamp's bound included.
func TestCostMilliClampEdge(t *testing.T) {
	if got, ok := CostMilli(0x1p61 / Milli); !ok || got != math.MaxInt64/4 {
		t.Fatalf("CostMilli(2^61/1000) = %d, %v; want %d, true", got, ok, int64(math.MaxInt64/4))
	}
}
