// Package redis is Tollgate's shared store: limiter state lives in Redis,
// and every decision is one Lua script run atomically on the Redis server,
// timed by the server's clock, so that every Caddy instance that points at
// the same Redis shares one exact limit.
//
// Each algorithm of package algorithms has a Lua twin: a decision function
// in a .lua file next to this one. A script is common.lua (helpers), the
// decision functions it needs and a main part: single.lua runs one
// function on one key (a Zone's Take, Undo and Peek); multi.lua decides one
// request against several zones' keys (TakeAll). With WithFunctions, the
// same code runs as a Redis 7 function library instead (see functions),
// where the server has one; its batch function (batch.lua) runs several
// one-key decisions of a pipeline in one call, each as single.lua would. The Go side derives every
// constant a decision needs (the refill time of a cost, the bucket capacity
// as time, the window, the limit in milli-units) and passes it as an
// argument, so that the scripts only add and compare integers below 2^53,
// which Lua's doubles hold exactly (the sliding window's weight is a
// floating-point product in Go too, computed in the same order), and
// return the same Decision as the Go code, bit for bit; the tests check
// this against a real redis-server.
//
// A request passes only if every zone that applies admits it, and a
// rejected request is charged nowhere. TakeAll keeps that rule atomically
// for the zones one script can reach: all of them on one server, those
// whose keys share a Cluster slot on a Cluster. Key puts the resolved key
// alone in the hash tag, so that zones keyed by the same identity (say,
// the client IP) share a slot. Across slots TakeAll gives back what
// earlier slots took when a later one rejects, which errs towards
// rejecting and never admits more than a limit.
//
// A concurrency slot is a lease (concurrency.lua) that the store renews
// while its request holds it (Zone's Hold): one loop per store renews
// every lease due in a tick with one call of renew.lua per Cluster slot
// (one in all on a single server), all in one pipeline (see Lease).
//
// Every write sets a TTL: the moment the state is fresh again, rounded up
// to the millisecond, so that Redis forgets idle keys by itself. A state
// that is fresh already is deleted instead of written. A check writes
// nothing, so a request that several zones decide in one script and that
// is rejected writes nothing at all.
//
// The package does not know Caddy; it needs only a go-redis client.
package redis

import (
	"context"
	"strconv"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// DefaultPrefix is the key prefix of the contract's default configuration.
const DefaultPrefix = "tollgate:"

// Client is the part of a go-redis client the store uses: Process, which
// runs its scripts (EVALSHA, and EVAL when the server lacks one; FCALL and
// FUNCTION LOAD with WithFunctions), and DEL for Reset. *goredis.Client, *goredis.ClusterClient, *goredis.Ring and
// goredis.UniversalClient satisfy it.
//
// The store honours each call's context only if the client does: create it
// with ContextTimeoutEnabled set, or go-redis applies its own read and write
// timeouts instead of the context's deadline.
type Client interface {
	Process(ctx context.Context, cmd goredis.Cmder) error
	Del(ctx context.Context, keys ...string) *goredis.IntCmd
}

// Store runs zones' decisions on one Redis (a server, a Sentinel-managed
// primary or a Cluster). It holds no state of its own and is safe for
// concurrent use.
type Store struct {
	client Client
	run    runner // runs the scripts: directly, or batched
	batch  *batcher
	fns    *functions // nil without WithFunctions
	prefix string

	deny       *denyCache // nil without WithDenyCache
	pubsub     PubSub
	listenOnce sync.Once
	mu         sync.Mutex // guards stopListen and closed
	stopListen func()
	closed     bool
	resets     resetHooks    // what resets the store hears of call (OnReset)
	late       chan struct{} // bounds the give-backs run in the background (see settle)
	leases     *keeper       // renews the concurrency leases held (see Zone's Hold)
	book       *book         // the quota leases held (see quota.go)
	// group is how TakeAll splits a request's keys into the groups that
	// one script can decide together (see grouping).
	group grouping
	// unanswered are the grants with an id whose answer this process
	// did not get (see zone.GrantOnce).
	unanswered unanswered

	// Test hooks, set only by this package's tests. callerClock passes
	// the caller's now to the scripts instead of -1 (the server's clock);
	// ttlSlack adds ms to every TTL, so that keys outlive a clock the
	// tests hold still.
	callerClock bool
	ttlSlack    int64
	// skew is µs added to the caller's now where it stands for this
	// instance's own clock (a calendar window's span), so that tests
	// can run instances whose clocks disagree with Redis's.
	skew int64
}

// New returns a store that keeps its keys in Redis under prefix (see Key).
//
// TakeAll decides a request's zones in as few script runs as client
// allows: a *goredis.Client talks to one server (standalone, or the
// primary Sentinel names), so one script decides every zone; a
// *goredis.ClusterClient runs one script per Cluster slot; any other
// client (a Ring, a wrapper) one per hash tag, since a Ring shards by tag.
func New(client Client, prefix string) *Store {
	s := &Store{client: client, run: direct{client: client}, prefix: prefix, group: byTag, late: make(chan struct{}, lateGiveBacks)}
	s.leases = newKeeper(s)
	s.book = newBook(s)
	switch client.(type) {
	case *goredis.Client:
		s.group = oneServer
	case *goredis.ClusterClient:
		s.group = bySlot
	}
	return s
}

// NewPipelined returns a store as New does whose concurrent decisions share
// network round trips: calls made while others are in flight go out
// together as one pipeline (see batcher). Each decision is still one
// atomic script. Close stops it.
func NewPipelined(client interface {
	Client
	Pipeliner
}, prefix string) *Store {
	s := New(client, prefix)
	s.batch = newBatcher(client)
	// One server runs a batch's one-key calls as one call of the
	// library's batch function (with WithFunctions): each decision as
	// its own, one after another.
	s.batch.combine = s.group == oneServer
	s.run = s.batch
	return s
}

// Close stops a pipelined store's batcher (calls after it fail), the
// renewal of leases and a deny cache's listening. It does not close the
// client.
func (s *Store) Close() {
	s.leases.close()
	s.book.close() // returns the quota leases: before the batcher stops
	if s.batch != nil {
		s.batch.close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.stopListen != nil {
		s.stopListen()
	}
}

// Zone returns the limiter for zone z. Instances share a key's state exactly
// when they share the Redis, the prefix, the zone name, the algorithm and
// the key; a zone whose limit (but not its algorithm) changes keeps its
// keys' states.
func (s *Store) Zone(z storage.Zone) storage.Limiter {
	l := z.Limit
	zn := &zone{
		store:  s,
		name:   z.Name,
		limit:  l,
		script: scripts[l.Kind],
		tail:   keyTail(z.Name, l.Kind),
		consts: constants(&l),
	}
	if l.Kind != algorithms.Concurrency && l.Capacity() >= algorithms.Milli {
		zn.unit = amount(&l, algorithms.Milli)
		zn.unitArg = zn.unit
	}
	zn.leases = z.Lease && l.Leasable()
	return zn
}

// Key returns the Redis key that holds the state of key in zone with
// algorithm kind:
//
//	prefix + "{" + len(key) + ":" + key + "}" + len(zone) + ":" + zone + ":" + code
//
// where the lengths are decimal byte counts and code is a two-letter name
// of the algorithm (tb, gc, sw, sl, fw, lb); for example
// "tollgate:{11:203.0.113.7}6:per_ip:tb".
//
// The Redis Cluster hash tag, the bytes between the first '{' and the
// next '}', comes from the resolved key alone (it is a prefix of
// len(key) + ":" + key, even when key holds braces), so that the zones
// that key the same identity, say two zones keyed by client IP, share a
// slot and TakeAll decides them in one script. A prefix with a hash tag
// of its own pins every key to that tag's slot.
//
// Read from the left, the lengths make the key unambiguous for any zone
// name and any resolved key, whatever bytes they hold: zone "a:b" with
// key "c" and zone "a" with key "b:c" get different keys, and so do keys
// with '{', '}' or ':' in them. The algorithm's code keeps a zone whose
// algorithm changes from reading a state of another shape.
func (s *Store) Key(zone string, kind algorithms.Kind, key string) string {
	return s.key(key, keyTail(zone, kind))
}

// key returns the Redis key of key, given its zone's keyTail.
func (s *Store) key(key, tail string) string {
	var buf [128]byte
	return string(s.appendKey(buf[:0], key, tail))
}

// appendKey appends s.key(key, tail) to dst.
func (s *Store) appendKey(dst []byte, key, tail string) []byte {
	dst = append(dst, s.prefix...)
	dst = append(dst, '{')
	dst = strconv.AppendInt(dst, int64(len(key)), 10)
	dst = append(dst, ':')
	dst = append(dst, key...)
	dst = append(dst, '}')
	return append(dst, tail...)
}

// keyTail is the part of a Redis key after the hash tag, the same for all
// of a zone's keys.
func keyTail(zone string, k algorithms.Kind) string {
	return strconv.Itoa(len(zone)) + ":" + zone + ":" + kindCode(k)
}

// kindCode is the two-letter name of an algorithm in Redis keys and
// script arguments.
func kindCode(k algorithms.Kind) string {
	if int(k) < len(kindCodes) {
		return kindCodes[k]
	}
	return strconv.Itoa(int(k))
}

var kindCodes = [...]string{
	algorithms.TokenBucket:   "tb",
	algorithms.GCRA:          "gc",
	algorithms.SlidingWindow: "sw",
	algorithms.SlidingLog:    "sl",
	algorithms.FixedWindow:   "fw",
	algorithms.LeakyBucket:   "lb",
	algorithms.Concurrency:   "cc",
	algorithms.Ban:           "bn",
}
