package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// A deny cache lets an instance answer a request that Redis just rejected,
// when the same request (the same zones, keys and costs, or a dearer one)
// comes again, without a round trip: a rejection says how long the request
// is refused at least (its Wait: exactly, or until the quota out in leases
// is back, if sooner: see common.lua's back), and nothing but a give-back
// or a reset can make the shared state admit it sooner. So the cache only
// ever rejects, and only what Redis would reject, but for those two: a
// reset through the admin API is published on Redis pub/sub and clears
// the key on every instance that listens, and no entry is trusted for
// longer than DenyCacheFor, which bounds how early a give-back on another
// instance (a shaped client leaving) or a reset whose message was lost can
// be missed.

// DenyCacheFor is the longest a cached rejection is trusted, in µs: 1s.
const DenyCacheFor int64 = 1_000_000

// denyCacheMax bounds the entries a cache holds; past it, it starts again.
const denyCacheMax = 100_000

// freedStripes is how many stripes a cache counts its forgets in (see
// denyCache.freed): a forget keeps a rejection of a key in the same
// stripe from being stored, one in 256 keys.
const freedStripes = 256

// ResetChannel is the pub/sub channel (after the key prefix) on which a
// reset names the Redis key it deleted.
const ResetChannel = "reset"

// denyCache maps a Redis key to what the last rejected request that
// decided it saw there. The entries of one rejected request share a gen,
// so that only a request decided on exactly those zones is answered from
// them.
type denyCache struct {
	mu  sync.Mutex
	m   map[string]denial
	gen atomic.Uint64
	// freed counts the forgets (this instance's give-backs, and the
	// resets and grants it made or heard of), by stripe of the key: a
	// rejection whose script ran while a key of its stripes was freed may
	// be older than that, and is not stored (see since and store). A
	// stripe, not the whole cache, so that the give-backs of other keys,
	// which a busy zone with count_response makes all the time, do not
	// keep a hot key's rejection from being cached.
	freed [freedStripes]atomic.Uint64
	seed  maphash.Seed
	// hits counts the requests answered from the cache.
	hits atomic.Int64
}

// denial is one zone's part of a rejected request.
type denial struct {
	gen   uint64
	n     int    // how many zones the request had
	at    int64  // the caller's clock when the request was sent, µs
	cost  int64  // what the request cost there (the script's x)
	op    string // opCheck, or opCheckNever for a cost above the capacity
	block bool
	d     algorithms.Decision
}

func newDenyCache() *denyCache {
	return &denyCache{m: make(map[string]denial), seed: maphash.MakeSeed()}
}

// stripe is the counter of key's forgets.
func (c *denyCache) stripe(key string) *atomic.Uint64 {
	return &c.freed[maphash.String(c.seed, key)%freedStripes]
}

// lookup answers parts at now from the cache, filling ds, if every part
// has an entry of one rejected request that still holds: a rejecting zone
// refuses this cost (no less than it refused) until its wait ends, an
// admitting zone admits it (no more than it admitted), and no entry is
// older than DenyCacheFor. It reports whether it answered.
func (c *denyCache) lookup(now int64, parts []part, ds []algorithms.Decision) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var gen uint64
	rejects := false
	for i := range parts {
		p := &parts[i]
		e, ok := c.m[p.key]
		switch {
		case !ok, i > 0 && e.gen != gen, e.n != len(parts), e.block != p.block, e.op != p.op,
			now < e.at, now-e.at >= DenyCacheFor:
			return false
		case e.d.Allowed && p.x > e.cost:
			return false // a dearer request than the one admitted here
		case !e.d.Allowed && p.x < e.cost:
			return false // a cheaper request than the one refused here
		case !e.d.Allowed && e.d.Wait != algorithms.Never && now >= e.at+e.d.Wait:
			return false // its wait is over
		case !e.d.Allowed && p.z.limit.Kind == algorithms.Ban && now >= e.at+e.d.Reset:
			return false // the ban is over (its Wait covers its rate's too)
		}
		gen = e.gen
		elapsed := now - e.at
		d := e.d
		d.Reset = max(0, d.Reset-elapsed)
		if !d.Allowed && d.Wait != algorithms.Never {
			d.Wait -= elapsed
		}
		if !d.Allowed && p.block {
			rejects = true
		}
		ds[i] = d
	}
	if !rejects {
		return false
	}
	c.hits.Add(1)
	return true
}

// since is what store is to be passed for parts about to be sent to
// Redis: the forgets made so far in their keys' stripes (added up: the
// counts only grow, so the sum changes when one of them does).
func (c *denyCache) since(parts []part) uint64 {
	var n uint64
	for i := range parts {
		n += c.stripe(parts[i].key).Load()
	}
	return n
}

// store remembers a request Redis rejected at now (when it was sent),
// unless a key of its stripes was freed (see forget) since the request
// read since: the give-back, reset or grant may have run on Redis after
// the rejection, and cleared nothing, the rejection not being stored yet.
func (c *denyCache) store(now int64, since uint64, parts []part, ds []algorithms.Decision) {
	gen := c.gen.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.since(parts) != since {
		return
	}
	if len(c.m)+len(parts) > denyCacheMax {
		clear(c.m)
	}
	for i := range parts {
		p := &parts[i]
		c.m[p.key] = denial{gen: gen, n: len(parts), at: now, cost: p.x, op: p.op, block: p.block, d: ds[i]}
	}
}

// forget drops a key's entry, after a give-back, reset or grant, and
// keeps the rejections of requests in flight from being stored (see
// store).
func (c *denyCache) forget(key string) {
	c.mu.Lock()
	delete(c.m, key)
	c.stripe(key).Add(1)
	c.mu.Unlock()
}

// PubSub is the part of a go-redis client a deny cache's resets need.
type PubSub interface {
	Subscribe(ctx context.Context, channels ...string) *goredis.PubSub
	Publish(ctx context.Context, channel string, message any) *goredis.IntCmd
}

// WithDenyCache makes s answer a request it has just seen rejected from
// memory (see denyCache) and returns s. Resets are published on ps (the
// channel is the key prefix + ResetChannel), and from its first decision
// on, s listens there for the resets of every instance until Close (so
// that a configuration that is only validated connects to nothing). Call
// it before s decides anything.
func (s *Store) WithDenyCache(ps PubSub) *Store {
	s.deny = newDenyCache()
	s.pubsub = ps
	return s
}

// listen subscribes to the resets, once.
func (s *Store) listen() {
	s.listenOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		sub := s.pubsub.Subscribe(ctx, s.prefix+ResetChannel, s.prefix+GrantChannel)
		s.stopListen = func() {
			cancel()
			_ = sub.Close()
		}
		go func() {
			for msg := range sub.Channel() {
				rkey, grant, own := msg.Payload, int64(0), false
				if msg.Channel == s.prefix+GrantChannel {
					if rkey, grant, own = readGrant(msg.Payload); grant == 0 {
						continue
					}
				}
				s.deny.forget(rkey)
				s.book.heard(rkey, grant)
				if !own {
					s.resets.call(s.prefix, rkey, grant)
				}
			}
		}()
	})
}

// resetHooks are the functions OnReset registered, by zone (keyTail).
type resetHooks struct {
	mu sync.Mutex
	m  map[string][]*resetHook
}

type resetHook struct{ fn func(key string, grant int64) }

// OnReset has fn called with the resolved key of every reset (grant 0) or
// grant (of grant milli-units) of zone l's state that an instance
// publishes (Reset and Grant on a store with a deny cache), as soon as
// this store hears of it (it listens from its first decision on), until
// stop is called: this instance's resets too, but not its grants (this
// process applies them to its local copies itself, once). fn must not
// block: the store hears of them one after another. l is a limiter of
// s's Zone. Without a deny cache, fn is never called.
func (s *Store) OnReset(l storage.Limiter, fn func(key string, grant int64)) (stop func()) {
	z, ok := l.(*zone)
	if !ok || z.store != s {
		return func() {}
	}
	h := &resetHook{fn: fn}
	r := &s.resets
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string][]*resetHook)
	}
	r.m[z.tail] = append(r.m[z.tail], h)
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		hs := slices.DeleteFunc(r.m[z.tail], func(x *resetHook) bool { return x == h })
		if len(hs) == 0 {
			delete(r.m, z.tail)
		} else {
			r.m[z.tail] = hs
		}
	}
}

// call calls the hooks of the zone of rkey, a Redis key under prefix that
// a reset or grant named, with the resolved key.
func (r *resetHooks) call(prefix, rkey string, grant int64) {
	key, tail, ok := splitKey(prefix, rkey)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.m[tail] {
		h.fn(key, grant)
	}
}

// origin names this process in the grant notices it publishes, so that
// it skips its own (see OnReset).
var origin = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// GrantChannel is the pub/sub channel (after the key prefix) on which a
// grant names its origin, amount and Redis key (see grantNotice).
const GrantChannel = "grant"

// grantNotice is the message of a grant of amount milli-units to rkey:
// this process's origin, the amount and rkey, space-separated (rkey
// last: a resolved key may hold any byte).
func grantNotice(rkey string, amount int64) string {
	return origin + " " + strconv.FormatInt(amount, 10) + " " + rkey
}

// readGrant reads a grant's message: the Redis key, the amount granted
// (0 for a message it cannot read), and whether this process sent it.
func readGrant(msg string) (rkey string, grant int64, own bool) {
	from, rest, _ := strings.Cut(msg, " ")
	amount, rkey, ok := strings.Cut(rest, " ")
	grant, err := strconv.ParseInt(amount, 10, 64)
	if !ok || err != nil || grant <= 0 {
		return "", 0, false
	}
	return rkey, grant, from == origin
}

// splitKey is Store.key read backwards: the resolved key and the zone's
// keyTail of rkey, a Redis key under prefix.
func splitKey(prefix, rkey string) (key, tail string, ok bool) {
	rest, ok := strings.CutPrefix(rkey, prefix+"{")
	if !ok {
		return "", "", false
	}
	digits, rest, ok := strings.Cut(rest, ":")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n < 0 || n >= len(rest) || rest[n] != '}' {
		return "", "", false
	}
	return rest[:n], rest[n+1:], true
}

// DenyCacheHits returns how many requests the deny cache answered.
func (s *Store) DenyCacheHits() int64 {
	if s.deny == nil {
		return 0
	}
	return s.deny.hits.Load()
}
