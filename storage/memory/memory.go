// Package memory is Tollgate's in-process store: one Store per zone, a
// sharded map from resolved key to limiter state. A decision locks only its
// key's shard. The store is bounded: past MaxKeys the least recently used
// key of the shard is evicted (and counted), and Sweep forgets keys whose
// state is fresh again, which changes no decision.
//
// Recency is kept to the second: a key moves to the front of its shard's
// LRU list at most once per second. Moving it writes to its two neighbours,
// two cache misses on a large store, and skipping that for keys already
// moved within the second keeps a decision on 100,000 keys under 100 ns.
package memory

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// DefaultMaxKeys is the bound on keys per zone when Zone.MaxKeys is 0.
const DefaultMaxKeys = 1_000_000

// maxShards is the most shards a store uses; fewer when MaxKeys is small,
// so that every shard holds at least one key.
const maxShards = 64

// Store is one zone's in-memory limiter. It is safe for concurrent use.
// Its capacity is the largest multiple of its shard count not above
// MaxKeys, so it never holds more than MaxKeys keys.
type Store struct {
	limit     algorithms.Limit
	seed      maphash.Seed
	mask      uint64
	perShard  int
	shards    []shard
	keys      atomic.Int64
	evictions atomic.Int64
}

// shard is a map plus an intrusive LRU list: head is the most recently
// used entry, tail the least. Guarded by mu.
type shard struct {
	mu         sync.Mutex
	m          map[string]*entry
	head, tail *entry
	_          [64]byte // keep shards on separate cache lines
}

type entry struct {
	key        string
	state      algorithms.State
	promoted   int64 // when the entry last moved to the front, µs
	prev, next *entry
}

// promoteEvery is how stale an entry's place in the LRU list may get: 1s.
const promoteEvery = 1_000_000

// New returns an empty store for zone z.
func New(z storage.Zone) *Store {
	maxKeys := z.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	n := maxShards
	if maxKeys < n {
		n = 1 << (bits.Len(uint(maxKeys)) - 1) // largest power of two <= maxKeys
	}
	s := &Store{
		limit:    z.Limit,
		seed:     maphash.MakeSeed(),
		mask:     uint64(n - 1),
		perShard: maxKeys / n,
		shards:   make([]shard, n),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	return s
}

var _ storage.Limiter = (*Store)(nil)

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)&s.mask]
}

// Take decides one request for key at now. It never fails.
func (s *Store) Take(_ context.Context, key string, now, cost int64) (algorithms.Decision, error) {
	sh := s.shard(key)
	sh.mu.Lock()
	e := sh.m[key]
	if e == nil {
		e = s.insert(sh, key, now)
	} else if now-e.promoted >= promoteEvery || now < e.promoted {
		sh.touch(e)
		e.promoted = now
	}
	d := s.limit.Take(&e.state, now, cost)
	sh.mu.Unlock()
	return d, nil
}

// Undo gives back cost taken earlier for key. A key that was evicted or
// swept meanwhile has nothing to give back.
func (s *Store) Undo(_ context.Context, key string, now, cost int64) error {
	sh := s.shard(key)
	sh.mu.Lock()
	if e := sh.m[key]; e != nil {
		s.limit.Undo(&e.state, now, cost)
	}
	sh.mu.Unlock()
	return nil
}

// Peek reports the decision one event for key would get at now, charging
// nothing. ok is false for a key the store does not hold.
func (s *Store) Peek(_ context.Context, key string, now int64) (algorithms.Decision, bool, error) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil {
		return algorithms.Decision{}, false, nil
	}
	return s.limit.Peek(&e.state, now, algorithms.Milli), true, nil
}

// Reset forgets key. ok is false for a key the store did not hold.
func (s *Store) Reset(_ context.Context, key string) (bool, error) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil {
		return false, nil
	}
	s.remove(sh, e)
	return true, nil
}

// Sweep forgets every key whose state is fresh at now and returns how many
// it forgot. It locks one shard at a time.
func (s *Store) Sweep(now int64) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if s.limit.Fresh(&e.state, now) {
				s.remove(sh, e)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// Len returns the number of keys held.
func (s *Store) Len() int { return int(s.keys.Load()) }

// Evictions returns how many keys have been evicted to respect MaxKeys.
func (s *Store) Evictions() int64 { return s.evictions.Load() }

// Limit returns the limit the store decides with.
func (s *Store) Limit() algorithms.Limit { return s.limit }

// insert adds a fresh entry for key at the head, evicting the least
// recently used entry if the shard is full. sh.mu must be held.
func (s *Store) insert(sh *shard, key string, now int64) *entry {
	if len(sh.m) >= s.perShard && sh.tail != nil {
		s.remove(sh, sh.tail)
		s.evictions.Add(1)
	}
	e := &entry{key: key, state: algorithms.NewState(&s.limit), promoted: now}
	sh.m[key] = e
	sh.pushFront(e)
	s.keys.Add(1)
	return e
}

// remove unlinks and deletes e. sh.mu must be held.
func (s *Store) remove(sh *shard, e *entry) {
	sh.unlink(e)
	delete(sh.m, e.key)
	s.keys.Add(-1)
}

// touch moves e to the head of the LRU list. sh.mu must be held.
func (sh *shard) touch(e *entry) {
	if sh.head == e {
		return
	}
	sh.unlink(e)
	sh.pushFront(e)
}

func (sh *shard) pushFront(e *entry) {
	e.prev, e.next = nil, sh.head
	if sh.head != nil {
		sh.head.prev = e
	}
	sh.head = e
	if sh.tail == nil {
		sh.tail = e
	}
}

func (sh *shard) unlink(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		sh.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		sh.tail = e.prev
	}
	e.prev, e.next = nil, nil
}
