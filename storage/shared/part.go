package shared

import (
	"context"
	"errors"
	"reflect"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// Zone is what the runtime knows of one part of a zone (its rate, its ban
// or its concurrency slots): where the part is decided.
type Zone struct {
	// Limiter is the part's limiter on the handler's store.
	Limiter storage.Limiter
	// Memory is the memory store the part is decided on in this process:
	// its limiter on the memory store, its local copy on a shared store
	// (on_storage_error local); else nil.
	Memory *memory.Store
	// Local is the part's local copy (on_storage_error local on a shared
	// store), or nil: the state the part is decided on while the shared
	// store does not answer, kept up with what the shared store decides.
	Local *memory.Store
	// Rate: the part charges a cost (a rate), given back if the request
	// does not go ahead. Slots: the part holds a concurrency slot until
	// the request ends. A ban is neither.
	Rate, Slots bool
	// DryRun: the part's rejections let the request through.
	DryRun bool
	// Settles: the part's zone settles its charge when the response is
	// complete (count_response, cost_response).
	Settles bool
	// Delays: the part's zone may delay an admitted request before it
	// goes on (a leaky_bucket with max_delay, not a dry run), and gives
	// its charge back if the request ends while it waits.
	Delays bool
	// Adaptive is the part's state when it is an adaptive concurrency
	// limit (concurrency adaptive), decided in this process by
	// AdmitAdaptive before the other parts, whatever their store; else
	// nil.
	Adaptive *Adaptive
}

// Part is one part of a request's decision: a zone part, the key and cost
// it is decided for, and what was decided. Z is the caller's own zone (the
// handler's), which the runtime carries and never reads.
type Part[Z any] struct {
	Z    Z
	Zone *Zone
	Key  string
	Cost int64 // milli-units
	// D is the decision, set by Decide.
	D algorithms.Decision
	// Limiter is the limiter that decided: the shared store's, or the
	// local copy when the shared store did not answer.
	Limiter storage.Limiter
	// Strike is 1 + the index of the zone's ban part in the request's
	// parts, or 0: a rejection here counts as a strike to that ban.
	Strike int
	// Hold is the request an adaptive part (Zone.Adaptive) admitted, in
	// flight until its End.
	Hold AdaptiveHold
}

// Charged reports whether the decision took quota that must be given back
// if the request does not go ahead. A concurrency slot is given back when
// the request ends (see SlotHold), whichever way it ends.
func (p *Part[Z]) Charged() bool {
	return p.D.Allowed && p.Cost > 0 && p.Zone.Rate && !storage.Skipped(p.D)
}

// HoldsSlot reports whether p holds a concurrency slot to give back when
// the request ends.
func (p *Part[Z]) HoldsSlot() bool {
	return p.Zone.Slots && p.D.Allowed && !storage.Skipped(p.D)
}

// Settles reports whether p is a charge to settle when the response is
// complete. A cost of 0 settles too: its excess is owed.
func (p *Part[Z]) Settles() bool {
	return p.Zone.Settles && p.Zone.Rate && p.D.Allowed && !storage.Skipped(p.D)
}

// Waits reports whether p admitted its request with a delay to wait
// before it goes on (see Zone.Delays).
func (p *Part[Z]) Waits() bool {
	return p.Zone.Delays && p.D.Allowed && p.D.Delay > 0 && !storage.Skipped(p.D)
}

// localSlot is the local copy that a slot p holds on the shared store is
// also counted in (see countSlots), or nil: a part of on_storage_error
// local whose slot the shared store gave. A slot its local copy gave (the
// shared store did not answer) is counted there alone.
func (p *Part[Z]) localSlot() *memory.Store {
	if p.Zone.Local == nil || p.Limiter == storage.Limiter(p.Zone.Local) {
		return nil
	}
	return p.Zone.Local
}

// Reset forgets key in the part at now: on its store, then in its local
// copy. A concurrency part's slots are requests in flight, which a reset
// keeps (they are running, not history): Reset only reads whether it
// holds any. found reports whether the part held the key. An error that
// wraps redisstore.ErrNotAnnounced says the reset was applied, and not
// announced to the other instances.
func (z *Zone) Reset(ctx context.Context, key string, now int64) (found bool, err error) {
	if z.Slots {
		_, found, err = z.Limiter.Peek(ctx, key, now)
		return found, err
	}
	found, err = z.Limiter.Reset(ctx, key, now)
	if err != nil && !errors.Is(err, redisstore.ErrNotAnnounced) {
		return false, err
	}
	if ok, _ := z.ResetLocal(ctx, key, now); ok {
		found = true
	}
	return found, err
}

// Resets makes the resets of one admin call: each part's store once, as
// a grant is made once (see GrantScope). A zone that several handlers
// define on one Redis, each with its own client, is reset through the
// first client that applies it, the other handlers' parts only following
// it in their local copies. A client that fails (its breaker still open
// while another's has seen Redis answer again) says nothing about the
// reset: the next handler's client tries. Without this, a reset applied
// through one client was answered as failed when the next one's breaker
// was open. Keys are a part's scope and role; values are the last
// failure, nil once applied.
type Resets map[[2]any]error

// Reset resets key in part z (role: its role in its zone, which tells a
// zone's parts apart) at now, unless another part of the same scope and
// role applied it. An error that wraps redisstore.ErrNotAnnounced says the
// reset was applied; any other is kept for Err.
func (rs Resets) Reset(ctx context.Context, z *Zone, role any, key string, now int64) (found bool, err error) {
	scope := [2]any{GrantScope(z.Limiter), role}
	if t := reflect.TypeOf(scope[0]); t != nil && !t.Comparable() {
		scope[0] = z // no map key: this part's own
	}
	if err, tried := rs[scope]; tried && err == nil {
		return z.ResetLocal(ctx, key, now)
	}
	found, err = z.Reset(ctx, key, now)
	if rs[scope] = err; errors.Is(err, redisstore.ErrNotAnnounced) {
		rs[scope] = nil
	}
	return found, err
}

// Err is a failure of a part no client applied the reset to, or nil.
func (rs Resets) Err() error {
	for _, err := range rs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ResetLocal forgets key in the part's local copy only, if it has one:
// the part's shared store was reset through another client on the same
// keys. found reports whether the local copy held the key. A concurrency
// part keeps its slots (see Reset).
func (z *Zone) ResetLocal(ctx context.Context, key string, now int64) (found bool, err error) {
	if z.Local == nil || z.Slots {
		return false, nil
	}
	return z.Local.Reset(ctx, key, now)
}
