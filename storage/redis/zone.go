package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// zone runs one zone's decisions, each as one script run on one Redis key.
type zone struct {
	store  *Store
	name   string
	limit  algorithms.Limit
	script *script
	tail   string // what follows the hash tag in the zone's keys (keyTail)
	consts []any  // the algorithm's code and constants (see constants)
	// unit is the x of a request of cost 1 (the usual cost), and unitArg
	// that x boxed once (nil for a concurrency limit, whose x is a new
	// lease id each time).
	unit    int64
	unitArg any
	// leases: hot keys are decided from quota leases (see quota.go).
	leases bool
	// span is a calendar window's constants for the span last computed
	// (see constsAt); nil until then.
	span atomic.Pointer[spanConsts]
}

// spanConsts is a calendar window's script constants for one span.
type spanConsts struct {
	sp   algorithms.Span
	args []any
}

// spanLead is how far before an instance's now its span of two calendar
// windows starts at the latest: a span holds Redis's clock when it is
// behind the instance's by up to spanLead, or ahead by up to a window
// less spanLead (22 hours of a 23-hour day). Beyond that, a decision is
// refused (a store failure), never made in the wrong window.
const spanLead = int64(time.Hour / time.Microsecond)

// constsAt is the zone's script constants for a decision asked at now on
// this instance's clock: for a calendar window (code fc) the span of the
// window that holds now - spanLead and the next, which the script picks
// from by Redis's clock, computed once per window; for any other zone its
// constants.
func (z *zone) constsAt(now int64) []any {
	if z.limit.Calendar.Unit == algorithms.NoUnit {
		return z.consts
	}
	at := now + z.store.skew - spanLead
	c := z.span.Load()
	if c == nil || at < c.sp.Start || at >= c.sp.Mid {
		sp := z.limit.Calendar.Span(at)
		i := func(n int64) any { return strconv.FormatInt(n, 10) }
		c = &spanConsts{sp, []any{"fc", i(sp.Start), i(z.limit.Events * algorithms.Milli), i(sp.Mid), i(sp.End)}}
		z.span.Store(c)
	}
	return c.args
}

// arg returns x as a script argument, without allocating when it is the
// x of a request of cost 1.
func (z *zone) arg(x int64) any {
	if x == z.unit && z.unitArg != nil {
		return z.unitArg
	}
	return x
}

var _ storage.Limiter = (*zone)(nil)

var errReply = errors.New("unexpected script reply")

// undoAmount is amount for an Undo of cost, clamped as Limit.Undo clamps
// it: nothing admitted costs more than the capacity.
func undoAmount(l *algorithms.Limit, cost int64) int64 {
	return amount(l, min(max(cost, 0), l.Capacity()))
}

// serverClock is the now that has the scripts read the server's clock,
// boxed once.
var serverClock any = int64(-1)

// clock is the now argument of a script: the server's clock, or the
// caller's now in the tests that set callerClock.
func (s *Store) clock(now int64) any {
	if s.callerClock {
		return now
	}
	return serverClock
}

// Take decides one request of cost milli-units for key by the Redis
// server's clock; now is ignored. A cost above the zone's capacity is
// rejected with Wait algorithms.Never, as in package algorithms.
func (z *zone) Take(ctx context.Context, key string, now, cost int64) (algorithms.Decision, error) {
	op, x := opTake, amount(&z.limit, max(cost, 0))
	if cost > z.limit.Capacity() {
		op, x = opReject, 0
	}
	d, err := z.run(ctx, op, key, now, x, algorithms.Decision{})
	if err != nil {
		return algorithms.Decision{}, fmt.Errorf("redis store: take %q: %w", z.name, err)
	}
	return d, nil
}

// Undo gives back cost that the Take for key whose Decision is taken
// admitted, to where it was charged (see algorithms.Limit.Undo). A key that
// has expired meanwhile has nothing to give back, nor one reset at or
// after taken.At (by the server's clock, as taken.At): the reset gave the
// charge back.
func (z *zone) Undo(ctx context.Context, key string, now, cost int64, taken algorithms.Decision) error {
	rkey := z.store.key(key, z.tail)
	if _, err := z.runKeys(ctx, opUndo, rkey, true, now, undoAmount(&z.limit, cost), taken); err != nil {
		return fmt.Errorf("redis store: undo %q: %w", z.name, err)
	}
	z.store.gaveBack(rkey)
	return nil
}

// gaveBack drops rkey's rejection from this store's deny cache after this
// instance gave back to it: the key may be admitted at once.
func (s *Store) gaveBack(rkey string) {
	if s.deny != nil {
		s.deny.forget(rkey)
	}
}

// Peek reports the decision one event for key would get, charging nothing
// and writing nothing. ok is false for a key Redis does not hold (never
// taken, expired or reset).
func (z *zone) Peek(ctx context.Context, key string, now int64) (algorithms.Decision, bool, error) {
	d, _, ok, err := z.PeekGrant(ctx, key, now)
	return d, ok, err
}

// PeekGrant is Peek, and granted the milli-units granted to key's current
// window (see algorithms.Limit.Granted), which the window algorithms'
// peek returns after the decision.
func (z *zone) PeekGrant(ctx context.Context, key string, now int64) (d algorithms.Decision, granted int64, ok bool, err error) {
	// One event is above the capacity only of a limit NewLimit refuses,
	// but decide as Limit.Peek would even then.
	over := algorithms.Milli > z.limit.Capacity()
	x := amount(&z.limit, algorithms.Milli)
	if over {
		x = 0
	}
	v, err := z.reply(ctx, opPeek, z.store.key(key, z.tail), false, now, x, algorithms.Decision{})
	switch {
	case err != nil:
	case len(v) == 0:
		return d, 0, false, nil
	case len(v) == 7:
		granted = v[6]
		fallthrough
	case len(v) == 6:
		d = decision(v)
	default:
		err = fmt.Errorf("%w: %v", errReply, v)
	}
	if err != nil {
		return algorithms.Decision{}, 0, false, fmt.Errorf("redis store: peek %q: %w", z.name, err)
	}
	if over {
		d.Allowed, d.Wait, d.Delay = false, algorithms.Never, 0
	}
	return d, granted, true, nil
}

var _ storage.GrantPeeker = (*zone)(nil)

// Reset deletes key's state by the Redis server's clock (now is ignored),
// and marks when it did (see single.lua), so that a charge made before
// gives nothing back (see Undo). ok is false for a key Redis did not hold.
func (z *zone) Reset(ctx context.Context, key string, now int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("redis store: reset %q: %w", z.name, err)
	}
	if z.script == nil {
		return false, fmt.Errorf("redis store: reset %q: unknown algorithm %s", z.name, z.limit.Kind)
	}
	rkey := z.store.key(key, z.tail)
	c := newCall(z.script, z.store.fns.fcall(), 2)
	keep := (storage.Horizon(&z.limit) + 999) / 1000 // ms
	c.args = append(c.args, rkey, resetMark(rkey), word(opReset), z.store.clock(now), z.store.ttlSlack, keep, 0, 0)
	c.args = append(c.args, z.constsAt(now)...)
	v, err := z.store.run.run(ctx, c)
	if err == nil && len(v) != 1 {
		err = fmt.Errorf("%w: %v", errReply, v)
	}
	if err != nil {
		return false, fmt.Errorf("redis store: reset %q: %w", z.name, err)
	}
	n := v[0]
	if err := z.store.announce(ctx, rkey, 0); err != nil {
		return n > 0, fmt.Errorf("redis store: reset %q: %w", z.name, err)
	}
	return n > 0, nil
}

// ErrNotAnnounced is the error of a reset or grant that was applied on
// Redis, but whose notice to the other instances failed (a timeout, or an
// ACL user without the right to publish on the channel): their deny
// caches forget the key within DenyCacheFor all the same, their local
// copies learn it at their next decision on the key.
var ErrNotAnnounced = errors.New("applied, but telling the other instances failed")

// announce has every instance's deny cache forget the Redis key rkey, this
// one's at once, after a reset (grant 0) or a grant of grant milli-units
// changed its state: a rejection cached until the window's end would
// otherwise outlive a grant. The other instances' local copies follow it
// too (see OnReset).
func (s *Store) announce(ctx context.Context, rkey string, grant int64) error {
	s.book.heard(rkey, grant)
	if s.deny == nil {
		return nil
	}
	s.deny.forget(rkey)
	channel, msg := ResetChannel, rkey
	if grant > 0 {
		channel, msg = GrantChannel, grantNotice(rkey, grant)
	}
	if err := s.pubsub.Publish(ctx, s.prefix+channel, msg).Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotAnnounced, err)
	}
	return nil
}

// run runs the zone's one-key script (single.lua) for op with x (and, for
// an undo, the decision taken): a take, reject, undo, renew, owe or grant
// (a peek's reply is PeekGrant's to read).
func (z *zone) run(ctx context.Context, op, key string, now, x int64, taken algorithms.Decision) (algorithms.Decision, error) {
	return z.runKey(ctx, op, z.store.key(key, z.tail), now, x, taken)
}

// runKey is run on the Redis key rkey (z.store.key of the resolved key).
func (z *zone) runKey(ctx context.Context, op, rkey string, now, x int64, taken algorithms.Decision) (algorithms.Decision, error) {
	return z.runKeys(ctx, op, rkey, false, now, x, taken)
}

// runKeys is runKey, with the key's reset mark (resetMark) as a second
// key if marked: what an undo reads.
func (z *zone) runKeys(ctx context.Context, op, rkey string, marked bool, now, x int64, taken algorithms.Decision) (algorithms.Decision, error) {
	v, err := z.reply(ctx, op, rkey, marked, now, x, taken)
	switch {
	case err != nil:
		return algorithms.Decision{}, err
	case len(v) == 6:
		return decision(v), nil
	case len(v) == 0 && (op == opUndo || op == opRenew || op == opOwe):
		return algorithms.Decision{}, nil
	}
	return algorithms.Decision{}, fmt.Errorf("%w: %v", errReply, v)
}

// reply runs the zone's script as runKeys does and returns its reply as
// it is.
func (z *zone) reply(ctx context.Context, op, rkey string, marked bool, now, x int64, taken algorithms.Decision) ([]int64, error) {
	if z.script == nil {
		return nil, fmt.Errorf("unknown algorithm %s", z.limit.Kind)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var c *call
	if marked {
		c = newCall(z.script, z.store.fns.fcall(), 2)
		c.args = append(c.args, rkey, resetMark(rkey))
	} else {
		c = newCall(z.script, z.store.fns.fcall(), 1)
		c.args = append(c.args, rkey)
	}
	c.args = append(c.args, word(op), z.store.clock(now), z.store.ttlSlack, z.arg(x), taken.At, taken.Reset)
	c.args = append(c.args, z.constsAt(now)...)
	c.await = op == opUndo || op == opOwe
	return z.store.run.run(ctx, c)
}

// resetMark is the Redis key that marks when the key rkey was last reset
// (see single.lua): rkey's hash tag, so in its Cluster slot, and a tail
// that no zone's key has (a kind code has no "!").
func resetMark(rkey string) string {
	return rkey + "!reset"
}

// decision reads a decision as the scripts return it: 6 integers.
func decision(v []int64) algorithms.Decision {
	return algorithms.Decision{Allowed: v[0] == 1, Remaining: v[1], Reset: v[2], Wait: v[3], Delay: v[4], At: v[5]}
}

// Renew extends the concurrency lease that the Take whose Decision is
// taken holds for key, to a whole lease from now on the server's clock. A
// lease that has expired meanwhile stays expired: its slot may have gone
// to another request.
func (z *zone) Renew(ctx context.Context, key string, now int64, taken algorithms.Decision) error {
	if z.limit.Kind != algorithms.Concurrency {
		return fmt.Errorf("redis store: renew %q: not a concurrency limit", z.name)
	}
	if _, err := z.run(ctx, opRenew, key, now, 0, taken); err != nil {
		return fmt.Errorf("redis store: renew %q: %w", z.name, err)
	}
	return nil
}

// Grant gives key amount milli-units of extra quota for its current window
// on Redis's clock (see algorithms.Limit.Grant), and returns the decision
// one event would then get. Every instance sees it: it is in the key's
// state. An error that wraps ErrNotAnnounced says the grant was applied.
func (z *zone) Grant(ctx context.Context, key string, now, amount int64) (algorithms.Decision, error) {
	d, _, err := z.GrantOnce(ctx, key, now, amount, "")
	return d, err
}

// GrantOnce is Grant for a grant with an id (none if ""): a grant whose id
// was applied to the key in this zone within storage.Horizon (its window,
// and more) applies nothing, on any instance, and reports applied false.
// The id is kept in Redis by the grant's own script, so that a grant and
// its id are applied together or not at all. An error that wraps
// ErrNotAnnounced says the grant was applied, but the other instances
// were not told of it (see OnGrant).
//
// A grant sent again with an id whose earlier call through this store
// failed (its answer may have been lost after Redis applied it) and that
// Redis finds applied already is the first answer this process gets for
// it: it is announced and reported applied, once, so that the caller
// logs and emits it. A grant whose answer was lost and that is sent again
// to another instance is reported repeated there.
func (z *zone) GrantOnce(ctx context.Context, key string, now, amount int64, id string) (d algorithms.Decision, applied bool, err error) {
	if !z.limit.Grantable() {
		return d, false, fmt.Errorf("redis store: grant %q: %w", z.name, algorithms.ErrNoGrant)
	}
	amount = min(max(amount, 0), z.limit.GrantCap())
	rkey := z.store.key(key, z.tail)
	if id == "" {
		d, err = z.runKey(ctx, opGrant, rkey, now, amount, algorithms.Decision{})
	} else {
		d, err = z.grantOnce(ctx, rkey, now, amount, id)
	}
	switch {
	case errors.Is(err, errGranted):
		d, _, err = z.Peek(ctx, key, now)
		if err != nil || !z.store.unanswered.answer(rkey, id) {
			return d, false, err
		}
		// Applied by an earlier call whose answer was lost: announced
		// and reported now.
	case err != nil:
		if id != "" {
			z.store.unanswered.add(rkey, id, storage.Horizon(&z.limit))
		}
		return d, false, fmt.Errorf("redis store: grant %q: %w", z.name, err)
	case id != "":
		z.store.unanswered.answer(rkey, id) // an earlier call, if any, never ran
	}
	if err := z.store.announce(ctx, rkey, amount); err != nil {
		return d, true, fmt.Errorf("redis store: grant %q: %w", z.name, err)
	}
	return d, true, nil
}

// errGranted is grantOnce's error for an id applied already.
var errGranted = errors.New("granted already")

// grantOnce runs a grant with its id key (see single.lua).
func (z *zone) grantOnce(ctx context.Context, rkey string, now, amount int64, id string) (algorithms.Decision, error) {
	c := newCall(z.script, z.store.fns.fcall(), 2)
	keep := (storage.Horizon(&z.limit) + 999) / 1000 // ms
	c.args = append(c.args, rkey, rkey+"!grant:"+id, word(opGrant), z.store.clock(now), z.store.ttlSlack, amount, 0, 0)
	c.args = append(c.args, z.constsAt(now)...)
	c.args = append(c.args, keep)
	v, err := z.store.run.run(ctx, c)
	switch {
	case err != nil:
		return algorithms.Decision{}, err
	case len(v) == 1 && v[0] == -1:
		return algorithms.Decision{}, errGranted
	case len(v) != 6:
		return algorithms.Decision{}, fmt.Errorf("%w: %v", errReply, v)
	}
	return decision(v), nil
}

var _ storage.Granter = (*zone)(nil)

// Forget drops key's rejection from this store's deny cache, here only:
// a grant made through another store on the same Redis, in this process,
// has been published to every instance, and this one need not wait for
// the message to admit the key.
func (z *zone) Forget(key string) {
	if z.store.deny != nil {
		z.store.deny.forget(z.store.key(key, z.tail))
	}
}

var _ storage.OnceGranter = (*zone)(nil)
