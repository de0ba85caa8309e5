package redis

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// TestTakeAllocations bounds what a decision allocates on its own round
// trip: the EVALSHA command built once, one-letter arguments and the
// script's hash boxed once for all calls, the reply read straight into
// integers, the cost of a request of cost 1 boxed once per zone.
// go-redis's generic path (Script.Run, Int64Slice) took 19; this takes 8,
// of which go-redis's command, its reply and the key are most.
func TestTakeAllocations(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix)
	zl := zoneOf(s, "allocs", mustLimit(t, algorithms.TokenBucket, 1e6, time.Hour, 0, 0))
	ctx := context.Background()
	if _, err := zl.Take(ctx, "k", 0, algorithms.Milli); err != nil {
		t.Fatal(err) // loads the script and opens the connection
	}
	var err error
	n := testing.AllocsPerRun(200, func() {
		if _, e := zl.Take(ctx, "k", 0, algorithms.Milli); e != nil {
			err = e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if n > 8 {
		t.Errorf("a Take allocates %v times, want at most 8", n)
	}
}
