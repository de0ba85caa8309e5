package shared

import (
	"context"
	"errors"
	"fmt"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// Limiter is a zone's limiter on Redis: each call goes through the
// client's runtime (breaker, timeout, settlements kept while Redis cannot
// hear them), and the zone's local copy, if any, follows.
type Limiter struct {
	inner storage.Limiter
	name  string // the zone's
	limit algorithms.Limit
	rt    *Runtime // the client's: every call goes through it
	pool  *Pool    // the client inner runs on
	// local is the zone's local copy for on_storage_error local (see
	// follow), or nil: a give-back Redis makes is made there too, and a
	// reset any instance makes is followed (see resetLocal).
	local      *memory.Store
	stopResets func()
	resets     chan struct{} // bounds the resets followed at once
	// clock is the time a grant another instance announced is followed
	// at in the local copy (the handler's, which tests may fake).
	clock func() int64
}

// LeaseOf reports the quota lease this instance holds on key (see
// redisstore's quota leases): the whole events left and the µs until it
// ends; ok is false when it holds none.
func (l *Limiter) LeaseOf(key string) (events, left int64, ok bool) {
	if z, can := l.inner.(interface {
		LeaseOf(string) (int64, int64, bool)
	}); can {
		return z.LeaseOf(key)
	}
	return 0, 0, false
}

// Close stops following resets, and returns the quota leases the zone
// holds (a reload retires it).
func (l *Limiter) Close() {
	if l.stopResets != nil {
		l.stopResets()
	}
	if z, ok := l.inner.(interface{ CloseLeases() }); ok {
		z.CloseLeases()
	}
}

// heard follows, in the local copy, a reset (grant 0) or a grant of
// grant milli-units to key that an instance published (see
// redisstore.Store.OnReset): a grant as a grant, a reset by resetLocal.
func (l *Limiter) heard(key string, grant int64) {
	if grant > 0 {
		_, _ = l.local.Grant(context.Background(), key, l.clock(), grant)
		return
	}
	l.resetLocal(key)
}

// resetLocal brings the local copy of key up to its state on Redis after
// an instance (this one or another) reset it there, and published the
// reset once done: a Peek made after the reset was heard of reads what
// Redis holds since, which the local copy is reseeded from (or forgets
// the key, if Redis holds none): a decision's reply is merged into the
// local copy, which never moves back, but a reset must take it back.
// Without it, a client reset elsewhere stayed refused by this instance's
// local copy, whenever Redis did not answer in time. If the Peek fails,
// or too many resets are being followed at once, the local copy stays as
// it was, which errs towards refusing. It does not block.
func (l *Limiter) resetLocal(key string) {
	select {
	case l.resets <- struct{}{}:
	default:
		return
	}
	go func() {
		defer func() { <-l.resets }()
		var (
			d    algorithms.Decision
			held bool
		)
		err := l.rt.Call(context.Background(), func(ctx context.Context) error {
			var err error
			d, held, err = l.inner.Peek(ctx, key, Micros())
			return err
		})
		switch {
		case err != nil:
		case held:
			l.local.Reseed(key, d) // a reset takes the local copy back: not a merge
		default:
			_, _ = l.local.Reset(context.Background(), key, Micros())
		}
	}()
}

// ResetLocal is resetLocal, for tests: it follows a reset of key.
func (l *Limiter) ResetLocal(key string) { l.resetLocal(key) }

// followedResets is how many resets a zone's local copy follows at once.
const followedResets = 64

// Take decides one request on Redis (see storage.Limiter).
func (l *Limiter) Take(ctx context.Context, key string, now, cost int64) (d algorithms.Decision, err error) {
	err = l.rt.Call(ctx, func(c context.Context) error {
		d, err = l.inner.Take(c, key, now, cost)
		return err
	})
	return d, err
}

// Undo gives back on Redis, and in the local copy (see storage.Limiter).
// A give-back Redis cannot hear is kept until it does (see Owed).
func (l *Limiter) Undo(ctx context.Context, key string, now, cost int64, taken algorithms.Decision) error {
	err := l.rt.Call(ctx, func(c context.Context) error {
		return l.inner.Undo(c, key, now, cost, taken)
	})
	if err != nil && l.limit.Kind != algorithms.Concurrency {
		err = l.keep(key, taken, cost, err)
	}
	// A slot's local count is given back by its request itself (see
	// countSlots): it is not a copy of Redis's.
	if err == nil && l.local != nil && l.local.Limit().Kind != algorithms.Concurrency {
		l.local.Undo(ctx, key, now, cost, taken)
	}
	return err
}

// Settle settles on Redis, bounded by the timeout and the breaker, and in
// the zone's local copy (on_storage_error local) whether Redis answered or
// not: the local copy decides while Redis does not answer, and must know
// what was given back or owed meanwhile. A settlement Redis cannot hear
// is kept until it does (see Owed).
func (l *Limiter) Settle(ctx context.Context, key string, now, reserved, actual int64, taken algorithms.Decision) error {
	if l.local != nil {
		defer l.local.Settle(ctx, key, now, reserved, actual, taken)
	}
	s, ok := l.inner.(storage.Settler)
	if !ok {
		return fmt.Errorf("%T cannot settle", l.inner)
	}
	err := l.rt.Call(ctx, func(c context.Context) error {
		return s.Settle(c, key, now, reserved, actual, taken)
	})
	if err != nil {
		err = l.keep(key, taken, max(reserved, 0)-max(actual, 0), err)
	}
	return err
}

// keep keeps a settlement that failed with err, giving back give
// milli-units (owing -give), until Redis hears it (see Owed), and returns
// nil if it was kept, else err. A settlement whose call may have reached
// Redis is not kept: it may have been applied. It is counted as dropped,
// as a kept one is whose later try may have run (the metric
// settlements_dropped_total).
func (l *Limiter) keep(key string, taken algorithms.Decision, give int64, err error) error {
	s, ok := l.inner.(storage.Settler)
	if !ok {
		return err
	}
	if !l.pool.unsent(err) {
		l.rt.Owed.drop()
		return err
	}
	// Counted from now, not from taken.At: Redis's clock is not this
	// instance's, and a little late is harmless (past its window, a
	// settlement changes nothing).
	if !l.rt.Owed.Keep(s, key, taken, give, Micros()+storage.Horizon(&l.limit)) {
		return fmt.Errorf("%w (not kept: the window has ended, or too many are kept)", err)
	}
	return nil
}

// Grant gives key extra quota for its current window on Redis (see
// storage.Granter).
func (l *Limiter) Grant(ctx context.Context, key string, now, amount int64) (algorithms.Decision, error) {
	d, _, err := l.GrantOnce(ctx, key, now, amount, "")
	return d, err
}

// GrantOnce gives key extra quota for its current window on Redis, once
// for an id (see storage.OnceGranter), through the breaker and timeout
// of a decision. The local copy of on_storage_error local follows a grant
// applied as it follows any decision: the grant, then the state after it.
// An error that wraps redisstore.ErrNotAnnounced says the grant was
// applied.
func (l *Limiter) GrantOnce(ctx context.Context, key string, now, amount int64, id string) (d algorithms.Decision, applied bool, err error) {
	g, ok := l.inner.(storage.OnceGranter)
	if !ok {
		return d, false, fmt.Errorf("%T keeps no grants", l.inner)
	}
	var notice error // a grant applied but not announced: Redis answered it
	err = l.rt.Call(ctx, func(c context.Context) error {
		var err error
		d, applied, err = g.GrantOnce(c, key, now, amount, id)
		if errors.Is(err, redisstore.ErrNotAnnounced) {
			notice, err = err, nil
		}
		return err
	})
	if err == nil {
		err = notice
	}
	if applied {
		l.grantLocal(key, now, amount, d)
	}
	return d, applied, err
}

// grantLocal has the local copy follow a grant of amount to key, d the
// decision after it.
func (l *Limiter) grantLocal(key string, now, amount int64, d algorithms.Decision) {
	if l.local != nil {
		_, _ = l.local.Grant(context.Background(), key, now, amount)
		l.local.Seed(key, d, 0, false)
	}
}

// grantScope identifies where l's grants are kept: its Redis keys, zone
// and algorithm.
func (l *Limiter) grantScope() string {
	return fmt.Sprintf("redis %s %q %s", l.pool.keys, l.name, l.limit.Kind)
}

// grantedElsewhere has l learn a grant of amount to key that another
// handler's client made on the same Redis keys in this process (see
// grantScope), d the decision after it: its deny cache forgets the key's
// rejection, and its local copy follows the grant, as GrantOnce does
// (this process skips its own notices).
func (l *Limiter) grantedElsewhere(key string, now, amount int64, d algorithms.Decision) {
	if f, ok := l.inner.(interface{ Forget(key string) }); ok {
		f.Forget(key)
	}
	l.grantLocal(key, now, amount, d)
}

// leaseHolder is a Redis zone whose slots are leases (redis.Store's
// concurrency zones).
type leaseHolder interface {
	Hold(key string, taken algorithms.Decision) *redisstore.Lease
}

// hold has the store renew the lease of the slot taken holds for key
// until it is released, and keeps the client open meanwhile: the caller
// releases the lease, then gives the slot back, then releases pool. Both
// are nil when the client is closed already (the lease lapses).
func (l *Limiter) hold(key string, taken algorithms.Decision) (pool *Pool, lease *redisstore.Lease) {
	h, ok := l.inner.(leaseHolder)
	if !ok || !l.pool.acquire() {
		return nil, nil
	}
	return l.pool, h.Hold(key, taken)
}

// Peek reads key's state on Redis (see storage.Limiter).
func (l *Limiter) Peek(ctx context.Context, key string, now int64) (d algorithms.Decision, ok bool, err error) {
	err = l.rt.Call(ctx, func(c context.Context) error {
		d, ok, err = l.inner.Peek(c, key, now)
		return err
	})
	return d, ok, err
}

// PeekGrant is Peek with the key's grant (see storage.GrantPeeker).
func (l *Limiter) PeekGrant(ctx context.Context, key string, now int64) (d algorithms.Decision, granted int64, ok bool, err error) {
	err = l.rt.Call(ctx, func(c context.Context) error {
		d, granted, ok, err = storage.PeekGrant(c, l.inner, key, now)
		return err
	})
	return d, granted, ok, err
}

// Reset resets key on Redis. An error that wraps
// redisstore.ErrNotAnnounced says the reset was applied.
func (l *Limiter) Reset(ctx context.Context, key string, now int64) (ok bool, err error) {
	var notice error // applied but not announced: Redis answered it
	err = l.rt.Call(ctx, func(c context.Context) error {
		ok, err = l.inner.Reset(c, key, now)
		if errors.Is(err, redisstore.ErrNotAnnounced) {
			notice, err = err, nil
		}
		return err
	})
	if err == nil {
		err = notice
	}
	return ok, err
}

// Interface guards.
var (
	_ storage.Limiter     = (*Limiter)(nil)
	_ storage.Granter     = (*Limiter)(nil)
	_ storage.OnceGranter = (*Limiter)(nil)
	_ storage.GrantPeeker = (*Limiter)(nil)
	_ storage.Settler     = (*Limiter)(nil)
)

// Runtime is what every call of l goes through: its client's.
func (l *Limiter) Runtime() *Runtime { return l.rt }

// Inner is the store's own limiter that l runs through the runtime.
func (l *Limiter) Inner() storage.Limiter { return l.inner }

// Following is how many resets l's local copy is following now (see
// resetLocal).
func (l *Limiter) Following() int { return len(l.resets) }
