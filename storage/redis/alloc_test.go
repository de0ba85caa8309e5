package redis

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// TestTakeAllocations bounds what a decision allocates on its own round
// trip, and through the batcher (a batch of one, so that what a batch
// allocates once counts for it too): the command built once in a recycled
// call (its arguments' array and go-redis's command with it), one-letter
// arguments and the script's hash boxed once for all calls, the reply read
// straight into integers, the cost of a request of cost 1 boxed once per
// zone. go-redis's generic path (Script.Run, Int64Slice) took 19; this
// takes 6, of which the key (built, then boxed), go-redis's reply and its
// connection check are most.
func TestTakeAllocations(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range []struct {
		name      string
		pipelined bool
		want      float64
	}{
		{"direct", false, 6},
		// A batch of one, which pays alone what about a dozen calls
		// share under load: the batch's list, the pipeline's list of
		// commands, and go-redis's connection check (3) and error check
		// (2) on each pipeline.
		{"batched", true, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New(srv.Client(), DefaultPrefix)
			if c.pipelined {
				s = NewPipelined(srv.Client(), DefaultPrefix)
				defer s.Close()
			}
			zl := zoneOf(s, "allocs", mustLimit(t, algorithms.TokenBucket, 1e6, time.Hour, 0, 0))
			ctx := context.Background()
			if _, err := zl.Take(ctx, "k", 0, algorithms.Milli); err != nil {
				t.Fatal(err) // loads the script and opens the connection
			}
			if c.pipelined {
				// A call in flight: the next ones go through the batcher.
				s.batch.inflight.Add(1)
				defer s.batch.inflight.Add(-1)
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
			if c.pipelined && s.batch.sent.Load() == 0 {
				t.Fatal("no batch sent: the calls did not go through the batcher")
			}
			if n > c.want {
				t.Errorf("a Take allocates %v times, want at most %v", n, c.want)
			}
			t.Logf("%v allocations a Take", n)
		})
	}
}
