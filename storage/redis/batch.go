package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// runner runs one script call and returns its integer reply: directly, one
// round trip each, or through a batcher that shares round trips. It takes
// c (from newCall) over, and recycles it unless the call's caller leaves
// it to a batch still on its way.
type runner interface {
	run(ctx context.Context, c *call) ([]int64, error)
}

// call is one script call: its command, built in the call's own buffer
// (args is "evalsha" and the script's hash, or "fcall" and its function's
// name, the number of keys, the keys, the script's arguments), the
// go-redis command that carries it, and, through a batcher, its wait for
// its batch. Calls are recycled: a decision allocates neither its
// arguments' array nor its command.
type call struct {
	ctx  context.Context
	sc   *script
	args []any
	buf  [callArgs]any
	cmd  goredis.IntSliceCmd
	v    []int64
	err  error
	done chan struct{} // one send when v and err are set (buffered: never blocks)
	// await: the call gives back or settles (an undo, an owed excess),
	// which must not be lost: its caller waits for its batch's verdict
	// past its own deadline (see batcher.run).
	await bool
}

// callArgs is the room a call's buffer has for its command: a one-key
// script's 3 + 7 + 4 constants, or multi.lua's for two zones (3 + 2 keys +
// 3 + 2 × 11); a longer command (more zones in one script) grows past it.
const callArgs = 32

// calls recycles the calls whose callers took their replies: a call whose
// caller went away may still be in a queue or a batch, and is left to the
// garbage collector.
var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// newCall returns a call of sc, whose args start its EVALSHA command with
// nkeys keys (boxed once), or its FCALL if fcall; the caller appends the
// keys and arguments.
func newCall(sc *script, fcall bool, nkeys int) *call {
	c := calls.Get().(*call)
	c.sc = sc
	c.args = append(c.buf[:0], "evalsha", sc.hash, nil)
	if fcall {
		c.args[0], c.args[1] = "fcall", sc.fn
	}
	if nkeys == 1 {
		c.args[2] = oneKey
	} else {
		c.args[2] = nkeys
	}
	return c
}

// release recycles c once its caller has its reply.
func (c *call) release() {
	*c = call{done: c.done}
	calls.Put(c)
}

// oneKey is the key count of a one-key script, boxed once.
var oneKey any = "1"

// reply returns what c's command got (v and err of its Result).
func (c *call) reply() ([]int64, error) { return c.cmd.Result() }

// prepare sets c's command up to run args (c.args, or the same as EVAL),
// its first key marked for a Cluster client's routing: go-redis finds it
// in EVAL and EVALSHA, but not in FCALL.
func (c *call) prepare(ctx context.Context, args []any) *goredis.IntSliceCmd {
	c.cmd = *goredis.NewIntSliceCmd(ctx, args...)
	c.cmd.SetFirstKeyPos(3)
	return &c.cmd
}

// withSource returns an EVALSHA or FCALL command as EVAL of the script's
// source, for a server that does not have the script (NOSCRIPT) or the
// function yet.
func withSource(sc *script, args []any) []any {
	return append([]any{"eval", sc.src}, args[2:]...)
}

// noScript reports whether err is Redis's NOSCRIPT.
func noScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// missing reports whether err says that the server lacks the script or
// the function a call named, which then runs as EVAL; fns learns of a
// missing function.
func missing(err error, fns *functions) bool {
	if noScript(err) {
		return true
	}
	if noFunction(err) {
		fns.lost()
		return true
	}
	return false
}

// direct runs each script call on its own round trip: EVALSHA (or FCALL),
// and EVAL when the server lacks the script, as go-redis's Script.Run
// does. The reply is read straight into integers (an IntSliceCmd),
// without go-redis's generic reply values.
type direct struct {
	client Client
	fns    *functions // nil: no functions
}

func (d direct) run(ctx context.Context, c *call) ([]int64, error) {
	defer c.release()
	_ = d.client.Process(ctx, c.prepare(ctx, c.args))
	v, err := c.reply()
	if missing(err, d.fns) {
		_ = d.client.Process(ctx, c.prepare(ctx, withSource(c.sc, c.args)))
		v, err = c.reply()
	}
	return v, err
}

// Pipeliner is what a batcher needs of a client: pipelines. A
// *goredis.Client, *goredis.ClusterClient (whose pipelines go to each
// key's node) and goredis.UniversalClient have it.
type Pipeliner interface {
	Pipeline() goredis.Pipeliner
}

// batcher shares network round trips among concurrent script calls: calls
// wait in a queue, and a dispatcher gathers them into batches that its
// senders send, each as one pipeline (up to maxBatch calls). Each call is
// still one script, run atomically on the server by the server's clock, so
// batching changes no decision; it only saves the round trips and the
// server's reads and writes per call.
//
// A call made while no other is in flight has no one to share a round trip
// with: it runs directly, as without a batcher, and costs no hand-off (a
// lone caller's latency is that of an unbatched call). When no batch is in
// flight, the calls queued go at once. While one is, the dispatcher holds
// the calls that arrive until that batch returns or shareBatch of them are
// waiting, whichever comes first: a call waits no longer than behind a
// single sender, and the calls that arrive meanwhile share its round trip,
// which saves this instance and the server a network write and read for
// each of them. Batches run side by side only when calls come faster than
// one batch at a time serves them (a slow or distant server, or many
// callers), and then up to batchSenders at once.
//
// A call's context bounds its wait: a caller whose deadline passes returns
// at once, though its script may still run when its batch goes out (as a
// script whose reply was lost may have run).
type batcher struct {
	client interface {
		Client
		Pipeliner
	}
	fns      *functions   // nil: no functions
	inflight atomic.Int64 // calls in run
	calls    chan *call
	batches  chan []*call  // from the dispatcher to the senders
	landed   chan struct{} // from the senders: a batch has returned
	sent     atomic.Int64  // batches sent (read by tests)
	combined atomic.Int64  // calls of the batch function (read by tests)
	joined   atomic.Int64  // the one-key calls they carried (read by tests)
	profiles atomic.Int64  // the profiles they carried (read by tests)
	combine  bool          // one server: combine one-key calls (see outbox.send)
	apart    atomic.Bool   // the server refused a combined call's keys: no more combining
	stop     chan struct{}
	stopped  sync.WaitGroup
	once     sync.Once
}

// finish hands c its reply.
func (c *call) finish() { c.done <- struct{}{} }

// fail finishes every call of batch with err.
func fail(batch []*call, err error) {
	for _, c := range batch {
		c.err = err
		c.finish()
	}
}

// batchSenders is how many batches may be in flight at once; maxBatch how
// many calls one carries; shareBatch how many calls go at once while
// another batch is in flight.
const (
	batchSenders = 4
	maxBatch     = 128
	shareBatch   = 16
)

// newBatcher starts a batcher's dispatcher and senders; close stops them.
func newBatcher(client interface {
	Client
	Pipeliner
}) *batcher {
	b := &batcher{
		client:  client,
		calls:   make(chan *call, 4*maxBatch),
		batches: make(chan []*call),
		landed:  make(chan struct{}, batchSenders),
		stop:    make(chan struct{}),
	}
	b.stopped.Add(1 + batchSenders)
	go b.dispatch()
	for range batchSenders {
		go b.sender()
	}
	return b
}

func (b *batcher) run(ctx context.Context, c *call) ([]int64, error) {
	select {
	case <-b.stop:
		c.release()
		return nil, goredis.ErrClosed
	default:
	}
	defer b.inflight.Add(-1)
	if b.inflight.Add(1) == 1 {
		return direct{b.client, b.fns}.run(ctx, c)
	}
	c.ctx = ctx
	select {
	case b.calls <- c: // the queue has room: no need to watch ctx and stop
	default:
		select {
		case b.calls <- c:
		case <-ctx.Done():
			c.release()
			return nil, ctx.Err()
		case <-b.stop:
			c.release()
			return nil, goredis.ErrClosed
		}
	}
	select {
	case <-c.done:
		v, err := c.v, c.err
		c.release()
		return v, err
	case <-ctx.Done():
		if !c.await {
			return nil, fmt.Errorf("%w: %w", ctx.Err(), ErrInFlight)
		}
	case <-b.stop:
		// Closed: the senders are gone, or going, and a call queued
		// after close drained the queue would wait forever.
		return nil, goredis.ErrClosed
	}
	// A give-back or a settlement whose deadline ended while it waited:
	// whether its batch was sent tells whether it may have run, and so
	// whether its caller must keep it until Redis hears it (a batch that
	// waited for a connection to a Redis that is down fails with its
	// deadline or the dial's error, a batch sent with a read's timeout).
	// The batch's own deadline, the latest of its calls', bounds the
	// wait; a call still queued is failed with its context's error as soon
	// as a sender takes it (see send), which says it was not sent.
	select {
	case <-c.done:
		v, err := c.v, c.err
		c.release()
		return v, err
	case <-b.stop:
		return nil, goredis.ErrClosed
	}
}

// close stops the dispatcher and the senders (a batch being sent is
// finished first); calls still queued fail with ErrClosed.
func (b *batcher) close() {
	b.once.Do(func() {
		close(b.stop)
		b.stopped.Wait()
		for {
			select {
			case c := <-b.calls:
				fail([]*call{c}, goredis.ErrClosed)
			default:
				return
			}
		}
	})
}

// dispatch gathers the queued calls into batches and hands them to the
// senders, as the batcher's comment describes.
func (b *batcher) dispatch() {
	defer b.stopped.Done()
	flying := 0 // batches handed to the senders that have not returned
	for {
		var batch []*call
		select {
		case <-b.stop:
			return
		case <-b.landed:
			flying--
			continue
		case c := <-b.calls:
			batch = b.drain(append(make([]*call, 0, 8), c))
		}
		for (flying > 0 && len(batch) < shareBatch) || flying == batchSenders {
			more := b.calls
			if len(batch) == maxBatch {
				more = nil // full: wait for a sender only
			}
			select {
			case <-b.stop:
				fail(batch, goredis.ErrClosed)
				return
			case <-b.landed:
				flying--
			case c := <-more:
				batch = b.drain(append(batch, c))
			}
		}
		select {
		case <-b.stop:
			fail(batch, goredis.ErrClosed)
			return
		case b.batches <- batch:
			flying++
		}
	}
}

// drain appends the calls queued, up to maxBatch, without waiting.
func (b *batcher) drain(batch []*call) []*call {
	for len(batch) < maxBatch {
		select {
		case c := <-b.calls:
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}

// sender sends the batches the dispatcher hands it, one at a time, each
// through its own pipeline (go-redis empties a pipeline when it runs it).
func (b *batcher) sender() {
	defer b.stopped.Done()
	o := outbox{p: b.client.Pipeline()}
	for {
		select {
		case <-b.stop:
			return
		case batch := <-b.batches:
			b.sent.Add(1)
			b.send(&o, batch)
			b.landed <- struct{}{} // buffered for every sender: never blocks
		}
	}
}

// outbox is what a sender reuses from one batch to the next: its pipeline,
// room for a batch's commands, which go into the pipeline in one step
// (one at a time, the pipeline's list grows a few times per batch), and
// what combining a batch's one-key calls into one takes (see combine).
type outbox struct {
	p    goredis.Pipeliner
	cmds []goredis.Cmder

	joined   []*call             // the calls combined into comb
	args     []any               // comb's arguments
	profiles [][]any             // the arguments of a call of each of comb's profiles (see profile)
	comb     goredis.IntSliceCmd // the library's batch function
}

// send queues one command per call (args returns its arguments) and sends
// them as one pipeline; each call's reply is in its command. With
// combine, the calls of the library's one-key function, when there are
// several, go as one call of its batch function instead (see batch.lua),
// and each call's command gets its part of the reply, as if it had run
// alone; a decision that raised an error gets errRunAlone. It reports
// whether the server refused to run the combined calls' keys together
// (a proxy in front of several shards, see split).
func (o *outbox) send(ctx context.Context, calls []*call, args func(*call) []any, combine bool) (apart bool) {
	o.cmds, o.joined = o.cmds[:0], o.joined[:0]
	for _, c := range calls {
		a := args(c)
		if combine && combinable(a) {
			o.joined = append(o.joined, c)
			continue
		}
		o.cmds = append(o.cmds, c.prepare(ctx, a))
	}
	if len(o.joined) == 1 { // nothing to combine it with
		c := o.joined[0]
		o.cmds = append(o.cmds, c.prepare(ctx, c.args))
		o.joined = o.joined[:0]
	}
	if len(o.joined) > 0 {
		o.cmds = append(o.cmds, o.combine(ctx))
	}
	_ = o.p.BatchProcess(ctx, o.cmds...)
	if _, err := o.p.Exec(ctx); err != nil && !isReply(err) {
		// A pipeline that failed to get a connection (a refused dial)
		// returns its error without setting it on its commands, which
		// would read as empty replies: an undo's or a settlement's,
		// which succeed with none.
		for _, cmd := range o.cmds {
			if cmd.Err() == nil {
				cmd.SetErr(err)
			}
		}
	}
	clear(o.cmds) // the commands belong to their calls, which are recycled
	if len(o.joined) > 0 {
		return o.split(ctx)
	}
	return false
}

// send runs a batch as one pipeline of EVALSHA (or FCALL, its one-key
// calls combined when b.combine), then, for the calls that found their
// script missing (a restarted or new server) and those that must run
// alone, one of EVAL. Its deadline is the latest of its calls' (those whose caller
// went away are skipped).
func (b *batcher) send(o *outbox, batch []*call) {
	live := batch[:0]
	var latest time.Time
	bounded := true // every live call has a deadline
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			c.finish()
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
	if o.send(ctx, live, func(c *call) []any { return c.args }, b.combine && !b.apart.Load()) {
		b.apart.Store(true)
	}
	if len(o.joined) > 1 {
		b.combined.Add(1)
		b.joined.Add(int64(len(o.joined)))
		b.profiles.Add(int64(len(o.profiles)))
	}
	var again []*call // the calls that found their script missing, or must run alone
	for _, c := range live {
		c.v, c.err = c.reply()
		if c.err == errRunAlone || missing(c.err, b.fns) {
			again = append(again, c)
			continue
		}
		c.finish()
	}
	if len(again) == 0 {
		return
	}
	_ = o.send(ctx, again, func(c *call) []any { return withSource(c.sc, c.args) }, false)
	for _, c := range again {
		c.v, c.err = c.reply()
		c.finish()
	}
}

// singleArgs is how many arguments a call of the library's one-key
// function has: FCALL, the function, the key count, the key and
// single.lua's 11 ARGV.
const singleArgs = 3 + 1 + 11

// combinable reports whether a are the arguments of a call of the
// library's one-key function, which the batch function can run.
func combinable(a []any) bool {
	return len(a) == singleArgs && a[0] == "fcall" && a[1] == library.single
}

// combine returns the batch function's command for o.joined: their keys,
// then each one's op, x and profile number, then the profiles, each once
// (see batch.lua).
func (o *outbox) combine(ctx context.Context) *goredis.IntSliceCmd {
	o.args = append(o.args[:0], "fcall", library.batch, len(o.joined))
	for _, c := range o.joined {
		o.args = append(o.args, c.args[3])
	}
	o.profiles = o.profiles[:0]
	for _, c := range o.joined {
		o.args = append(o.args, c.args[4], c.args[7], o.profile(c.args))
	}
	for _, a := range o.profiles {
		o.args = append(o.args, a[5], a[6], a[8], a[9])
		o.args = append(o.args, a[10:]...)
	}
	o.comb = *goredis.NewIntSliceCmd(ctx, o.args...)
	o.comb.SetFirstKeyPos(3)
	return &o.comb
}

// profile returns the number (from 1) of the profile of a, the arguments
// of a call of the one-key function, among o.profiles, which it joins if
// no profile is the same: a's arguments but its key, op and x (single.lua's
// ARGV[2, 3, 5, 6, 7..11]). A batch of at most maxBatch calls numbers its
// profiles below 256, which Go boxes without allocating.
func (o *outbox) profile(a []any) int {
	for i, p := range o.profiles {
		if p[5] == a[5] && p[6] == a[6] && p[8] == a[8] && p[9] == a[9] &&
			p[10] == a[10] && p[11] == a[11] && p[12] == a[12] && p[13] == a[13] && p[14] == a[14] {
			return i + 1
		}
	}
	o.profiles = append(o.profiles, a)
	return len(o.profiles)
}

// isReply reports whether err is an error reply of Redis's (the error of
// one command), not a failure of the connection.
func isReply(err error) bool {
	var r goredis.Error
	return errors.As(err, &r)
}

// errRunAlone marks a call whose decision raised an error in a combined
// call: it runs again on its own, which reports its error.
// ErrInFlight marks the error of a call whose deadline ended while it
// waited for its batch's reply: the batch may have been sent, and the
// call run. Any other context error of a call on one server means it got
// no connection.
var ErrInFlight = errors.New("its batch may have been sent")

var errRunAlone = errors.New("redis store: a combined decision raised an error")

// split hands each combined call its part of the batch function's reply
// (the whole call's error, if it failed) in its own command. A server that
// answers CROSSSLOT holds one address but several shards (a proxy such as
// Redis Enterprise's, or a Cluster node reached as a single server): each
// call runs again alone, and apart reports it, so that no more are
// combined.
func (o *outbox) split(ctx context.Context) (apart bool) {
	v, err := o.comb.Result()
	apart = err != nil && strings.HasPrefix(err.Error(), "CROSSSLOT")
	pos := 0
	for _, c := range o.joined {
		c.prepare(ctx, c.args)
		switch {
		case apart:
			c.cmd.SetErr(errRunAlone)
		case err != nil:
			c.cmd.SetErr(err)
		case pos >= len(v) || v[pos] < -1 || int64(len(v)-pos-1) < v[pos]:
			c.cmd.SetErr(fmt.Errorf("%w: batch reply %v", errReply, v))
			pos = len(v)
		case v[pos] == -1:
			c.cmd.SetErr(errRunAlone)
			pos++
		default:
			end := pos + 1 + int(v[pos])
			c.cmd.SetVal(v[pos+1 : end : end])
			pos = end
		}
	}
	clear(o.args)
	clear(o.joined)
	clear(o.profiles)
	o.comb = goredis.IntSliceCmd{}
	return apart
}
