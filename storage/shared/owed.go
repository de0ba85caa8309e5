// Package shared is the store runtime: the one place a request's parts
// are decided, settled and given back (Store), whichever store holds them,
// and the runtime of a store that several Caddy instances share (Redis):
// its client across reloads (Pool), each zone's limiter on it (Limiter),
// the breaker and deadlines every call goes through (Runtime), the local
// copy that decides while the shared store does not answer, and the
// settlements it could not hear, kept until it does (Owed).
//
// It knows no Caddy: the root package provisions it from its config and
// hands it the request's parts.
package shared

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// DefaultOwedMax bounds the settlements an Owed keeps: past it, a new one
// is dropped (and counted).
const DefaultOwedMax = 100_000

// Owed keeps the settlements (give-backs and owed excesses) that the shared
// store could not hear, merged per key and request, and applies each once
// when the store answers again. A settlement is kept only when its call
// surely never reached the store (the breaker was open, the connection was
// refused, no connection was free): one whose answer was lost may have been
// applied, and applying it again would count it twice. A kept settlement
// is dropped, and counted, once the key's window has ended (it could no
// longer change a decision), or when Max are kept already.
//
// The zero value is not usable: set every function field before Keep.
// Its methods are safe for concurrent use.
type Owed struct {
	// Retry is how long the drain waits between two attempts.
	Retry time.Duration
	// Max bounds the settlements kept; DefaultOwedMax if 0.
	Max int
	// Now is the clock of Keep's until, in µs.
	Now func() int64
	// Do makes one call to the store, bounded by its deadline and
	// breaker.
	Do func(fn func(ctx context.Context) error) error
	// Unsent reports whether a failed call surely never reached the
	// store.
	Unsent func(err error) bool
	// Hold keeps the store's client open while something is kept, and
	// reports false if it is closed already; Release ends what Hold
	// began.
	Hold    func() bool
	Release func()
	// Logger, if set, is told of the settlements a drain dropped.
	Logger *zap.Logger

	mu       sync.Mutex
	m        map[owedKey]owedAmount
	draining bool

	dropped, applied atomic.Int64
}

// settlements counts the settlements of every Owed of the process, for
// the metrics: those kept now (merged per key as Owed keeps them), those
// applied once the store heard them, and those dropped. A process-wide
// count goes on across reloads, whose retired clients keep and drain
// their own.
var settlements struct{ pending, applied, dropped atomic.Int64 }

// Settlements returns, over every Owed of the process, the settlements
// kept now, and how many were applied late and dropped since the process
// started.
func Settlements() (pending, applied, dropped int64) {
	return settlements.pending.Load(), settlements.applied.Load(), settlements.dropped.Load()
}

// drop counts a settlement dropped.
func (o *Owed) drop() {
	o.dropped.Add(1)
	settlements.dropped.Add(1)
}

// owedKey identifies what is merged: the settlements of one request
// (its decision) on one key and zone, give-backs apart from excesses.
type owedKey struct {
	s     storage.Settler
	key   string
	at    int64 // the decision's At and Reset
	reset int64
	owe   bool
}

type owedEntry struct {
	k owedKey
	e owedAmount
}

// owedAmount is what a key owes, in milli-units, and until when (on the
// store's clock) it could still change a decision.
type owedAmount struct {
	amount int64
	until  int64
}

// Keep keeps the settlement of the request whose decision is taken on key
// in s (give > 0 gives back give milli-units; give < 0 owes -give), which
// counts until until (on Now's clock), and reports whether it was
// kept: not if its window has ended, if Max are kept, or if the client is
// closed.
func (o *Owed) Keep(s storage.Settler, key string, taken algorithms.Decision, give, until int64) bool {
	if give == 0 {
		return true
	}
	if o.Now() >= until {
		o.drop()
		return false
	}
	k := owedKey{s: s, key: key, at: taken.At, reset: taken.Reset, owe: give < 0}
	o.mu.Lock()
	defer o.mu.Unlock()
	bound := o.Max
	if bound == 0 {
		bound = DefaultOwedMax
	}
	e, merged := o.m[k]
	if !merged && len(o.m) >= bound {
		o.drop()
		return false
	}
	if !o.draining {
		if !o.Hold() {
			o.drop()
			return false
		}
		o.draining = true
		go o.drain()
	}
	if o.m == nil {
		o.m = make(map[owedKey]owedAmount)
	}
	e.amount += abs(give)
	e.until = max(e.until, until)
	o.m[k] = e
	if !merged {
		settlements.pending.Add(1)
	}
	return true
}

// Pending returns how many settlements are kept.
func (o *Owed) Pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}

// Dropped returns how many settlements were dropped: their window ended
// before the store heard them, or too many were kept.
func (o *Owed) Dropped() int64 { return o.dropped.Load() }

// Applied returns how many kept settlements reached the store.
func (o *Owed) Applied() int64 { return o.applied.Load() }

// drain tries the kept settlements every Retry until none is left, then
// releases the client.
func (o *Owed) drain() {
	for {
		time.Sleep(o.Retry)
		o.mu.Lock()
		batch := make([]owedEntry, 0, len(o.m))
		for k, e := range o.m {
			batch = append(batch, owedEntry{k, e})
		}
		o.mu.Unlock()
		// The latest charge first: a bucket gives back in full only the
		// charge last in its queue.
		slices.SortFunc(batch, func(a, b owedEntry) int {
			return cmp.Compare(b.k.at+b.k.reset, a.k.at+a.k.reset)
		})
		now := o.Now()
		dropped := o.dropped.Load()
		for _, b := range batch {
			k, e := b.k, b.e
			if now >= e.until {
				o.done(k, e.amount)
				o.drop()
				continue
			}
			err := o.Do(func(ctx context.Context) error { return o.apply(ctx, k, e.amount, now) })
			switch {
			case err == nil:
				o.done(k, e.amount)
				o.applied.Add(1)
				settlements.applied.Add(1)
			case !o.Unsent(err):
				// It reached the store, whose answer was lost: it may
				// have been applied, and must not be twice.
				o.done(k, e.amount)
				o.drop()
			}
		}
		if n := o.dropped.Load() - dropped; n > 0 && o.Logger != nil {
			o.Logger.Warn("settlements Redis did not hear dropped: their window ended, or Redis may have applied them",
				zap.Int64("dropped", n), zap.Int64("dropped_total", o.dropped.Load()))
		}
		o.mu.Lock()
		if len(o.m) == 0 {
			o.draining = false
			o.mu.Unlock()
			o.Release()
			return
		}
		o.mu.Unlock()
	}
}

// apply settles amount of k's kind on the store.
func (o *Owed) apply(ctx context.Context, k owedKey, amount, now int64) error {
	taken := algorithms.Decision{Allowed: true, At: k.at, Reset: k.reset}
	if k.owe {
		return k.s.Settle(ctx, k.key, now, 0, amount, taken)
	}
	return k.s.Settle(ctx, k.key, now, amount, 0, taken)
}

// done takes amount, applied or dropped, from what k owes.
func (o *Owed) done(k owedKey, amount int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.m[k]
	if !ok {
		return
	}
	if e.amount -= amount; e.amount <= 0 {
		delete(o.m, k)
		settlements.pending.Add(-1)
		return
	}
	o.m[k] = e
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
