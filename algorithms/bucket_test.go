package algorithms

import (
	"testing"
	"time"
)

// bucketSteps is a bucket of B = N = 2 events refilled at 2 per second:
// Unit = 500ms, Tau = 1s. token_bucket, gcra and leaky_bucket (without
// max_delay) decide it alike. Remaining and Reset of a Peek describe the
// state as it is, nothing being charged.
var bucketSteps = []step{
	0: {take, t0, 1000, Decision{Allowed: true, Remaining: 1, Reset: 500 * ms}},
	1: {take, t0, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
	2: {take, t0, 1000, Decision{Remaining: 0, Reset: sec, Wait: 500 * ms}},
	3: {take, t0 + 250*ms, 1000, Decision{Remaining: 0, Reset: 750 * ms, Wait: 250 * ms}},
	4: {take, t0 + 500*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
	// Half an event refills in 250ms.
	5: {take, t0 + 500*ms, 500, Decision{Remaining: 0, Reset: sec, Wait: 250 * ms}},
	6: {take, t0 + 750*ms, 500, Decision{Allowed: true, Remaining: 0, Reset: sec}},
	7: {fresh, t0 + 1750*ms - 1, 0, Decision{Allowed: false}},
	8: {fresh, t0 + 1750*ms, 0, Decision{Allowed: true}},
	// Peek charges nothing: the whole bucket is still there for Take.
	9:  {peek, t0 + 2*sec, 1000, Decision{Allowed: true, Remaining: 2, Reset: 0}},
	10: {take, t0 + 2*sec, 2000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
	// Above the capacity of 2: never.
	11: {take, t0 + 2*sec, 3000, Decision{Remaining: 0, Reset: sec, Wait: Never}},
	12: {undo, t0 + 2*sec, 1000, Decision{}},
	13: {take, t0 + 2*sec, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
	// 0.1 event takes 50ms to refill; 1.3 events are left, 1 of them whole.
	14: {take, t0 + 2750*ms, 100, Decision{Allowed: true, Remaining: 1, Reset: 300 * ms}},
	15: {take, t0 + 2750*ms, 1500, Decision{Remaining: 1, Reset: 300 * ms, Wait: 50 * ms}},
	16: {take, t0 + 2800*ms, 1500, Decision{Allowed: true, Remaining: 0, Reset: sec}},
	17: {take, t0 + 2800*ms, 0, Decision{Allowed: true, Remaining: 0, Reset: sec}},
	// 0.001 event refills in 500µs.
	18: {peek, t0 + 2800*ms, 1, Decision{Remaining: 0, Reset: sec, Wait: 500}},
	19: {fresh, t0 + 3800*ms, 0, Decision{Allowed: true}},
}

func TestBucket(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		t.Run("alg="+kind.String(), func(t *testing.T) {
			run(t, mustLimit(t, kind, 2, time.Second, 0, 0), bucketSteps)
		})
	}
}

// TestBucketBurst: a bucket of 5 refilled at 1 per second.
func TestBucketBurst(t *testing.T) {
	steps := []step{
		0: {take, t0, 5000, Decision{Allowed: true, Remaining: 0, Reset: 5 * sec}},
		1: {take, t0 + 999*ms, 1000, Decision{Remaining: 0, Reset: 4001 * ms, Wait: 1 * ms}},
		2: {take, t0 + 3*sec, 3000, Decision{Allowed: true, Remaining: 0, Reset: 5 * sec}},
		3: {take, t0 + 10*sec, 1000, Decision{Allowed: true, Remaining: 4, Reset: sec}},
		4: {peek, t0 + 10*sec, 4000, Decision{Allowed: true, Remaining: 4, Reset: sec}},
		5: {peek, t0 + 10*sec, 4001, Decision{Remaining: 4, Reset: sec, Wait: 1 * ms}},
		6: {take, t0 + 10*sec, 6000, Decision{Remaining: 4, Reset: sec, Wait: Never}},
	}
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		t.Run("alg="+kind.String(), func(t *testing.T) {
			run(t, mustLimit(t, kind, 1, time.Second, 5, 0), steps)
		})
	}
}

// TestBucketBackwards: an earlier clock reading than the stored one. The
// token and leaky buckets count it as no time elapsed; gcra, which keeps
// only the theoretical arrival time, sees it as more debt and errs towards
// rejecting.
func TestBucketBackwards(t *testing.T) {
	bucket := []step{
		0: {take, t0 + sec, 2000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		1: {take, t0 + 500*ms, 1000, Decision{Remaining: 0, Reset: sec, Wait: 500 * ms}},
		2: {take, t0 + 1500*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		3: {take, t0, 1000, Decision{Remaining: 0, Reset: sec, Wait: 500 * ms}},
		4: {peek, t0 + 1500*ms, 0, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		5: {fresh, t0 + 2500*ms, 0, Decision{Allowed: true}},
		6: {take, t0 + 10*sec, 1000, Decision{Allowed: true, Remaining: 1, Reset: 500 * ms}},
		7: {take, t0 + 9900*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
	}
	gcra := []step{
		0: {take, t0 + sec, 2000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		1: {take, t0 + 500*ms, 1000, Decision{Remaining: 0, Reset: 1500 * ms, Wait: sec}},
		2: {take, t0 + 1500*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		3: {take, t0, 1000, Decision{Remaining: 0, Reset: 2500 * ms, Wait: 2 * sec}},
		4: {peek, t0 + 1500*ms, 0, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		5: {fresh, t0 + 2500*ms, 0, Decision{Allowed: true}},
		6: {take, t0 + 10*sec, 1000, Decision{Allowed: true, Remaining: 1, Reset: 500 * ms}},
		7: {take, t0 + 9900*ms, 1000, Decision{Remaining: 0, Reset: 600 * ms, Wait: 100 * ms}},
	}
	tests := []struct {
		kind  Kind
		steps []step
	}{
		{TokenBucket, bucket},
		{LeakyBucket, bucket},
		{GCRA, gcra},
	}
	for _, tt := range tests {
		t.Run("alg="+tt.kind.String(), func(t *testing.T) {
			run(t, mustLimit(t, tt.kind, 2, time.Second, 0, 0), tt.steps)
		})
	}
}

// TestTokenBucketSteady: r = 10/s, B = 50, and a client sending 60
// requests a second, evenly, for ten seconds. The first 50 pass on the
// burst; so do 9 more on the 8.3 events that refill while those 50 arrive
// (request i comes at i/60 s, and needs (i+1) * 100ms - i/60 s <= 5s of
// debt: i <= 58). Request 59 must wait 16.667ms, until request 60 at
// exactly 1s; from there on exactly 1 in 6 passes, every 100ms.
func TestTokenBucketSteady(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		t.Run("alg="+kind.String(), func(t *testing.T) {
			l := mustLimit(t, kind, 10, time.Second, 50, 0)
			s := NewState(&l)
			passed := 0
			for i := int64(0); i < 600; i++ {
				now := t0 + i*sec/60
				d := l.Take(&s, now, Milli)
				want := i < 59 || i%6 == 0
				if d.Allowed != want {
					t.Errorf("step %d: Take(%s, 1) = %t, want %t", i, at(now), d.Allowed, want)
				}
				if d.Allowed {
					passed++
				}
				if i == 59 && d.Wait != 16_667 {
					t.Errorf("step %d: Take(%s, 1).Wait = %d, want 16667", i, at(now), d.Wait)
				}
				if i == 49 && passed != 50 {
					t.Errorf("after step %d: %d passed, want the first 50", i, passed)
				}
			}
			if want := 59 + 90; passed != want {
				t.Errorf("%d of 600 requests passed, want %d", passed, want)
			}
		})
	}
}

// TestLeakyBucketShaping: B = N = 2 leaking at 2 per second (Unit = 500ms,
// Tau = 1s), delaying up to 1s. A request that does not fit waits until it
// does, its place reserved; one that would wait longer is rejected with the
// time until it could be delayed instead.
func TestLeakyBucketShaping(t *testing.T) {
	steps := []step{
		0: {take, t0, 1000, Decision{Allowed: true, Remaining: 1, Reset: 500 * ms}},
		1: {take, t0, 1000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		// Full: the third waits until the first event has leaked...
		2: {take, t0, 1000, Decision{Allowed: true, Remaining: 0, Reset: 1500 * ms, Delay: 500 * ms}},
		// ...the fourth queues behind it...
		3: {take, t0, 1000, Decision{Allowed: true, Remaining: 0, Reset: 2 * sec, Delay: sec}},
		// ...and the fifth would wait 1.5s > max_delay: 0.5s until it
		// could be delayed by 1s.
		4: {take, t0, 1000, Decision{Remaining: 0, Reset: 2 * sec, Wait: 500 * ms}},
		5: {take, t0 + 250*ms, 1000, Decision{Remaining: 0, Reset: 1750 * ms, Wait: 250 * ms}},
		// The fourth request's client goes away: its place is given back.
		6: {undo, t0 + 250*ms, 1000, Decision{}},
		7: {take, t0 + 250*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: 1750 * ms, Delay: 750 * ms}},
		// Peek neither charges nor reserves.
		8: {peek, t0 + 250*ms, 500, Decision{Allowed: true, Remaining: 0, Reset: 1750 * ms, Delay: sec}},
		9: {peek, t0 + 250*ms, 500, Decision{Allowed: true, Remaining: 0, Reset: 1750 * ms, Delay: sec}},
		// Above the capacity of 2: never, not even delayed.
		10: {take, t0 + 250*ms, 3000, Decision{Remaining: 0, Reset: 1750 * ms, Wait: Never}},
		11: {fresh, t0 + 2*sec - 1, 0, Decision{Allowed: false}},
		12: {fresh, t0 + 2*sec, 0, Decision{Allowed: true}},
		13: {take, t0 + 2*sec, 2000, Decision{Allowed: true, Remaining: 0, Reset: sec}},
		14: {take, t0 + 2*sec, 500, Decision{Allowed: true, Remaining: 0, Reset: 1250 * ms, Delay: 250 * ms}},
		15: {take, t0 + 2*sec, 2000, Decision{Remaining: 0, Reset: 1250 * ms, Wait: 250 * ms}},
		16: {take, t0 + 2*sec, 1500, Decision{Allowed: true, Remaining: 0, Reset: 2 * sec, Delay: sec}},
		// Time running backwards counts as none elapsed: still full.
		17: {take, t0, 0, Decision{Allowed: true, Remaining: 0, Reset: 2 * sec, Delay: sec}},
		18: {take, t0 + 2500*ms, 1000, Decision{Allowed: true, Remaining: 0, Reset: 2 * sec, Delay: sec}},
	}
	run(t, mustLimit(t, LeakyBucket, 2, time.Second, 0, time.Second), steps)
}

// TestBucketLateUndo: a policing bucket's undo of a charge that is no
// longer the last in the queue gives back what the charge still holds,
// its refill time less the time since it was made; a shaping bucket's
// gives back nothing (see giveBack).
func TestBucketLateUndo(t *testing.T) {
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		l := mustLimit(t, kind, 10, time.Second, 0, 0) // 100 ms an event
		var s State
		first := l.Take(&s, t0, Milli)
		l.Take(&s, t0, Milli)
		l.Undo(&s, t0+10*ms, Milli, first)
		// 200 ms of debt, 10 drained, 90 given back: 100 ms left.
		if d := l.Peek(&s, t0+10*ms, 0); d.Reset != 100*ms {
			t.Errorf("%s: after a late undo the bucket refills in %d µs, want %d", kind, d.Reset, 100*ms)
		}
	}
	l := mustLimit(t, LeakyBucket, 10, time.Second, 0, time.Second)
	var s State
	first := l.Take(&s, t0, Milli)
	l.Take(&s, t0, Milli)
	l.Undo(&s, t0+10*ms, Milli, first)
	if d := l.Peek(&s, t0+10*ms, 0); d.Reset != 190*ms {
		t.Errorf("shaping: after a late undo the bucket refills in %d µs, want %d (nothing given back)", d.Reset, 190*ms)
	}
}

// TestGCRAFarAhead: a TAT more than 4 MaxSpan ahead of now (a clock that
// ran far back) reads as a debt of 2^53 ticks, which rejects; one exactly
// 4 MaxSpan ahead reads as itself.
func TestGCRAFarAhead(t *testing.T) {
	l := mustLimit(t, GCRA, 10, time.Second, 0, 0)
	for _, c := range []struct{ ahead, reset int64 }{
		{4 * MaxSpan, 4 * MaxSpan},
		{4*MaxSpan + 1, maxExact},
	} {
		s := State{At: t0 + c.ahead}
		if d := l.Peek(&s, t0, Milli); d.Allowed || d.Reset != c.reset {
			t.Errorf("TAT %d µs ahead: %+v, want refused with Reset %d", c.ahead, d, c.reset)
		}
	}
}
