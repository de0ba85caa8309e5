// Package storage runs rate-limit decisions atomically against a store.
// A store holds one limiter state per (zone, key); a decision reads the
// state, runs the zone's algorithm from package algorithms and writes the
// new state as one atomic step: under a shard lock in the memory store
// (package storage/memory), as one Lua script on the server in the Redis
// store (package storage/redis).
package storage

import (
	"context"
	"crypto/sha256"
	"encoding/base64"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// Zone is what a store needs to know of one rate-limit zone.
type Zone struct {
	// Name is the zone's name; no zone can read another zone's state.
	Name string
	// Limit is the zone's algorithm and limit.
	Limit algorithms.Limit
	// MaxKeys bounds the keys an in-memory store keeps for the zone.
	MaxKeys int
	// Lease lets a shared store decide the zone's hot keys from quota
	// leased from the shared state (see storage/redis's quota leases),
	// where its algorithm allows (algorithms.Limit.Leasable). A store
	// of one instance ignores it.
	Lease bool
}

// Limiter runs one zone's decisions. Keys are resolved keys, already bounded
// with BoundKey. Times are µs since the Unix epoch and costs milli-units, as
// in package algorithms. A store that keeps its own clock (Redis) ignores now.
type Limiter interface {
	// Take decides one request of cost for key and charges it if admitted.
	Take(ctx context.Context, key string, now, cost int64) (algorithms.Decision, error)
	// Undo gives back cost that the Take for key whose Decision is taken
	// admitted, to where it was charged (see algorithms.Limit.Undo).
	Undo(ctx context.Context, key string, now, cost int64, taken algorithms.Decision) error
	// Peek reports key's state as the decision for one event would see it,
	// charging nothing; ok is false for a key the store does not hold.
	Peek(ctx context.Context, key string, now int64) (d algorithms.Decision, ok bool, err error)
	// Reset forgets key at now, so that its next request finds a fresh
	// state; ok is false for a key the store did not hold. What a
	// request admitted before the reset was charged is forgotten with
	// it: its Undo gives nothing back (the reset gave it all back), so
	// that it cannot take from what the key was charged since.
	Reset(ctx context.Context, key string, now int64) (ok bool, err error)
}

// Horizon is the longest, in µs, that a charge counts in a state of l after
// the decision that made it: a window's charge counts in its window (and,
// for sliding_window, in the next one's weighted count), a bucket's drains
// in Tau (plus MaxDelay for a shaper). Past it, an Undo of the charge
// gives nothing back whatever the state holds, so a store need not
// remember a key's reset (see Limiter.Reset) for longer.
func Horizon(l *algorithms.Limit) int64 {
	return 2*l.Window + l.Tau/max(l.Scale, 1) + 1 + l.MaxDelay + l.Hold
}

// ResetAt dates a reset of a key at now (see Limiter.Reset): mark, the
// time a give-back or settlement compares a charge's Decision.At with,
// and hold, the time the key's fresh state holds its clock at since (see
// algorithms.Limit.HeldAt). seen is the latest time the key's state has
// seen, the At of a look at it at now (see algorithms.Limit.Peek), and
// last the key's previous reset mark (0 for either: none).
//
// A reset is dated now, or last if that is later. If the state has seen a
// later time still, the clock ran backwards since a decision on it: the
// reset is then dated one µs after that time, after every charge it
// forgets, and the fresh state holds its clock one µs later still, so
// that every decision since is dated after the reset. A charge dated at
// or before mark gives nothing back since, and its excess is forgiven if
// dated before; one dated after gives back, and owes, as ever. A decision
// at the mark's very µs (a clock that did not run back) may have been
// made before the reset or after: its give-back gives nothing (it must
// not mint), its excess is owed (it must not be forgiven). The Redis
// store's reset (single.lua, op 'x') is the twin.
func ResetAt(now, seen, last int64) (mark, hold int64) {
	mark = max(now, last)
	hold = mark
	if seen > mark {
		mark = seen + 1
		hold = mark + 1
	}
	return mark, hold
}

// Granter is a Limiter that can give one key extra quota for its current
// window (see algorithms.Limit.Grant): the memory and Redis stores.
type Granter interface {
	// Grant gives key amount milli-units more for its current window and
	// returns the decision one event would then get. A limit whose
	// algorithm has no window fails with algorithms.ErrNoGrant.
	Grant(ctx context.Context, key string, now, amount int64) (algorithms.Decision, error)
}

// GrantPeeker is a Limiter that tells, beside what Peek reports, how
// much of a key's state is granted quota: the memory and Redis stores.
type GrantPeeker interface {
	// PeekGrant is Peek, and granted the milli-units granted to key's
	// current window (see algorithms.Limit.Granted), 0 when none is.
	PeekGrant(ctx context.Context, key string, now int64) (d algorithms.Decision, granted int64, ok bool, err error)
}

// PeekGrant is l's PeekGrant, or for a Limiter that keeps no grants its
// Peek, with granted 0.
func PeekGrant(ctx context.Context, l Limiter, key string, now int64) (d algorithms.Decision, granted int64, ok bool, err error) {
	if g, can := l.(GrantPeeker); can {
		return g.PeekGrant(ctx, key, now)
	}
	d, ok, err = l.Peek(ctx, key, now)
	return d, 0, ok, err
}

// OnceGranter is a Granter that applies a grant with an id at most once
// per key and window (the Redis store: on every instance).
type OnceGranter interface {
	// GrantOnce is Grant for a grant with an id (none if ""): a grant
	// whose id was applied to key already applies nothing, returns the
	// key's state, and reports applied false.
	GrantOnce(ctx context.Context, key string, now, amount int64, id string) (d algorithms.Decision, applied bool, err error)
}

// MaxKeyLen is the longest resolved key stored as it is; BoundKey hashes
// longer ones.
const MaxKeyLen = 128

// BoundKey bounds a resolved key's size: a key of at most MaxKeyLen bytes is
// returned unchanged (no allocation); a longer one is replaced by "#" and
// the base64 of its SHA-256. A short key that itself starts with "#" is
// hashed too, so that no client can name the hashed form of another's key.
func BoundKey(key string) string {
	if len(key) <= MaxKeyLen && (key == "" || key[0] != '#') {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "#" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// Skipped reports whether d is the empty admission that a store's TakeAll
// reports for a zone it did not decide, because the zone's ban held: such
// a zone took nothing and has nothing to give back. Every decision a
// limit makes has an At, so no decision made is empty.
func Skipped(d algorithms.Decision) bool {
	return d == algorithms.Decision{Allowed: true}
}
