// Package redis is Tollgate's shared store: limiter state lives in Redis,
// and every decision is one Lua script run atomically on the Redis server,
// timed by the server's clock, so that every Caddy instance that points at
// the same Redis shares one exact limit.
//
// Each algorithm of package algorithms has a Lua twin in a .lua file next to
// this one (common.lua is the prologue all of them share). The Go side
// derives every constant a decision needs (the refill time of a cost, the
// bucket capacity as time, the window, the limit in milli-units) and passes
// it as an argument, so that the scripts only add and compare integers
// below 2^53, which Lua's doubles hold exactly (the sliding window's weight
// is a floating-point product in Go too, computed in the same order), and
// return the same Decision as the Go code, bit for bit; the tests check
// this against a real redis-server.
//
// Every write sets a TTL: the moment the state is fresh again, rounded up
// to the millisecond, so that Redis forgets idle keys by itself. A state
// that is fresh already is deleted instead of written.
//
// The package does not know Caddy; it needs only a go-redis client.
package redis

import (
	"context"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// DefaultPrefix is the key prefix of the contract's default configuration.
const DefaultPrefix = "tollgate:"

// Client is the part of a go-redis client the store uses: scripts, and DEL
// for Reset. *goredis.Client, *goredis.ClusterClient, *goredis.Ring and
// goredis.UniversalClient satisfy it.
//
// The store honours each call's context only if the client does: create it
// with ContextTimeoutEnabled set, or go-redis applies its own read and write
// timeouts instead of the context's deadline.
type Client interface {
	goredis.Scripter
	Del(ctx context.Context, keys ...string) *goredis.IntCmd
}

// Store runs zones' decisions on one Redis (a server, a Sentinel-managed
// primary or a Cluster). It holds no state of its own and is safe for
// concurrent use.
type Store struct {
	client Client
	prefix string

	// Test hooks, set only by this package's tests. callerClock passes
	// the caller's now to the scripts instead of -1 (the server's clock);
	// ttlSlack adds ms to every TTL, so that keys outlive a clock the
	// tests hold still.
	callerClock bool
	ttlSlack    int64
}

// New returns a store that keeps its keys in Redis under prefix (see Key).
func New(client Client, prefix string) *Store {
	return &Store{client: client, prefix: prefix}
}

// Zone returns the limiter for zone z. Instances share a key's state exactly
// when they share the Redis, the prefix, the zone name, the algorithm and
// the key; a zone whose limit (but not its algorithm) changes keeps its
// keys' states.
func (s *Store) Zone(z storage.Zone) storage.Limiter {
	l := z.Limit
	return &zone{
		store:  s,
		name:   z.Name,
		limit:  l,
		script: scripts[l.Kind],
		head:   s.keyHead(z.Name),
		tail:   keyTail(l.Kind),
		consts: constants(&l),
	}
}

// Key returns the Redis key that holds the state of key in zone with
// algorithm kind:
//
//	prefix + "{" + len(zone) + ":" + zone + ":" + key + "}:" + code
//
// where code is a two-letter name of the algorithm (tb, gc, sw, sl, fw,
// lb). Length-prefixing the zone name makes the key unambiguous: zone "a:b"
// with key "c" and zone "a" with key "b:c" get different keys. The braces
// are a Redis Cluster hash tag, so that everything a script touches for
// one identity is in one slot; a prefix with a hash tag of its own pins
// every key to that tag's slot. The algorithm's code keeps a zone whose
// algorithm changes from reading a state of another shape.
func (s *Store) Key(zone string, kind algorithms.Kind, key string) string {
	return s.keyHead(zone) + key + keyTail(kind)
}

func (s *Store) keyHead(zone string) string {
	return s.prefix + "{" + strconv.Itoa(len(zone)) + ":" + zone + ":"
}

func keyTail(k algorithms.Kind) string {
	if int(k) < len(kindCodes) {
		return "}:" + kindCodes[k]
	}
	return "}:" + strconv.Itoa(int(k))
}

var kindCodes = [...]string{
	algorithms.TokenBucket:   "tb",
	algorithms.GCRA:          "gc",
	algorithms.SlidingWindow: "sw",
	algorithms.SlidingLog:    "sl",
	algorithms.FixedWindow:   "fw",
	algorithms.LeakyBucket:   "lb",
}
