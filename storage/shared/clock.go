package shared

import (
	"sync/atomic"
	"time"
)

// The clock: µs since the Unix epoch, read from the wall clock once at
// start and advanced by the monotonic clock, so that it never runs
// backwards when the wall clock is stepped.
var (
	clockBase       = time.Now()
	clockBaseMicros = clockBase.UnixMicro()
)

// Micros is this process's clock: µs since the Unix epoch, monotonic.
func Micros() int64 {
	return clockBaseMicros + time.Since(clockBase).Microseconds()
}

// LogInterval is the least time between two log lines of one
// LogThrottle, in µs: an outage of the store logs one line per zone per
// 10s, not one per request.
const LogInterval = 10_000_000

// LogThrottle lets one log line through per interval and counts the lines
// it holds back. It is safe for concurrent use and takes no lock; its zero
// value lets the first line through.
type LogThrottle struct {
	next       atomic.Int64 // µs: no line before this
	suppressed atomic.Int64 // lines held back since the last one let through
}

// Allow reports whether a line may be logged at now (µs), and if so how
// many lines were held back since the last one. Of concurrent callers in
// one interval exactly one is let through.
func (t *LogThrottle) Allow(now, interval int64) (suppressed int64, ok bool) {
	next := t.next.Load()
	if now < next || !t.next.CompareAndSwap(next, now+interval) {
		t.suppressed.Add(1)
		return 0, false
	}
	return t.suppressed.Swap(0), true
}
