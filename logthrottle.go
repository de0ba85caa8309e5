package tollgate

import "sync/atomic"

// logThrottleInterval is the least time between two log lines of one
// throttle, in µs: an outage of the store logs one line per zone per 10s,
// not one per request.
const logThrottleInterval = 10 * microsPerSecond

// logThrottle lets one log line through per interval and counts the lines
// it holds back. It is safe for concurrent use and takes no lock; its zero
// value lets the first line through.
type logThrottle struct {
	next       atomic.Int64 // µs: no line before this
	suppressed atomic.Int64 // lines held back since the last one let through
}

// allow reports whether a line may be logged at now (µs), and if so how
// many lines were held back since the last one. Of concurrent callers in
// one interval exactly one is let through.
func (t *logThrottle) allow(now, interval int64) (suppressed int64, ok bool) {
	next := t.next.Load()
	if now < next || !t.next.CompareAndSwap(next, now+interval) {
		t.suppressed.Add(1)
		return 0, false
	}
	return t.suppressed.Swap(0), true
}
