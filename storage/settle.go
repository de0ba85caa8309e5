package storage

import (
	"context"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// Settler is a Limiter that can settle an admitted request's charge to its
// actual cost, found when its response is complete (count_response,
// cost_response), as one atomic step (see algorithms.Limit.Settle). The
// memory and Redis stores are Settlers; a zone with response options needs
// one.
type Settler interface {
	// Settle settles the Take for key whose Decision is taken, which
	// reserved milli-units, to actual milli-units: it gives back the
	// difference, or owes the excess past the capacity.
	Settle(ctx context.Context, key string, now, reserved, actual int64, taken algorithms.Decision) error
}
