package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// A concurrency slot in Redis is a lease that ends unless renewed (see
// concurrency.lua), so that a dead instance's slots come back. The store
// renews the leases its requests hold with one loop, its keeper: each tick
// renews every lease due in one batched call (renew.lua: many leases in
// one script; one script per Cluster slot, all of a tick's scripts in one
// pipeline), so that a held request costs a small record, not a goroutine
// and a timer, and a store holding many leases makes a few calls a second
// whatever their number.

//go:embed renew.lua
var renewLua string

// renewScript renews many leases of one slot: common.lua, concurrency.lua
// and renew.lua. It runs by EVALSHA even on a store that decides by FCALL
// (WithFunctions): a few calls a second, whatever the leases held.
var renewScript = newScript(commonLua + concurrencyLua + renewLua)

// maxRenewKeys bounds the leases one renew.lua call renews, so that one
// call holds the server for a short while.
const maxRenewKeys = 1000

// defaultRenewTimeout bounds a tick's calls when WithLeases did not set
// it.
const defaultRenewTimeout = time.Second

// Lease is a concurrency slot a request holds in Redis, which the store's
// keeper renews until Release. Its methods are safe for concurrent use.
type Lease struct {
	k     *keeper
	rkey  string // the zone's Redis key for the request's key
	id    int64  // the lease's id: its member in the key's sorted set
	lease int64  // the zone's lease, µs
	// due is when the lease's next renewal is due on the keeper's clock,
	// and i its index in the keeper's held list (-1 once released); both
	// guarded by the keeper's mu.
	due time.Duration
	i   int
}

// keeper renews a store's held leases (see the comment above).
type keeper struct {
	s       *Store
	start   time.Time // the keeper's clock is the time since start (monotonic)
	timeout time.Duration
	onError func(error) // told of a tick's failure; nil: ignored

	mu      sync.Mutex
	held    []*Lease
	every   time.Duration // the loop's tick while it runs
	running bool
	closed  bool
	wake    chan struct{} // a shorter tick is wanted (buffered: never blocks)
	stop    chan struct{} // closed by close

	due []renewal // the tick's renewals: used by the loop only

	// Test hooks: at is the now renew.lua is given when the store passes
	// the caller's clock (see Store.callerClock); manual keeps the loop
	// from starting, for tests that call tick themselves; clock is theirs.
	at     int64
	manual bool
	clock  func() time.Duration // replaces the keeper's clock (see now)

	calls   atomic.Int64 // renew.lua calls made (read by tests and benchmarks)
	renewed atomic.Int64 // leases renewed
}

// renewal is one lease a tick renews, copied out of its Lease under the
// keeper's lock.
type renewal struct {
	rkey  string
	id    int64
	lease int64
}

func newKeeper(s *Store) *keeper {
	return &keeper{s: s, start: time.Now(), timeout: defaultRenewTimeout,
		wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// WithLeases sets how the keeper renews leases: each tick's calls are
// bounded by timeout, and a tick that fails is told to onError (which
// must not block; nil ignores it). It returns s.
func (s *Store) WithLeases(timeout time.Duration, onError func(error)) *Store {
	if timeout > 0 {
		s.leases.timeout = timeout
	}
	s.leases.onError = onError
	return s
}

// Hold has the store renew the concurrency lease that the Take whose
// Decision is taken holds for key (its At is the lease id), until Release.
// It returns nil for a zone that is not a concurrency limit, or a store
// that is closed (the lease then ends on its own within a lease).
func (z *zone) Hold(key string, taken algorithms.Decision) *Lease {
	if z.limit.Kind != algorithms.Concurrency {
		return nil
	}
	l := &Lease{rkey: z.store.key(key, z.tail), id: taken.At, lease: z.limit.Window}
	if !z.store.leases.add(l) {
		return nil
	}
	return l
}

// Release stops renewing the lease. Release the lease before giving its
// slot back (Undo), so that no renewal can follow the give-back. It is
// safe to call more than once, and on nil.
func (l *Lease) Release() {
	if l == nil {
		return
	}
	k := l.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.i < 0 {
		return
	}
	last := len(k.held) - 1
	k.held[l.i] = k.held[last]
	k.held[l.i].i = l.i
	k.held[last] = nil
	k.held = k.held[:last]
	l.i = -1
	if len(k.held) == 0 && cap(k.held) > 1024 {
		k.held = nil // a burst of held requests is over: give its list back
	}
}

// Held returns how many leases the keeper renews.
func (s *Store) Held() int {
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	return len(s.leases.held)
}

// now is the keeper's clock: the time since it started, or the tests'
// clock.
func (k *keeper) now() time.Duration {
	if k.clock != nil {
		return k.clock()
	}
	return time.Since(k.start)
}

// renewEvery is how long after its last renewal (or its take) a lease is
// renewed again: a third of it, so that a renewal that fails once still
// leaves time for the next.
func renewEvery(lease int64) time.Duration {
	return time.Duration(lease) * time.Microsecond / 3
}

// add holds l, and starts the loop if it is not running (or wakes it for
// a shorter tick). It reports false on a closed keeper.
func (k *keeper) add(l *Lease) bool {
	every := renewEvery(l.lease) / 2 // a tick of a sixth of the lease (see tick)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	l.k, l.i, l.due = k, len(k.held), k.now()+renewEvery(l.lease)
	k.held = append(k.held, l)
	switch {
	case k.manual:
	case !k.running:
		k.running, k.every = true, every
		go k.loop(every)
	case every < k.every:
		k.every = every
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// close stops the loop; leases held stay in Redis until they end.
func (k *keeper) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		k.closed = true
		close(k.stop)
	}
}

// loop renews the leases due every tick, until none is held (then it
// returns, and the next Hold starts it again) or the keeper closes.
func (k *keeper) loop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-k.wake:
			k.mu.Lock()
			every = k.every
			k.mu.Unlock()
			t.Reset(every)
			continue
		case <-t.C:
		}
		if !k.tick(k.now()) {
			return
		}
	}
}

// tick renews the leases due at now, and reports whether any is held;
// when none is, the loop is marked stopped under the same lock as the
// last Release, so that the next add starts it again.
func (k *keeper) tick(now time.Duration) bool {
	k.mu.Lock()
	if len(k.held) == 0 {
		k.running = false
		k.mu.Unlock()
		return false
	}
	k.due = k.due[:0]
	// A lease due before the next tick's midpoint is renewed now: each
	// is renewed between a quarter and 5/12 of its lease after the last
	// renewal (ticks of a sixth of the shortest), so that a renewal that
	// fails is tried again within the lease.
	soon := now + k.every/2
	for _, l := range k.held {
		if soon >= l.due {
			k.due = append(k.due, renewal{rkey: l.rkey, id: l.id, lease: l.lease})
			l.due = now + renewEvery(l.lease)
		}
	}
	k.mu.Unlock()
	if len(k.due) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
		err := k.renew(ctx, k.due)
		cancel()
		if err != nil && k.onError != nil {
			k.onError(fmt.Errorf("redis store: renewing %d concurrency leases: %w", len(k.due), err))
		}
		clear(k.due) // the keys' strings: let them go
	}
	return true
}

// renew renews due as few calls as the store allows: one renew.lua call
// per group of keys that one script can reach (see Store.groups), at
// most maxRenewKeys each, all of them in one pipeline.
func (k *keeper) renew(ctx context.Context, due []renewal) error {
	s := k.s
	var groups [][]int
	switch s.group {
	case oneServer:
		all := make([]int, len(due))
		for i := range all {
			all[i] = i
		}
		groups = [][]int{all}
	case bySlot:
		groups = groupBy(due, func(r renewal) any { return slot(r.rkey) })
	default:
		groups = groupBy(due, func(r renewal) any { return hashTag(r.rkey) })
	}
	var calls []*call
	for _, g := range groups {
		for len(g) > 0 {
			n := min(len(g), maxRenewKeys)
			calls = append(calls, k.call(due, g[:n]))
			g = g[n:]
		}
	}
	k.calls.Add(int64(len(calls)))
	return s.runAll(ctx, calls, func(v []int64) {
		if len(v) == 1 {
			k.renewed.Add(v[0])
		}
	})
}

// call builds a renew.lua call of the renewals g of due.
func (k *keeper) call(due []renewal, g []int) *call {
	c := newCall(renewScript, false, len(g))
	args := slices.Grow(c.args, len(g)+2+2*len(g))
	for _, i := range g {
		args = append(args, due[i].rkey)
	}
	args = append(args, k.s.clock(k.at), k.s.ttlSlack)
	for _, i := range g {
		args = append(args, due[i].id, due[i].lease)
	}
	c.args = args
	return c
}

// groupBy splits the indexes of due into groups of the same of, in the
// order of their first members.
func groupBy(due []renewal, of func(renewal) any) [][]int {
	var groups [][]int
	index := make(map[any]int)
	for i := range due {
		v := of(due[i])
		g, ok := index[v]
		if !ok {
			g = len(groups)
			index[v] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// runAll runs calls, each its own script: one alone as any call, several
// as one pipeline when the client pipelines (those that find their script
// missing again as EVAL), else one after another. Each call's reply goes
// to got. It returns the calls' errors.
func (s *Store) runAll(ctx context.Context, calls []*call, got func([]int64)) error {
	p, ok := s.client.(Pipeliner)
	if len(calls) == 1 || !ok {
		var errs []error
		for _, c := range calls {
			v, err := direct{s.client, nil}.run(ctx, c) // recycles c
			if err != nil {
				errs = append(errs, err)
				continue
			}
			got(v)
		}
		return errors.Join(errs...)
	}
	o := outbox{p: p.Pipeline()}
	o.send(ctx, calls, func(c *call) []any { return c.args }, false)
	var again []*call
	var errs []error
	for _, c := range calls {
		v, err := c.reply()
		switch {
		case noScript(err):
			again = append(again, c)
			continue
		case err != nil:
			errs = append(errs, err)
		default:
			got(v)
		}
	}
	if len(again) > 0 {
		o.send(ctx, again, func(c *call) []any { return withSource(c.sc, c.args) }, false)
		for _, c := range again {
			if v, err := c.reply(); err != nil {
				errs = append(errs, err)
			} else {
				got(v)
			}
		}
	}
	for _, c := range calls {
		c.release()
	}
	return errors.Join(errs...)
}
