package tollgate

import (
	"context"
	"sync/atomic"
	"time"
)

// deadlineGrain is how much later than its timeout a shared deadline may
// end.
const deadlineGrain = time.Millisecond

// sharedDeadlines hands out contexts that end at now + timeout, rounded up
// to the next deadlineGrain: every decision that starts within one grain
// shares one context, and so one timer. A timer per decision
// (context.WithTimeout and its cancel) was 3% of Caddy's CPU on a Redis
// zone's request path. A shared context carries no request values and
// does not end when its request's client goes away: a decision whose
// client left still waits for Redis, up to the timeout.
type sharedDeadlines struct {
	cur atomic.Pointer[sharedDeadline]
}

type sharedDeadline struct {
	at     time.Time
	ctx    context.Context
	cancel context.CancelFunc // never called: the deadline ends it, and frees its timer
}

// get returns a context that ends between timeout and timeout +
// deadlineGrain from now.
func (s *sharedDeadlines) get(timeout time.Duration) context.Context {
	at := time.Now().Add(timeout).Truncate(deadlineGrain).Add(deadlineGrain)
	if d := s.cur.Load(); d != nil && d.at.Equal(at) {
		return d.ctx
	}
	d := &sharedDeadline{at: at}
	d.ctx, d.cancel = context.WithDeadline(context.Background(), at)
	if old := s.cur.Load(); old == nil || old.at.Before(at) {
		s.cur.Store(d) // a racing caller may store its own: both are right
	}
	return d.ctx
}
