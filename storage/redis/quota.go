package redis

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// Quota leases (see algorithms/lease.go): a key that this instance sees
// often is decided in its memory from a slice of the key's quota that one
// script debited on Redis, in the same step as a request's decision,
// before any of it is spent. Every instance's leases are charged on Redis
// as if spent at once, so what all of them admit never passes the limit,
// whoever dies holding what.
//
// A sketch (counters by hash) counts the demand of keys in periods of
// half a lease's life; a key it saw often gets an entry in the store's
// book (sharded): the key's demand on this instance and the lease it
// holds, if any. A key asked at least hotAsks times in a period is hot
// (requests, whatever their cost: one costly request, an LLM prompt of
// thousands of tokens, is one round trip either way, and a lease taken
// for it would only hold quota away from the other instances): its next decision that no lease answers is a lease call (op 'q'),
// which decides the request, ends the key's previous lease (what is left
// of it goes back in the same script) and takes a new one sized from the
// demand, twice what the key is asked for in a lease's life, which the
// script caps at 1/QuotaLeaseShare of what the key has left. The key's
// other requests meanwhile wait for that call. While the key stays busy,
// the sweeper makes its next lease call before the lease ends, together
// with those of the other busy keys (see sweep). A cold key costs a
// counter and keeps one round trip a decision.
//
// A lease is spent only before its end: its life (on Redis's clock, from
// its take) measured on this instance's monotonic clock from before the
// call was sent, less 1/32 for clocks that tick at slightly different
// rates, so that this instance stops spending before Redis's view of the
// lease is over. What is left goes back when the key's next lease is
// taken, or when the sweeper (one goroutine a store, every quarter of a
// period) finds the key quiet for a quarter of a period or the lease over
// for as long (see sweep), on Close, and when the zone closes (a reload). A return whose call fails
// is not tried again (it may have been applied; applying it twice would
// mint quota): that lease is lost, which errs towards refusing.
//
// A reset or a grant any instance announces ends this instance's lease on
// the key (see heard).

// DefaultLeaseLife is how long a quota lease lives at most: short, so that
// what an instance that dies takes with it is small and soon back (a
// bucket's), and a reset another instance misses the announcement of
// reaches this one within it; long enough that a hot key costs Redis few
// lease calls: one a life, whatever the key's rate, so Redis's CPU for a
// hot key is about that of one lease call a life (at 250 ms, through
// Caddy at 350 requests a second a key, 1/13 of what the key's decisions
// cost with `lease off`; 500 ms halves it). A bucket's lease may live
// less (algorithms.Limit.LeaseTake).
const DefaultLeaseLife = 500 * time.Millisecond

// leasePeriods is how many periods of demand a lease's life holds: a key's
// demand is counted, and its hotness judged, over the last half a life
// (250 ms), so that a key that goes quiet or cold is seen as such soon.
const leasePeriods = 2

// hotAsks is the fewest requests in a period that make a key hot. A lease
// call and the return of what is left of its lease are each a script of
// their own, which costs Redis as much as several decisions that the
// batcher combines into one call (about 7.5: docs/performance.md): a key
// asked for fewer times than that in 250 ms would cost Redis more leased
// than not. A key asked 3.5 times a second at random (10,000 keys
// sharing 35,000 requests a second) is asked 8 times or more in a period
// about once in 18 hours, 4 times or more about once in 20 seconds.
const hotAsks = 8

// returnSlack is the round trip of a lease's return, in µs, as
// returnDelay counts it.
const returnSlack = 25_000

// returnDelay is how long, in µs, after a lease of life µs ends on
// Redis's clock, a live instance has given back what is left of it at the
// latest: the sweep returns a lease that has been over for a quarter of a
// period and runs every quarter of a period (see sweep), and the return
// takes a round trip. A lease call leaves its lease's end plus this on the
// key, so that a rejection is told no later than that (see single.lua).
func returnDelay(life int64) int64 {
	return life/leasePeriods/2 + returnSlack
}

// leaseShards is how many shards the book has.
const leaseShards = 32

// book is a store's quota leases, by Redis key.
type book struct {
	s      *Store
	life   int64 // µs
	seed   maphash.Seed
	shards [leaseShards]leaseShard
	sketch [sketchSize]atomic.Uint64 // recent demand by hash (see often)
	clock  func() time.Duration      // monotonic: since the book began (tests replace it)
	wall   func() int64              // this instance's clock in µs, for a calendar window's span

	stats LeaseStats

	mu      sync.Mutex // guards started, closed, stop and done
	started bool
	closed  bool
	stop    chan struct{}
	done    chan struct{}
}

// leaseTotals counts the quota leases of every store of the process
// (see LeaseTotals).
var leaseTotals LeaseStats

// LeaseTotals returns the counts of every store of the process, across
// reloads: the leases taken, returned, expired and lost, and the
// decisions made from a lease.
func LeaseTotals() (taken, returned, expired, lost, decisions int64) {
	t := &leaseTotals
	return t.Taken.Load(), t.Returned.Load(), t.Expired.Load(), t.Lost.Load(), t.Decisions.Load()
}

// LeaseRenewals returns how many leases the sweepers of every store of
// the process renewed for busy keys, across reloads (see sweep). It is
// kept apart from LeaseTotals, whose counts are metrics: a renewal is also
// a lease taken, and this one is for tests.
func LeaseRenewals() int64 { return leaseTotals.Renewed.Load() }

// LeaseStats counts a store's quota leases.
type LeaseStats struct {
	// Taken counts leases taken; Returned those that gave unspent quota
	// back; Expired those that ended unspent while their key was quiet
	// or at the end of their life; Decisions the requests decided from a
	// lease, without a round trip.
	Taken, Returned, Expired, Decisions atomic.Int64
	// Lost counts leases whose return failed.
	Lost atomic.Int64
	// Renewed counts the leases the sweeper took for busy keys, each in
	// the lease call that ended the key's lease before its end (also
	// counted in Taken).
	Renewed atomic.Int64
}

type leaseShard struct {
	mu sync.RWMutex
	m  map[string]*keyLease
}

// keyLease is one key's entry in the book.
type keyLease struct {
	mu   sync.Mutex
	z    *zone
	rkey string

	// Demand: milli-units asked since period began, and in the period
	// before; and the requests that asked them.
	period         time.Duration
	asked, last    int64
	asks, lastAsks int64
	used           time.Duration // the last decision on the key

	// The lease: n events (0: none), left milli-units of them, taken at
	// Redis's µs taken, living life µs; spent until end on the book's
	// clock, sent at start; reset the decision's Reset when taken.
	n, left, taken, life, reset int64
	// room: what the key had left, in events, when the lease was taken
	// (the lease is at most an eighth of it: docs/redis.md's bound).
	room       int64
	start, end time.Duration
	asker      *zone         // the zone of the key's last request
	fetching   bool          // a lease call is out
	done       chan struct{} // closed when it is back
}

func newBook(s *Store) *book {
	b := &book{s: s, life: DefaultLeaseLife.Microseconds(), seed: maphash.MakeSeed()}
	begin := time.Now()
	b.clock = func() time.Duration { return time.Since(begin) }
	b.wall = func() int64 { return time.Now().UnixMicro() }
	for i := range b.shards {
		b.shards[i].m = make(map[string]*keyLease)
	}
	return b
}

// WithLeaseLife sets how long a quota lease lives (DefaultLeaseLife when
// not called); 0 or less takes no leases. Call it before s decides
// anything. It returns s.
func (s *Store) WithLeaseLife(d time.Duration) *Store {
	s.book.life = d.Microseconds()
	return s
}

// Leases returns the store's lease counters.
func (s *Store) Leases() *LeaseStats { return &s.book.stats }

// period is the µs of a period of demand: half a lease's life.
func (b *book) period() int64 { return b.life / leasePeriods }

func (b *book) shard(hash uint64) *leaseShard {
	return &b.shards[(hash>>32)%leaseShards]
}

// entry returns the entry of rkey, whose hash is hash, made for z if
// there is none.
func (b *book) entry(hash uint64, rkey string, z *zone) *keyLease {
	sh := b.shard(hash)
	sh.mu.Lock()
	h := sh.m[rkey]
	if h == nil {
		h = &keyLease{z: z, rkey: rkey, period: b.clock()}
		sh.m[rkey] = h
	}
	sh.mu.Unlock()
	return h
}

// lookup returns the entry of rkey, whose hash is hash, or nil.
func (b *book) lookup(hash uint64, rkey string) *keyLease {
	sh := b.shard(hash)
	sh.mu.RLock()
	h := sh.m[rkey]
	sh.mu.RUnlock()
	return h
}

// find returns rkey's entry, or nil.
func (b *book) find(rkey string) *keyLease {
	return b.lookup(maphash.String(b.seed, rkey), rkey)
}

// note counts cost milli-units asked at t, in periods of period µs.
func (h *keyLease) note(t time.Duration, cost, period int64) {
	p := time.Duration(period) * time.Microsecond
	if since := t - h.period; since >= p {
		h.last, h.lastAsks = 0, 0
		if since < 2*p {
			h.last, h.lastAsks = h.asked, h.asks
		}
		h.asked, h.asks, h.period = 0, 0, t
	}
	h.asked += cost
	h.asks++
	h.used = t
}

// want is the events a lease is asked for at t, with periods of period
// µs: twice the key's demand in a lease's life (leasePeriods periods), a
// period's being the last one's or, if more, this one's so far at its
// rate (so that a key seen often since its entry was made leases in its
// first period), or 0 for a key that is not hot (asked fewer than hotAsks
// times in either).
func (h *keyLease) want(t time.Duration, period int64) int64 {
	if max(h.lastAsks, h.asks) < hotAsks {
		return 0
	}
	d := h.last
	if h.asked > d {
		e := max((t - h.period).Microseconds(), period/16, 1)
		d = max(d, h.asked*min(period/e, 16))
	}
	return 2 * leasePeriods * d / algorithms.Milli
}

// ended is the lease h held, detached from it: what a return gives back
// (and n, its events, which the key's record of its leases takes off:
// see common.lua's leased).
type ended struct {
	unspent, taken, life int64
	n                    int64
}

// detach ends h's lease here and returns it (taken 0: none).
func (h *keyLease) detach() ended {
	if h.n == 0 {
		return ended{}
	}
	e := ended{unspent: h.left / algorithms.Milli, taken: h.taken, life: h.life, n: h.n}
	h.n, h.left, h.taken = 0, 0, 0
	return e
}

// worth reports whether returning e can give anything back: unspent
// events, or a bucket's refill not lived.
func (e ended) worth(z *zone, t, start time.Duration) bool {
	if e.taken == 0 {
		return false
	}
	if e.unspent > 0 {
		return true
	}
	return z.limit.Kind != algorithms.FixedWindow && (t-start).Microseconds() < e.life
}

// FromLease decides a request of cost milli-units on key in zone l (a
// zone of this store) from this instance's lease on the key, if it holds
// one that can admit it: what leased does first, without building the
// request's parts, its Redis key or its Verdict (no allocation). It
// reports false when the lease cannot (none, spent, ended, or another
// zone's), having changed nothing: decide the request with Decide.
func (s *Store) FromLease(l storage.Limiter, key string, cost int64) (algorithms.Decision, bool) {
	z, ok := l.(*zone)
	b := s.book
	if !ok || z.store != s || !z.leases || cost <= 0 || cost > z.limit.Capacity() || b.life <= 0 {
		return algorithms.Decision{}, false
	}
	var buf [128]byte
	rkey := s.appendKey(buf[:0], key, z.tail)
	hash := maphash.Bytes(b.seed, rkey)
	sh := b.shard(hash)
	sh.mu.RLock()
	h := sh.m[string(rkey)]
	sh.mu.RUnlock()
	if h == nil {
		return algorithms.Decision{}, false
	}
	t := b.clock()
	h.mu.Lock()
	if !h.holds(z, t, cost) {
		h.mu.Unlock()
		return algorithms.Decision{}, false
	}
	h.note(t, cost, b.period())
	h.asker = z
	d := h.spend(t, cost)
	h.mu.Unlock()
	b.decided()
	return d, true
}

// holds reports whether h's lease, of zone z, can admit cost milli-units
// at t. h.mu is held.
func (h *keyLease) holds(z *zone, t time.Duration, cost int64) bool {
	return h.n > 0 && h.z == z && t < h.end && h.left >= cost
}

// spend admits cost milli-units at t from h's lease (see holds), and
// returns the decision. h.mu is held.
func (h *keyLease) spend(t time.Duration, cost int64) algorithms.Decision {
	h.left -= cost
	elapsed := (t - h.start).Microseconds()
	return algorithms.Decision{Allowed: true, Remaining: h.left / algorithms.Milli, Reset: max(0, h.reset-elapsed), At: h.taken + elapsed}
}

// decided counts a decision made from a lease.
func (b *book) decided() {
	b.stats.Decisions.Add(1)
	leaseTotals.Decisions.Add(1)
}

// leased decides parts, one request on one leasing zone's key, from this
// instance's lease on the key, without a round trip, if it can; else, if
// the key is hot, by a lease call (see fetch), unless the deny cache
// answers. A request that finds the key's lease spent while a lease call
// for it is out waits for that call (its own round trip would be no
// sooner) and spends from the new lease. It reports false when none of
// this applies (a cold key): decide the request as usual.
func (s *Store) leased(ctx context.Context, now int64, parts []part, cost int64) (Verdict, bool, error) {
	b, p := s.book, &parts[0]
	z := p.z
	if p.op != opCheck || cost <= 0 || b.life <= 0 {
		return Verdict{}, false, nil
	}
	hash := maphash.String(b.seed, p.key)
	h := b.lookup(hash, p.key)
	if h == nil {
		// A key seen for the first time in a while is cold, most of the
		// time: it gets an entry only once the sketch saw it often (its
		// requests counted, not their cost: see hot above).
		seen := b.often(hash, algorithms.Milli)
		if seen < hotAsks*algorithms.Milli {
			return Verdict{}, false, nil
		}
		h = b.entry(hash, p.key, z)
	}
	for try := 0; ; try++ {
		t := b.clock()
		h.mu.Lock()
		if try == 0 {
			h.note(t, cost, b.period())
			h.asker = z
		}
		if h.holds(z, t, cost) {
			d := h.spend(t, cost)
			h.mu.Unlock()
			b.decided()
			return Verdict{Decisions: []algorithms.Decision{d}, Rejected: -1}, true, nil
		}
		if h.fetching {
			done := h.done
			h.mu.Unlock()
			if try >= 2 {
				return Verdict{}, false, nil
			}
			select {
			case <-done:
				continue
			case <-ctx.Done():
				return Verdict{}, false, nil
			}
		}
		want := h.want(t, b.period())
		h.mu.Unlock()
		if want == 0 {
			return Verdict{}, false, nil
		}
		var freed uint64
		if s.deny != nil {
			if ds, rejected, ok := s.cached(now, parts); ok {
				return Verdict{Decisions: ds, Rejected: rejected}, true, nil
			}
			freed = s.deny.since(parts)
		}
		v, claimed, err := s.fetch(ctx, now, h, p, want)
		if !claimed {
			if try >= 2 {
				return Verdict{}, false, nil
			}
			continue // another request's lease call went out first: wait for it
		}
		if err == nil && s.deny != nil && v.Rejected >= 0 && cacheable(parts, v.Decisions) {
			s.deny.store(now, freed, parts, v.Decisions)
		}
		return v, true, err
	}
}

// sketchSize is how many counters the sketch of recent keys has.
const sketchSize = 1 << 14

// often counts a request of cost milli-units for the key of hash in the
// sketch (counters shared by the keys of a hash's low bits, each counting
// the current period), and returns its counter: the
// milli-units asked for the key this period, or more (a key that
// collides with others is found hot early, which costs only its entry).
func (b *book) often(hash uint64, cost int64) int64 {
	c := &b.sketch[hash&(sketchSize-1)]
	period := uint64(b.clock() / (time.Duration(b.period()) * time.Microsecond))
	const bits = 40 // milli-units; the period above
	for {
		v := c.Load()
		n := uint64(cost)
		if v>>bits == period&(1<<(64-bits)-1) {
			n += v & (1<<bits - 1)
		}
		if n >= 1<<bits {
			n = 1<<bits - 1
		}
		if c.CompareAndSwap(v, period<<bits|n) {
			return int64(n)
		}
	}
}

// fetch decides p by a lease call on h's key for want events, which ends
// the lease h holds and takes a new one. It reports false, having done
// nothing, when another lease call on the key is out.
func (s *Store) fetch(ctx context.Context, now int64, h *keyLease, p *part, want int64) (Verdict, bool, error) {
	b, z := s.book, p.z
	t := b.clock()
	h.mu.Lock()
	if h.fetching {
		h.mu.Unlock()
		return Verdict{}, false, nil
	}
	h.fetching, h.done = true, make(chan struct{})
	oldStart, oldZone := h.start, h.z
	old := h.detach()
	h.z = z
	h.mu.Unlock()
	if oldZone != z && old.taken != 0 {
		// A lease of the zone this one replaced (a reload, which may
		// have changed the limit): returned as that zone took it.
		oz, o := oldZone, old
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if oz.endLease(ctx, b.wall(), h.rkey, o) != nil {
				b.stats.Lost.Add(1)
				leaseTotals.Lost.Add(1)
			}
		}()
		old = ended{}
	}
	d, _, err := s.call(ctx, now, h, z, p.x, want, old, oldStart, t)
	if err != nil {
		return Verdict{}, true, err
	}
	rejected := -1
	if !d.Allowed && p.block {
		rejected = 0
	}
	return Verdict{Decisions: []algorithms.Decision{d}, Rejected: rejected, Decided: true, Clock: d.At}, true, nil
}

// call runs the lease call of h, whose lease call the caller claimed
// (h.fetching) at t: a take of x on h's key in z, after ending old (h's
// lease, detached, taken at oldStart), and a lease of up to want events;
// then it records the new lease on h and releases the claim. It reports
// whether it took a lease.
func (s *Store) call(ctx context.Context, now int64, h *keyLease, z *zone, x, want int64, old ended, oldStart, t time.Duration) (algorithms.Decision, bool, error) {
	b := s.book
	switch {
	case old.worth(z, t, oldStart):
		b.stats.Returned.Add(1)
		leaseTotals.Returned.Add(1)
	case old.taken != 0:
		b.stats.Expired.Add(1)
		leaseTotals.Expired.Add(1)
		old = ended{n: old.n} // nothing to give back: the script skips the return, and takes the lease off the key's leased
	}

	d, n, life, err := z.lease(ctx, now, h.rkey, x, want, b.life, old)
	h.mu.Lock()
	h.fetching = false
	close(h.done)
	h.done = nil
	if err == nil && n > 0 {
		h.n, h.left, h.taken, h.life, h.reset, h.room = n, n*algorithms.Milli, d.At, life, d.Reset, d.Remaining
		h.start = t
		h.end = t + time.Duration(life-life/32)*time.Microsecond
	}
	h.mu.Unlock()
	if err != nil {
		if old.taken != 0 {
			b.stats.Lost.Add(1)
			leaseTotals.Lost.Add(1)
		}
		return d, false, fmt.Errorf("redis store: take %q: %w", z.name, err)
	}
	if n > 0 {
		b.stats.Taken.Add(1)
		leaseTotals.Taken.Add(1)
		b.start()
	}
	return d, n > 0, nil
}

// lease runs a lease call (op 'q', see single.lua) for the Redis key
// rkey: a take of x, after ending old, and a lease of up to want events
// for life µs, whose end plus returnDelay the key keeps (its back).
func (z *zone) lease(ctx context.Context, now int64, rkey string, x, want, life int64, old ended) (algorithms.Decision, int64, int64, error) {
	if err := ctx.Err(); err != nil {
		return algorithms.Decision{}, 0, 0, err
	}
	c := newCall(z.script, z.store.fns.fcall(), 2)
	c.args = append(c.args, rkey, resetMark(rkey), word(opLease), z.store.clock(now), z.store.ttlSlack, z.arg(x), want, life)
	c.args = append(c.args, z.constsAt(now)...)
	c.args = append(c.args, old.unspent, old.taken, old.life, returnDelay(life), old.n)
	v, err := z.store.run.run(ctx, c)
	if err != nil {
		return algorithms.Decision{}, 0, 0, err
	}
	if len(v) != 8 {
		return algorithms.Decision{}, 0, 0, fmt.Errorf("%w: %v", errReply, v)
	}
	return decision(v), v[6], v[7], nil
}

// endLease returns old, a lease on the Redis key rkey (op 'e').
func (z *zone) endLease(ctx context.Context, now int64, rkey string, old ended) error {
	c := newCall(z.script, z.store.fns.fcall(), 2)
	c.args = append(c.args, rkey, resetMark(rkey), word(opEndLease), z.store.clock(now), z.store.ttlSlack, old.unspent, old.taken, old.life)
	c.args = append(c.args, z.constsAt(now)...)
	c.args = append(c.args, old.n)
	c.await = true
	v, err := z.store.run.run(ctx, c)
	if err == nil && len(v) != 0 {
		err = fmt.Errorf("%w: %v", errReply, v)
	}
	return err
}

// outstanding is the milli-units this book's leases hold.
func (b *book) outstanding() int64 {
	var n int64
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		for _, h := range sh.m {
			h.mu.Lock()
			if h.n > 0 {
				n += h.left
			}
			h.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	return n
}

// heard follows a reset (grant 0) of the Redis key rkey, or a grant to
// it, that this instance made or heard of: the key's lease is spent no
// more, and ends at the key's next lease call or the next sweep, whose
// return sees the grant, or, after a reset, gives nothing back for a
// lease taken before it (the reset gave it back: see single.lua's mark)
// and all that is left of one taken since (the notice came late).
func (b *book) heard(rkey string, grant int64) {
	h := b.find(rkey)
	if h == nil {
		return
	}
	h.mu.Lock()
	h.end = 0
	h.mu.Unlock()
}

// start starts the sweeper, once, unless the book is closed.
func (b *book) start() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.closed {
		return
	}
	b.started = true
	b.stop, b.done = make(chan struct{}), make(chan struct{})
	go b.loop(b.stop, b.done)
}

func (b *book) loop(stop, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(time.Duration(b.period()) * time.Microsecond / 4)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			b.sweep(b.clock(), nil)
		}
	}
}

// sweep returns, at t, the leases whose keys are quiet (a quarter of a
// period without a decision) or that have been over for a quarter of a
// period, all of them if only is everything, or those of zone only; and
// forgets the keys that hold none and were not asked for in two periods.
//
// A busy key's lease (its key asked for within a quarter of a period, by
// the lease's zone, and still hot) that would end before the next sweep
// (a quarter of a period on) and a margin (renewAhead) is renewed instead
// (not with only): the lease call a request would make at its end (op
// 'q': it ends the lease, what is left of it going back in the same
// script, and takes the next, sized from the key's demand), deciding a
// take of nothing. A sweep's renewals go out together, so that Redis runs
// them back to back in one wake-up, where each key's request would wake
// it alone, and the key's requests rarely wait for a lease call of their
// own. A lease a reset or a grant ended (heard) is left to the key's next
// request, and a lease call already out (fetching) to its caller.
//
// A lease that is over while its key is still asked for but no longer hot
// (no lease call comes) is returned a quarter of a period past its end.
func (b *book) sweep(t time.Duration, only func(*zone) bool) {
	quiet := time.Duration(b.period()) * time.Microsecond / 4
	var due []*keyLease
	var zones []*zone
	var ends []ended
	var starts []time.Duration
	var renew []renewCall
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		for k, h := range sh.m {
			h.mu.Lock()
			switch {
			case h.fetching:
			case only == nil && h.renewable(t, quiet) && h.want(t, b.period()) > 0:
				start, want := h.start, h.want(t, b.period())
				h.fetching, h.done = true, make(chan struct{})
				renew = append(renew, renewCall{h: h, z: h.z, want: want, old: h.detach(), start: start})
			case h.n > 0 && (only != nil && only(h.z) || only == nil && (t-h.used >= quiet || t >= h.end+quiet)):
				start := h.start
				e := h.detach()
				due, zones, ends, starts = append(due, h), append(zones, h.z), append(ends, e), append(starts, start)
			case h.n == 0 && only == nil && t-h.used >= 8*quiet:
				delete(sh.m, k)
			}
			h.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	// The returns and the renewals go out together: a pipelined store
	// sends them in a few round trips, and Redis runs them back to back.
	var wg sync.WaitGroup
	for _, r := range renew {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if _, took, _ := b.s.call(ctx, b.wall(), r.h, r.z, 0, r.want, r.old, r.start, t); took {
				b.stats.Renewed.Add(1)
				leaseTotals.Renewed.Add(1)
			}
		}()
	}
	for i, h := range due {
		e, z := ends[i], zones[i]
		if !e.worth(z, t, starts[i]) {
			b.stats.Expired.Add(1)
			leaseTotals.Expired.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := z.endLease(ctx, b.wall(), h.rkey, e)
			cancel()
			if err != nil {
				b.stats.Lost.Add(1)
				leaseTotals.Lost.Add(1)
				return
			}
			b.stats.Returned.Add(1)
			leaseTotals.Returned.Add(1)
		}()
	}
	wg.Wait()
}

// renewAhead is how soon after a sweep a busy key's lease must end for
// that sweep to renew it: before the next sweep, a tick of quiet on, and
// a quarter of a tick more, for the renewal's round trip and a tick that
// comes late.
func renewAhead(quiet time.Duration) time.Duration { return quiet + quiet/4 }

// renewable reports whether the sweep at t renews h's lease (see sweep):
// the key was asked for within quiet, by the zone the lease is of, its
// lease ends before the next sweep (quiet from now) and a margin, and no
// reset or grant ended it (heard).
func (h *keyLease) renewable(t, quiet time.Duration) bool {
	return h.n > 0 && h.end != 0 && t-h.used < quiet && h.asker == h.z && h.end < t+renewAhead(quiet)
}

// renewCall is a lease call the sweep makes for a busy key: it ends old,
// the key's lease (taken at start), and takes the next, of up to want
// events, in z.
type renewCall struct {
	h     *keyLease
	z     *zone
	want  int64
	old   ended
	start time.Duration
}

// close stops the sweeper and returns every lease.
func (b *book) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	stop, done := b.stop, b.done
	b.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	b.sweep(b.clock(), func(*zone) bool { return true })
}

// CloseLeases returns every lease the zone l holds on this store's keys
// (a zone a reload retires): its keys are decided by the zones that
// replace it from then on.
func (z *zone) CloseLeases() {
	if z.store.book != nil {
		z.store.book.sweep(z.store.book.clock(), func(o *zone) bool { return o == z })
	}
}

// LeaseOf reports the lease this instance holds on key in this zone's
// store: the whole events left in it and the µs until it ends (ok false:
// none).
func (z *zone) LeaseOf(key string) (events, left int64, ok bool) {
	b := z.store.book
	h := b.find(z.store.key(key, z.tail))
	if h == nil {
		return 0, 0, false
	}
	t := b.clock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 || t >= h.end {
		return 0, 0, false
	}
	return h.left / algorithms.Milli, (h.end - t).Microseconds(), true
}
