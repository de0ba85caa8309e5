// Package memory is Tollgate's in-process store: one Store per zone, a
// sharded map from resolved key to limiter state. A decision locks only its
// key's shard; TakeAll decides several zones' keys as one step by locking
// all of their shards.
//
// The store is bounded by MaxKeys for the whole zone: no key is evicted
// while the zone holds fewer, and past it the zone's least recently used
// key goes first (one LRU list for the zone, not one per shard), and is
// counted. Sweep forgets keys whose state is fresh again, which changes no
// decision.
//
// Recency is kept to the second: a key moves to the front of the zone's LRU
// list at most once per second. Moving it takes the list's lock and writes
// to its two neighbours, and skipping that for keys already moved within
// the second keeps a decision on 100,000 keys cheap.
//
// Locks: a shard's mutex guards its map and the states of its entries; the
// zone's LRU mutex guards the list, the count and each entry's links. The
// order is shards (by address, when several) then the LRU; an evicted key's
// entry is unlinked under the LRU lock and marked evicted at once, and
// deleted from its shard's map after the locks held are released, so that
// no goroutine ever waits for a shard while holding the LRU lock.
package memory

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// DefaultMaxKeys is the bound on keys per zone when Zone.MaxKeys is 0.
const DefaultMaxKeys = 1_000_000

// numShards is how many shards a store has.
const numShards = 64

// Store is one zone's in-memory limiter. It is safe for concurrent use. It
// never holds more than MaxKeys keys.
type Store struct {
	limit     algorithms.Limit
	seed      maphash.Seed
	maxKeys   int64
	shards    [numShards]shard
	lru       lru
	keys      atomic.Int64 // lru.n, readable without the lock
	evictions atomic.Int64
}

// shard is a map of entries, guarded by mu.
type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	_  [64]byte // keep shards on separate cache lines
}

// lru is the zone's list of entries, most recently used at head, and their
// count. Guarded by mu.
type lru struct {
	mu         sync.Mutex
	head, tail *entry
	n          int64
	_          [64]byte
}

type entry struct {
	key        string
	state      algorithms.State // guarded by the key's shard lock
	promoted   atomic.Int64     // when the entry last moved to the front, µs
	evicted    atomic.Bool      // unlinked from the LRU; set under the LRU lock
	prev, next *entry           // guarded by the LRU lock
}

// promoteEvery is how stale an entry's place in the LRU list may get: 1s.
const promoteEvery = 1_000_000

// New returns an empty store for zone z.
func New(z storage.Zone) *Store {
	maxKeys := int64(z.MaxKeys)
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	s := &Store{limit: z.Limit, seed: maphash.MakeSeed(), maxKeys: maxKeys}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	return s
}

var _ storage.Limiter = (*Store)(nil)

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%numShards]
}

// lookup returns key's live entry in sh, or nil. sh.mu must be held.
func (sh *shard) lookup(key string) *entry {
	e := sh.m[key]
	if e != nil && e.evicted.Load() {
		return nil // evicted; its deletion from the map is under way
	}
	return e
}

// Take decides one request for key at now. It never fails.
func (s *Store) Take(_ context.Context, key string, now, cost int64) (algorithms.Decision, error) {
	sh := s.shard(key)
	sh.mu.Lock()
	e, victim := s.get(sh, key, now)
	d := s.limit.Take(&e.state, now, cost)
	sh.mu.Unlock()
	s.drop(victim)
	return d, nil
}

// get returns key's entry in sh, inserted if it is not held (and the entry
// it evicted for it, if any, which the caller must drop once it holds no
// lock), or promoted in the LRU if its place is stale. sh.mu must be held.
func (s *Store) get(sh *shard, key string, now int64) (e, victim *entry) {
	if e = sh.lookup(key); e == nil {
		return s.insert(sh, key, now)
	}
	if p := e.promoted.Load(); now-p >= promoteEvery || now < p {
		s.lru.mu.Lock()
		if !e.evicted.Load() {
			s.lru.moveToFront(e)
		}
		s.lru.mu.Unlock()
		e.promoted.Store(now)
	}
	return e, nil
}

// Undo gives back cost that the Take for key whose Decision is taken
// charged, to where it was charged (see algorithms.Limit.Undo). A key that
// was evicted or swept meanwhile has nothing to give back.
func (s *Store) Undo(_ context.Context, key string, now, cost int64, taken algorithms.Decision) error {
	sh := s.shard(key)
	sh.mu.Lock()
	if e := sh.lookup(key); e != nil {
		s.limit.Undo(&e.state, now, cost, taken)
		if s.limit.Kind == algorithms.Concurrency && e.state.Level == 0 {
			s.remove(sh, e)
		}
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
	e := sh.lookup(key)
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
	e := sh.lookup(key)
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
			if e.evicted.Load() || s.limit.Fresh(&e.state, now) {
				if s.remove(sh, e) {
					n++
				}
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

// insert adds a fresh entry for key at the head of the LRU list, and, if
// the zone is full, evicts its least recently used entry, which it returns
// for drop. sh.mu must be held.
func (s *Store) insert(sh *shard, key string, now int64) (e, victim *entry) {
	e = &entry{key: key, state: algorithms.NewState(&s.limit)}
	e.promoted.Store(now)
	sh.m[key] = e // replaces an evicted entry of the same key, if any
	s.lru.mu.Lock()
	s.lru.pushFront(e)
	s.lru.n++
	// A concurrency store holds only the keys with requests in flight
	// (Undo forgets a key whose last one ends): bounded by the requests
	// the server runs at once, and evicting one would free its slots.
	if s.lru.n > s.maxKeys && s.limit.Kind != algorithms.Concurrency {
		victim = s.lru.tail
		s.lru.unlink(victim)
		victim.evicted.Store(true)
		s.lru.n--
		s.evictions.Add(1)
	}
	s.keys.Store(s.lru.n)
	s.lru.mu.Unlock()
	return e, victim
}

// drop deletes an evicted entry from its shard's map, unless the key has
// been inserted again meanwhile. It must be called holding no lock.
func (s *Store) drop(victim *entry) {
	if victim == nil {
		return
	}
	sh := s.shard(victim.key)
	sh.mu.Lock()
	if sh.m[victim.key] == victim {
		delete(sh.m, victim.key)
	}
	sh.mu.Unlock()
}

// remove deletes e from sh and the LRU list, and reports whether it was a
// live (counted) key. sh.mu must be held.
func (s *Store) remove(sh *shard, e *entry) bool {
	delete(sh.m, e.key)
	s.lru.mu.Lock()
	defer s.lru.mu.Unlock()
	if e.evicted.Load() {
		return false
	}
	s.lru.unlink(e)
	e.evicted.Store(true)
	s.lru.n--
	s.keys.Store(s.lru.n)
	return true
}

// moveToFront moves e to the head of the list. l.mu must be held.
func (l *lru) moveToFront(e *entry) {
	if l.head == e {
		return
	}
	l.unlink(e)
	l.pushFront(e)
}

func (l *lru) pushFront(e *entry) {
	e.prev, e.next = nil, l.head
	if l.head != nil {
		l.head.prev = e
	}
	l.head = e
	if l.tail == nil {
		l.tail = e
	}
}

func (l *lru) unlink(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

// Request is one zone's part of a request decided by TakeAll.
type Request struct {
	// Store is the zone's store.
	Store *Store
	// Key is the resolved key, bounded with storage.BoundKey.
	Key string
	// Cost is the request's cost in milli-units.
	Cost int64
	// DryRun marks a zone that never rejects: its rejection does not stop
	// the other zones, and, like every rejecting zone, it is not charged.
	DryRun bool
	// Strike links the request to its zone's ban: when it is 1 + the index
	// in reqs of a request whose Store has a Ban limit, which comes before
	// this one, a ban in force there answers for this zone (this request
	// is not decided), and this request's rejection is a strike there.
	// 0: no ban.
	Strike int
}

// maxInline is how many requests TakeAll handles without allocating.
const maxInline = 8

// TakeAll decides reqs, the zones that apply to one request, as one step at
// now: it locks every key's shard (each once, in address order, so that
// concurrent calls cannot deadlock), checks every zone, and only if every
// zone that is not a dry run admits the request takes in every admitting
// zone. A check does not insert a key the store does not hold (it is
// fresh). It writes one Decision per request into ds (len(ds) >=
// len(reqs)) and returns the index of the first rejecting zone that is not
// a dry run, or -1. A rejected request charges nothing anywhere, and its
// Decisions are what each zone would decide with nothing charged.
//
// A request linked to a ban (Request.Strike) is not decided while the ban
// holds: its Decision is an empty admission, and the ban's rejection
// stands for the zone. Once every zone is decided, each ban that does not
// hold gets one strike if a request linked to it was rejected; a ban that
// starts then rejects the request too. A Ban's request charges nothing.
//
// Each Store may appear once in reqs. A single request is decided exactly
// as Store.Take decides it.
func TakeAll(now int64, reqs []Request, ds []algorithms.Decision) int {
	if len(reqs) == 1 {
		r := &reqs[0]
		ds[0], _ = r.Store.Take(context.Background(), r.Key, now, r.Cost)
		if !ds[0].Allowed && !r.DryRun {
			return 0
		}
		return -1
	}
	var shbuf, lockbuf [maxInline]*shard
	shards := shbuf[:0]
	for i := range reqs {
		shards = append(shards, reqs[i].Store.shard(reqs[i].Key))
	}
	locked := lockAll(append(lockbuf[:0], shards...))

	rejected := -1
	for i := range reqs {
		r := &reqs[i]
		if b := banOf(reqs, i); b >= 0 && !ds[b].Allowed {
			ds[i] = algorithms.Decision{Allowed: true} // banned: not decided
			continue
		}
		var st algorithms.State
		if e := shards[i].lookup(r.Key); e != nil {
			st = e.state // a copy: Peek may bring it up to date
		} else {
			st = algorithms.NewState(&r.Store.limit)
		}
		ds[i] = r.Store.limit.Peek(&st, now, r.Cost)
		if !ds[i].Allowed && !r.DryRun && rejected < 0 {
			rejected = i
		}
	}
	var vbuf [maxInline]*entry // victims[i] was evicted from reqs[i].Store
	victims := vbuf[:0]
	if len(reqs) > maxInline {
		victims = make([]*entry, 0, len(reqs))
	}
	victims = victims[:len(reqs)]
	clear(victims)
	if rejected < 0 {
		// Decided on the same state at the same now, a take admits
		// exactly when its check did.
		for i := range reqs {
			r := &reqs[i]
			b := banOf(reqs, i)
			banned := b >= 0 && !ds[b].Allowed
			if ds[i].Allowed && !banned && r.Store.limit.Kind != algorithms.Ban {
				var e *entry
				e, victims[i] = r.Store.get(shards[i], r.Key, now)
				ds[i] = r.Store.limit.Take(&e.state, now, r.Cost)
			}
		}
	}
	if strike(now, reqs, shards, ds, victims) {
		rejected = firstRejecting(reqs, ds)
	}
	for _, sh := range locked {
		sh.mu.Unlock()
	}
	for i, v := range victims {
		reqs[i].Store.drop(v)
	}
	return rejected
}

// strike gives each ban in reqs that does not hold one strike if a request
// linked to it was rejected, and reports whether a ban started. The
// shards of reqs must be locked.
func strike(now int64, reqs []Request, shards []*shard, ds []algorithms.Decision, victims []*entry) (started bool) {
	for b := range reqs {
		r := &reqs[b]
		if r.Store.limit.Kind != algorithms.Ban || !ds[b].Allowed {
			continue
		}
		for j := b + 1; j < len(reqs); j++ {
			if banOf(reqs, j) == b && !ds[j].Allowed {
				var e *entry
				e, victims[b] = r.Store.get(shards[b], r.Key, now)
				ds[b] = r.Store.limit.Strike(&e.state, now)
				started = started || !ds[b].Allowed
				break
			}
		}
	}
	return started
}

// banOf is the index of request i's ban (Request.Strike), or -1 for none,
// or for a link that names no earlier request with a Ban limit.
func banOf(reqs []Request, i int) int {
	b := reqs[i].Strike - 1
	if b < 0 || b >= i || reqs[b].Store.limit.Kind != algorithms.Ban {
		return -1
	}
	return b
}

// firstRejecting is the index of the first rejecting request that is not a
// dry run, or -1.
func firstRejecting(reqs []Request, ds []algorithms.Decision) int {
	for i := range reqs {
		if !ds[i].Allowed && !reqs[i].DryRun {
			return i
		}
	}
	return -1
}

// lockAll sorts shards by address, locks each distinct one once, and
// returns the distinct ones (a prefix of shards) for unlocking.
func lockAll(shards []*shard) []*shard {
	for i := 1; i < len(shards); i++ { // insertion sort: a handful of shards
		for j := i; j > 0 && uintptr(unsafe.Pointer(shards[j])) < uintptr(unsafe.Pointer(shards[j-1])); j-- {
			shards[j], shards[j-1] = shards[j-1], shards[j]
		}
	}
	n := 0
	for i, sh := range shards {
		if i > 0 && sh == shards[i-1] {
			continue
		}
		shards[n] = sh
		n++
		sh.mu.Lock()
	}
	return shards[:n]
}
