package shared

import (
	"context"
	"sync/atomic"
	"time"
)

// grain is how much later than its timeout a shared deadline may
// end.
const grain = time.Millisecond

// Deadlines hands out contexts that end at now + timeout, rounded up
// to the next grain: every decision that starts within one grain
// shares one context, and so one timer. A timer per decision
// (context.WithTimeout and its cancel) was 3% of Caddy's CPU on a Redis
// zone's request path. A shared context carries no request values and
// does not end when its request's client goes away: a decision whose
// client left still waits for Redis, up to the timeout.
type Deadlines struct {
	cur atomic.Pointer[deadline]
}

type deadline struct {
	at     time.Time
	ctx    context.Context
	cancel context.CancelFunc // never called: the deadline ends it, and frees its timer
}

// Get returns a context that ends between timeout and timeout +
// grain from now.
func (s *Deadlines) Get(timeout time.Duration) context.Context {
	at := time.Now().Add(timeout).Truncate(grain).Add(grain)
	if d := s.cur.Load(); d != nil && d.at.Equal(at) {
		return d.ctx
	}
	d := &deadline{at: at}
	d.ctx, d.cancel = context.WithDeadline(context.Background(), at)
	if old := s.cur.Load(); old == nil || old.at.Before(at) {
		s.cur.Store(d) // a racing caller may store its own: both are right
	}
	return d.ctx
}
