package shared

import (
	"context"
	"fmt"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// InlineParts is how many parts a decision tracks without allocating (the
// arrays of a multi-part decision are on its stack).
const InlineParts = 8

// Store is a handler's store runtime: the one place a request's parts are
// decided, settled and given back, whichever store holds them. Z is the
// handler's zone type, which the parts carry.
//
// It is a struct that switches over the stores it knows (Redis through a
// Pool, the memory store, another package's storage.Limiter), not an
// interface: a request's parts live in an array on the handler's stack,
// and a slice of them passed to an interface method would escape to the
// heap, one allocation per request. This switch is the only one.
type Store[Z any] struct {
	// Pool is the Redis client the handler's zones are on, or nil.
	Pool *Pool
	// Memory: the zones are on the memory store (each part's
	// Zone.Memory).
	Memory bool
	// Clock is the handler's clock, which a local copy follows a grant
	// another instance announced at.
	Clock func() int64
	// slotCopies: a concurrency part on Pool keeps a local count of its
	// slots too (on_storage_error local, see countSlots).
	slotCopies bool
}

// Decide decides all of a request's parts as one step, at now: every part
// is charged if every part that is not a dry run admits the request, none
// otherwise. It fills each part's decision and limiter and returns the
// index of the first rejecting part that is not a dry run, or -1. When err
// is not nil, nothing was decided and nothing is charged.
func (s *Store[Z]) Decide(ctx context.Context, now int64, parts []Part[Z]) (rejected int, err error) {
	switch {
	case s.Pool != nil:
		return s.takeAll(ctx, now, parts)
	case s.Memory:
		return DecideLocal(now, parts), nil
	}
	return takeEach(ctx, now, parts)
}

// DecideLocal decides parts as one step on their memory stores
// (Zone.Memory, which every part passed here has: the memory store, or a
// local copy while the shared store does not answer) and returns the index
// of the first rejecting part that is not a dry run, or -1.
func DecideLocal[Z any](now int64, parts []Part[Z]) int {
	if len(parts) == 1 {
		// One zone, one part: no arrays for TakeAll on the stack (a
		// request's goroutine runs deep in Caddy's handler chain, and a
		// larger frame can make its stack grow, again after every GC
		// shrinks it).
		p := &parts[0]
		p.D, _ = p.Zone.Memory.Take(context.Background(), p.Key, now, p.Cost)
		p.Limiter = p.Zone.Memory
		if !p.D.Allowed && !p.Zone.DryRun {
			return 0
		}
		return -1
	}
	return decideLocalAll(now, parts)
}

// decideLocalAll is DecideLocal for several parts. It is a function of
// its own so that DecideLocal's frame, on the path of every request with
// one zone, holds none of its arrays.
//
//go:noinline
func decideLocalAll[Z any](now int64, parts []Part[Z]) int {
	var rbuf [InlineParts]memory.Request
	var dbuf [InlineParts]algorithms.Decision
	reqs, ds := rbuf[:0], dbuf[:]
	if len(parts) > InlineParts {
		ds = make([]algorithms.Decision, len(parts))
	}
	for i := range parts {
		p := &parts[i]
		reqs = append(reqs, memory.Request{Store: p.Zone.Memory, Key: p.Key, Cost: p.Cost, DryRun: p.Zone.DryRun, Strike: p.Strike})
	}
	rejected := memory.TakeAll(now, reqs, ds)
	for i := range parts {
		parts[i].D, parts[i].Limiter = ds[i], parts[i].Zone.Memory
	}
	return rejected
}

// takeEach decides parts on a store that cannot decide several as one
// step (a storage module of another package): part by part, giving back
// what earlier parts took when one rejects or fails, so that a rejected
// request stays charged nowhere once the decision returns. The parts after
// a rejecting one are not consulted.
func takeEach[Z any](ctx context.Context, now int64, parts []Part[Z]) (int, error) {
	for i := range parts {
		p := &parts[i]
		d, err := p.Zone.Limiter.Take(ctx, p.Key, now, p.Cost)
		if err != nil {
			Undo(ctx, parts[:i], now)
			return -1, err
		}
		p.D, p.Limiter = d, p.Zone.Limiter
		if !d.Allowed && !p.Zone.DryRun {
			Undo(ctx, parts[:i], now)
			for j := i + 1; j < len(parts); j++ {
				parts[j].D = algorithms.Decision{Allowed: true}
			}
			return i, nil
		}
	}
	return -1, nil
}

// Undo gives back what the charged parts took, and returns the zone and
// error of the last give-back that failed.
func Undo[Z any](ctx context.Context, parts []Part[Z], now int64) (failed Z, err error) {
	for i := range parts {
		p := &parts[i]
		if !p.Charged() {
			continue
		}
		if e := p.Limiter.Undo(ctx, p.Key, now, p.Cost, p.D); e != nil {
			failed, err = p.Z, e
		}
	}
	return failed, err
}

// takeAll decides parts on Redis as one step. It uses the store's
// TakeAll: one atomic script where the parts' keys can share one (always
// on a standalone or Sentinel Redis; on a Cluster when they hash to one
// slot). It goes through the same breaker and timeout as a single Take.
func (s *Store[Z]) takeAll(ctx context.Context, now int64, parts []Part[Z]) (rejected int, err error) {
	pool := s.Pool
	if len(parts) == 1 && fromLease(pool, &parts[0]) {
		if s.slotCopies {
			return countSlots(ctx, now, parts), nil
		}
		return -1, nil
	}
	var buf [InlineParts]redisstore.Request
	reqs := buf[:0]
	holding := false
	for i := range parts {
		p := &parts[i]
		lim, ok := p.Zone.Limiter.(*Limiter)
		if !ok {
			return -1, fmt.Errorf("part %d of the request is not on this Redis storage", i)
		}
		reqs = append(reqs, redisstore.Request{Zone: lim.inner, Key: p.Key, Cost: p.Cost, DryRun: p.Zone.DryRun, Strike: p.Strike})
		holding = holding || p.Zone.Settles || p.Zone.Delays
	}
	if holding {
		// A request to settle when its response is complete, or that
		// waits for its place and gives it back if it ends meanwhile,
		// holds the client open until it has settled or gone on (see
		// Holds and Settled): a reload may retire the client meanwhile.
		if pool.acquire() {
			defer func() {
				if err != nil || rejected >= 0 || !Holds(parts) {
					pool.release()
				}
			}()
		}
	}
	// Redis decides by its own clock; the store's deny cache times its
	// entries by this instance's monotonic one (the handler's now may be
	// a test's fake clock).
	var v redisstore.Verdict
	err = pool.rt.Breaker.Do(ctx, func() (bool, error) {
		var err error
		v, err = pool.store.Decide(pool.rt.Deadline(), Micros(), reqs)
		return v.Decided, err // a request the deny cache answered says nothing of Redis
	})
	if err != nil {
		return -1, err
	}
	for i := range parts {
		parts[i].D, parts[i].Limiter = v.Decisions[i], parts[i].Zone.Limiter
	}
	if v.Decided {
		follow(pool, now, v.Clock, parts, v.Rejected < 0)
	}
	if v.Rejected < 0 && s.slotCopies {
		return countSlots(ctx, now, parts), nil
	}
	return v.Rejected, nil
}

// fromLease decides p, a request's only part, from its key's quota lease
// on this instance (see redisstore.Store.FromLease), if it can: as the
// store's Decide would through the breaker, without a round trip, but
// building no request for it. Not while the breaker is open (the zone's
// on_storage_error decides then, leases aside: docs/redis.md), nor for a
// zone that holds the client for a settlement or a wait.
func fromLease[Z any](pool *Pool, p *Part[Z]) bool {
	lim, ok := p.Zone.Limiter.(*Limiter)
	if !ok || p.Zone.Settles || p.Zone.Delays || p.Strike != 0 || pool.rt.Breaker.Down() {
		return false
	}
	d, ok := pool.store.FromLease(lim.inner, p.Key, p.Cost)
	if ok {
		p.D, p.Limiter = d, p.Zone.Limiter
	}
	return ok
}

// Settles reports whether a part of a zone with response options admitted
// the request and charged it: its charge is to be settled.
func Settles[Z any](parts []Part[Z]) bool {
	for i := range parts {
		if parts[i].Settles() {
			return true
		}
	}
	return false
}

// Settle settles, at now, each of parts that settles (see Part.Settles)
// to the cost actual finds for it (from its zone and reserved cost), once
// its response is complete: a part whose actual cost is its reservation
// has nothing to settle. failed is told of each settlement that failed
// and was not kept. actual and failed are given values, not the parts:
// a pointer into parts passed to a function value would make the parts,
// on the handler's stack, escape to the heap.
func Settle[Z any](ctx context.Context, now int64, parts []Part[Z], actual func(z Z, reserved int64) int64, failed func(z Z, err error)) {
	for i := range parts {
		p := &parts[i]
		if !p.Settles() {
			continue
		}
		a := actual(p.Z, p.Cost)
		if a == p.Cost {
			continue
		}
		if err := p.Settle(ctx, now, a); err != nil {
			failed(p.Z, err)
		}
	}
}

// Settle settles p, which reserved p.Cost, to actual on the limiter that
// decided it: as one step on a storage.Settler, else (a store of another
// package, count_response only) by giving back with Undo.
func (p *Part[Z]) Settle(ctx context.Context, now, actual int64) error {
	if s, ok := p.Limiter.(storage.Settler); ok {
		return s.Settle(ctx, p.Key, now, p.Cost, actual, p.D)
	}
	if actual < p.Cost {
		return p.Limiter.Undo(ctx, p.Key, now, p.Cost-actual, p.D)
	}
	return nil
}

// Holds reports whether an admitted request holds the client its parts
// were decided on until Settled: a part settles (see Settles), or waits
// for its place (see Part.Waits), whose give-back, if the request ends
// while it waits, must reach the store through that client.
func Holds[Z any](parts []Part[Z]) bool {
	for i := range parts {
		if parts[i].Settles() || parts[i].Waits() {
			return true
		}
	}
	return false
}

// Settled ends what Decide began for a request that Holds, once its
// settlements are made (or kept) and its wait is over: the client it
// decided on may close.
func (s *Store[Z]) Settled(parts []Part[Z]) {
	if s.Pool == nil {
		return
	}
	for i := range parts {
		if _, ok := parts[i].Limiter.(*Limiter); ok {
			s.Pool.release()
			return
		}
	}
}

// follow keeps the local copies of on_storage_error local up with what
// Redis decided for a request read at now, at clock on Redis's clock (0:
// no decision of the request carried Redis's time, see
// redisstore.Verdict), charged telling whether it was admitted: Redis's
// clock's lead, and each part's state, so that a decision Redis cannot
// make in time goes on from where the shared state stood at this
// instance's last decision on the key, not from a fresh key. The local
// copies follow this instance's decisions only: what other instances take
// meanwhile, this one learns at its next decision.
func follow[Z any](pool *Pool, now, clock int64, parts []Part[Z], charged bool) {
	if clock != 0 {
		pool.lead.Store(clock - now)
	}
	for i := range parts {
		p := &parts[i]
		if storage.Skipped(p.D) {
			continue // a zone its ban answered for: not decided
		}
		if p.Zone.Local != nil {
			p.Zone.Local.Seed(p.Key, p.D, p.Cost, charged && p.D.Allowed)
		}
	}
}

// Follow makes z.Local the local copy of z's state on the shared store
// (see follow): kept on Redis's clock, given back what Redis gives back,
// and reset when Redis is (see Limiter.resetLocal). A part on another
// store, or without a local copy, keeps none. It is called once per part
// at provisioning.
func (s *Store[Z]) Follow(z *Zone) {
	if s.Pool == nil || z.Local == nil {
		return
	}
	z.Local.Follow(&s.Pool.lead)
	l, ok := z.Limiter.(*Limiter)
	if !ok {
		return
	}
	l.local, l.clock = z.Local, s.Clock
	if z.Slots {
		s.slotCopies = true
		// A concurrency part's local store counts the requests of each
		// key this instance has in flight (see countSlots), not a copy
		// of Redis's: not seeded, not reset.
		return
	}
	l.resets = make(chan struct{}, followedResets)
	l.stopResets = s.Pool.store.OnReset(l.inner, l.heard)
}
