package redis

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// runner runs one script call and returns its integer reply: directly, one
// round trip each, or through a batcher that shares round trips.
type runner interface {
	run(ctx context.Context, script *goredis.Script, keys []string, args []any) ([]int64, error)
}

// direct runs each script call on its own round trip (Script.Run:
// EVALSHA, EVAL on NOSCRIPT).
type direct struct{ client Client }

func (d direct) run(ctx context.Context, script *goredis.Script, keys []string, args []any) ([]int64, error) {
	return script.Run(ctx, d.client, keys, args...).Int64Slice()
}

// Pipeliner is what a batcher needs of a client: pipelines. A
// *goredis.Client, *goredis.ClusterClient (whose pipelines go to each
// key's node) and goredis.UniversalClient have it.
type Pipeliner interface {
	Pipeline() goredis.Pipeliner
}

// batcher shares network round trips among concurrent script calls: calls
// that arrive while its workers are busy wait in a queue, and a free worker
// sends all of them (up to maxBatch) as one pipeline. Each call is still
// one script, run atomically on the server by the server's clock, so
// batching changes no decision; it only saves the round trips and the
// server's reads and writes per call. A lone call goes at once, alone.
//
// A call's context bounds its wait: a caller whose deadline passes returns
// at once, though its script may still run when its batch goes out (as a
// script whose reply was lost may have run).
//
// A call made while no other is in flight has no one to share a round trip
// with: it runs directly, as without a batcher, and costs no hand-off to a
// worker (a lone caller's latency is that of an unbatched call).
type batcher struct {
	client interface {
		Client
		Pipeliner
	}
	inflight atomic.Int64 // calls in run
	calls    chan *call
	maxBatch int
	stop     chan struct{}
	stopped  sync.WaitGroup
	once     sync.Once
}

// call is one script call waiting for its batch.
type call struct {
	ctx    context.Context
	script *goredis.Script
	keys   []string
	args   []any
	v      []int64
	err    error
	done   chan struct{}
}

// batchWorkers is how many batches may be in flight at once; maxBatch how
// many calls one carries.
const (
	batchWorkers = 4
	maxBatch     = 128
)

// newBatcher starts a batcher's workers; close stops them.
func newBatcher(client interface {
	Client
	Pipeliner
}) *batcher {
	b := &batcher{client: client, calls: make(chan *call, 4*maxBatch), maxBatch: maxBatch, stop: make(chan struct{})}
	for range batchWorkers {
		b.stopped.Add(1)
		go b.work()
	}
	return b
}

func (b *batcher) run(ctx context.Context, script *goredis.Script, keys []string, args []any) ([]int64, error) {
	select {
	case <-b.stop:
		return nil, goredis.ErrClosed
	default:
	}
	defer b.inflight.Add(-1)
	if b.inflight.Add(1) == 1 {
		return direct{b.client}.run(ctx, script, keys, args)
	}
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	select {
	case b.calls <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.stop:
		return nil, goredis.ErrClosed
	}
	select {
	case <-c.done:
		return c.v, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.stop:
		// Closed: the workers are gone, or going, and a call queued
		// after close drained the queue would wait forever.
		return nil, goredis.ErrClosed
	}
}

// close stops the workers; calls still queued fail with ErrClosed.
func (b *batcher) close() {
	b.once.Do(func() {
		close(b.stop)
		b.stopped.Wait()
		for {
			select {
			case c := <-b.calls:
				c.err = goredis.ErrClosed
				close(c.done)
			default:
				return
			}
		}
	})
}

func (b *batcher) work() {
	defer b.stopped.Done()
	batch := make([]*call, 0, b.maxBatch)
	for {
		select {
		case <-b.stop:
			return
		case c := <-b.calls:
			batch = append(batch[:0], c)
		}
	more:
		for len(batch) < b.maxBatch {
			select {
			case c := <-b.calls:
				batch = append(batch, c)
			default:
				break more
			}
		}
		b.send(batch)
		clear(batch)
	}
}

// send runs a batch as one pipeline of EVALSHA, then, for the calls that
// found their script missing (a restarted or new server), one of EVAL. Its
// deadline is the latest of its calls' (those whose caller went away are
// skipped).
func (b *batcher) send(batch []*call) {
	live := batch[:0]
	var latest time.Time
	bounded := true // every live call has a deadline
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done)
			continue
		}
		if dl, ok := c.ctx.Deadline(); !ok {
			bounded = false
		} else if dl.After(latest) {
			latest = dl
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	cmds := b.pipeline(ctx, live, func(p goredis.Pipeliner, c *call) *goredis.Cmd {
		return c.script.EvalSha(ctx, p, c.keys, c.args...)
	})
	var missing []*call
	for i, c := range live {
		c.v, c.err = cmds[i].Int64Slice()
		if c.err != nil && strings.HasPrefix(c.err.Error(), "NOSCRIPT") {
			missing = append(missing, c)
			continue
		}
		close(c.done)
	}
	if len(missing) == 0 {
		return
	}
	cmds = b.pipeline(ctx, missing, func(p goredis.Pipeliner, c *call) *goredis.Cmd {
		return c.script.Eval(ctx, p, c.keys, c.args...)
	})
	for i, c := range missing {
		c.v, c.err = cmds[i].Int64Slice()
		close(c.done)
	}
}

// pipeline queues one command per call and sends them.
func (b *batcher) pipeline(ctx context.Context, calls []*call, cmd func(goredis.Pipeliner, *call) *goredis.Cmd) []*goredis.Cmd {
	p := b.client.Pipeline()
	cmds := make([]*goredis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = cmd(p, c)
	}
	_, _ = p.Exec(ctx) // each command carries its own error
	return cmds
}
