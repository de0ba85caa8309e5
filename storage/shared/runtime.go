package shared

import (
	"context"
	"time"
)

// Runtime is what every call to one shared store's client goes through:
// its breaker, its per-call timeout (a context's, or for decisions a
// shared deadline), and the settlements kept while the store cannot hear
// them. One Runtime serves every zone on the client.
type Runtime struct {
	// Breaker opens on evidence that the store is down (see Breaker).
	Breaker Breaker
	// Timeout bounds one call.
	Timeout time.Duration
	// Deadlines hands decisions their shared deadline (see Deadlines).
	Deadlines Deadlines
	// Owed keeps the settlements the store could not hear (see Owed).
	Owed Owed
}

// Call makes one call to the store: fn, given a context that ends after
// Timeout, through the breaker (see Breaker.Do). parent is the caller's
// context.
func (r *Runtime) Call(parent context.Context, fn func(ctx context.Context) error) error {
	return r.Breaker.Do(parent, func() (bool, error) {
		ctx, cancel := context.WithTimeout(parent, r.Timeout)
		defer cancel()
		return true, fn(ctx)
	})
}

// Deadline returns the context of a decision made now: one shared by
// every decision that starts within a millisecond (see Deadlines).
func (r *Runtime) Deadline() context.Context {
	return r.Deadlines.Get(r.Timeout)
}
