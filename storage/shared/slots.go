package shared

import (
	"context"
	"fmt"

	"github.com/caddy-tollgate/tollgate/algorithms"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// countSlots counts in each concurrency part's local count (on_storage_error
// local) the slot Redis just gave the request, parts, decided at now and
// admitted. A part's local count holds every request of the key this
// instance has in flight, those Redis admitted and those it admitted on
// its own while Redis did not answer, so that the instance never runs
// more than the part's limit at once, through an outage and back (Redis's
// count may lack the latter, or have let the former's leases lapse). A
// part whose local count is full rejects the request: it returns that
// part's index, with the local count's rejection as its decision, having
// given back everything the request took, in Redis and here; or -1. A
// dry-run part's rejection only gives back its own slot.
func countSlots[Z any](ctx context.Context, now int64, parts []Part[Z]) int {
	for i := range parts {
		p := &parts[i]
		m := p.localSlot()
		if m == nil || !p.HoldsSlot() {
			continue
		}
		d, _ := m.Take(ctx, p.Key, now, algorithms.Milli)
		if d.Allowed {
			continue
		}
		ctx := context.WithoutCancel(ctx)
		if p.Zone.DryRun {
			_ = p.Limiter.Undo(ctx, p.Key, now, algorithms.Milli, p.D)
			p.D = d
			continue
		}
		for j := range parts {
			o := &parts[j]
			switch {
			case j == i:
				_ = o.Limiter.Undo(ctx, o.Key, now, algorithms.Milli, o.D)
			case o.HoldsSlot():
				if m := o.localSlot(); m != nil && j < i {
					_ = m.Undo(ctx, o.Key, now, algorithms.Milli, o.D)
				}
				_ = o.Limiter.Undo(ctx, o.Key, now, algorithms.Milli, o.D)
			case o.Charged():
				_ = o.Limiter.Undo(ctx, o.Key, now, o.Cost, o.D)
			}
		}
		p.D = d
		return i
	}
	return -1
}

// SlotHold is the concurrency slots an admitted request holds until it
// ends. A slot in Redis is a lease, which the store renews while it is
// held (one loop per store, see redisstore.Lease), and whose client stays
// open until it is given back, whatever reload comes meanwhile.
type SlotHold[Z any] struct {
	slots []heldSlot[Z]
	buf   [2]heldSlot[Z] // slots' first backing array
}

// heldSlot is one slot a request holds.
type heldSlot[Z any] struct {
	part  Part[Z]           // a copy: the request's parts stay on its stack
	lease *redisstore.Lease // renewed while held; nil in memory
	pool  *Pool             // kept open while held; nil in memory
}

// HoldSlots holds the slots parts hold (renewing those that are leases)
// and returns what Release gives back, or nil when they hold none.
func HoldSlots[Z any](parts []Part[Z]) *SlotHold[Z] {
	var hold *SlotHold[Z]
	for i := range parts {
		p := &parts[i]
		if !p.HoldsSlot() {
			continue
		}
		if hold == nil {
			hold = new(SlotHold[Z])
			hold.slots = hold.buf[:0]
		}
		s := heldSlot[Z]{part: *p}
		if l, ok := p.Limiter.(*Limiter); ok {
			s.pool, s.lease = l.hold(p.Key, p.D)
		}
		hold.slots = append(hold.slots, s)
	}
	return hold
}

// Release gives back the slots at now, however the request ended: the
// handler chain returned, failed, panicked, or the client went away. Each
// slot is given back where it was taken: its local count first, then
// Redis, so that the local count never holds a slot that Redis no longer
// does but for a request still running. failed is told of each give-back
// that fails.
func (s *SlotHold[Z]) Release(ctx context.Context, now int64, failed func(z Z, err error)) {
	ctx = context.WithoutCancel(ctx) // the client may be gone
	for i := range s.slots {
		hs := &s.slots[i]
		p := &hs.part
		hs.lease.Release()
		if m := p.localSlot(); m != nil {
			_ = m.Undo(ctx, p.Key, now, algorithms.Milli, p.D)
		}
		if err := p.Limiter.Undo(ctx, p.Key, now, algorithms.Milli, p.D); err != nil {
			failed(p.Z, fmt.Errorf("giving back a concurrency slot: %w", err))
		}
		if hs.pool != nil {
			hs.pool.release()
		}
	}
}
