package algorithms

import (
	"testing"
	"time"
)

// BenchmarkTake is one key's decision: 100 events a second, with requests
// 7ms apart and costing 1 or 1.5, so that some are admitted and some are
// not. The state is made once, as a store makes it once per key.
func BenchmarkTake(b *testing.B) {
	for _, kind := range allKinds {
		b.Run("alg="+kind.String(), func(b *testing.B) {
			l := mustLimit(b, kind, 100, time.Second, 0, 0)
			s := NewState(&l)
			now := t0
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				now += 7 * ms
				l.Take(&s, now, Milli+int64(i&1)*Milli/2)
			}
		})
	}
}

// BenchmarkTakeCalendar is a calendar window of a day and a month in a
// zone with DST: the span is computed in the zone at every decision.
func BenchmarkTakeCalendar(b *testing.B) {
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		b.Fatal(err)
	}
	for _, unit := range []Unit{Day, Month} {
		l, err := NewCalendarLimit(1<<30, Calendar{unit, 1, loc})
		if err != nil {
			b.Fatal(err)
		}
		b.Run("window="+l.Calendar.String(), func(b *testing.B) {
			var s State
			now := t0
			b.ReportAllocs()
			for b.Loop() {
				now += 7 * ms
				l.Take(&s, now, Milli)
			}
		})
	}
}

// BenchmarkTakeShaping is a leaky_bucket delaying requests that arrive
// faster than it leaks.
func BenchmarkTakeShaping(b *testing.B) {
	l := mustLimit(b, LeakyBucket, 100, time.Second, 0, time.Second)
	s := NewState(&l)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now += 7 * ms
		l.Take(&s, now, 2*Milli)
	}
}

// BenchmarkTakeRejected is a full sliding_window: every decision computes
// its Wait.
func BenchmarkTakeRejected(b *testing.B) {
	l := mustLimit(b, SlidingWindow, 100, time.Second, 0, 0)
	s := NewState(&l)
	l.Take(&s, t0+900*ms, l.Capacity())
	now := t0 + sec
	b.ReportAllocs()
	for b.Loop() {
		if l.Take(&s, now, Milli).Allowed {
			b.Fatal("admitted into a full window")
		}
	}
}

func BenchmarkParseCost(b *testing.B) {
	for _, in := range []string{"1", "0.5", "2.007", "1e3", "abc"} {
		b.Run("cost="+in, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ParseCost(in)
			}
		})
	}
}
