package redis

import (
	"context"
	"fmt"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// opOwe is the op of a settlement's excess (see common.lua).
const opOwe = "o"

// Settle settles the Take for key whose Decision is taken, which reserved
// milli-units, to actual milli-units, as one script run on the server (see
// algorithms.Limit.Settle): an undo of the difference, or an owe of the
// excess (op 'o', the twin of Limit.Owe). A settlement that changes
// nothing (the same cost, or an excess a sliding_log cannot hold) sends
// nothing, and so does a key reset at or after taken.At (the reset gave
// the reservation back and forgave what the key owed).
func (z *zone) Settle(ctx context.Context, key string, now, reserved, actual int64, taken algorithms.Decision) error {
	reserved, actual = max(reserved, 0), max(actual, 0)
	op, x := opUndo, int64(0)
	switch {
	case actual < reserved:
		x = undoAmount(&z.limit, reserved-actual)
	case actual > reserved:
		op, x = opOwe, z.limit.OweAmount(actual-reserved)
	}
	if x <= 0 || z.limit.Kind == algorithms.Concurrency || z.limit.Kind == algorithms.Ban {
		return nil
	}
	// With the key's reset mark: a key reset since taken settles nothing
	// (see single.lua).
	rkey := z.store.key(key, z.tail)
	if _, err := z.runKeys(ctx, op, rkey, true, now, x, taken); err != nil {
		return fmt.Errorf("redis store: settle %q: %w", z.name, err)
	}
	if op == opUndo {
		z.store.gaveBack(rkey)
	}
	return nil
}

var _ storage.Settler = (*zone)(nil)
