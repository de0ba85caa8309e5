// Package memory is Tollgate's in-process store: one Store per zone, a
// sharded hash table from resolved key to limiter state. A decision locks
// only its key's shard; TakeAll decides several zones' keys as one step by
// locking all of their shards.
//
// Each shard is its own open-addressing table (linear probing, deletion by
// backward shift) of 16-byte slots, a hash and an entry, rather than a Go
// map: a request's key is hashed once (its shard and its slot come from
// the same hash), and a lookup reads the shard, one slot line and the
// entry, which holds a short key's bytes itself. In a server, where the
// store's memory is mostly out of the processor's caches by the next
// request, each of those reads is a cache miss, and a Go map's lookup
// made twice as many (its header, directory, table, group, the key's
// bytes, then the entry). The hash is seeded at random for each store, so
// no client can choose keys that collide into long probes. A table grows
// at 3/4 full and shrinks when a sweep or a reset leaves it at most 1/8
// full.
//
// The store is bounded by MaxKeys for the whole zone: no key is evicted
// while the zone holds fewer, and past it the zone's least recently used
// key goes first (one list for the zone, not one per shard), and is
// counted. Sweep forgets keys whose state is fresh again, which changes no
// decision.
//
// Recency is kept to half the list: a decision on a key, whether it admits
// or rejects, moves it to the list's front only if at least MaxKeys/2
// moves to the front (new keys, or keys moved) came after its own last
// one; otherwise it is still in the front half and stays where it is. A
// key asked for again before MaxKeys/2 - 1 new keys or moves pass it is
// never evicted, however fast a flood of one-time keys comes: a client
// over its limit cannot be forgotten, and admitted again, by minting
// keys. (Recency kept to the second, as it was, let a flood of MaxKeys
// new keys within a second evict a key in use.) Most decisions read one
// shared counter and move nothing: no list lock, no writes to the
// neighbours.
//
// Locks: a shard's mutex guards its table and the states of its entries; the
// zone's list mutex guards the list, the count and each entry's links. The
// order is shards (by address, when several) then the list; an evicted key's
// entry is unlinked under the list's lock and marked evicted at once, and
// deleted from its shard's table after the locks held are released, so that
// no goroutine ever waits for a shard while holding the list's lock.
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
	list      evictList
	stale     int64        // moves after which a key's place is stale: MaxKeys/2
	keys      atomic.Int64 // list.n, readable without the lock
	evictions atomic.Int64
	// offset, when set (see Follow), is added to every time the store
	// is given, so that it keeps another store's clock.
	offset atomic.Pointer[atomic.Int64]
	resets resetLog
}

// resetLog is when the store's keys were last reset, for as long as a
// charge made before may still be given back (storage.Horizon): an Undo
// of a charge made at or before its key's reset gives nothing back, since
// the reset forgot the charge, and what the key holds now was charged
// since. An entry has no room for the time (it is 128 bytes, two cache
// lines), and resets are rare (the admin API's, a copy following
// another instance's): the log is a small map beside the table, that
// only Reset writes, and that an Undo reads only while any is set.
//
// Lock order: the key's shard, then mu.
type resetLog struct {
	any   atomic.Bool // some reset may still be within the horizon
	mu    sync.RWMutex
	at    map[string]int64 // key -> the time of its last reset
	floor int64            // a reset of every key at this time: what the log dropped when full
	until int64            // past this time, every reset in the log is beyond the horizon
}

// maxResets bounds the keys a store's resetLog holds: past it, the log
// keeps only the latest reset time, for every key (see resetLog.record).
const maxResets = 4096

// record notes that key was reset at now, key's shard lock held. horizon
// is storage.Horizon of the store's limit. When the log is full, every
// reset in it becomes its floor, the latest of them, as if every key had
// been reset then: a give-back of a charge made before it gives nothing
// back, which errs towards refusing, and only for requests that were in
// flight then.
func (r *resetLog) record(key string, now, horizon int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil || now > r.until {
		r.at, r.floor = map[string]int64{}, 0
	}
	if len(r.at) >= maxResets {
		for _, t := range r.at {
			r.floor = max(r.floor, t)
		}
		clear(r.at)
	}
	r.at[key] = max(now, r.at[key])
	r.until = max(r.until, now+horizon)
	r.any.Store(true)
}

// since reports whether key was reset at or after at (the time of the
// decision that charged what is to be given back), key's shard lock held.
// now is the give-back's time: once it is past every reset's horizon,
// the log is emptied, and Undo no longer reads it.
func (r *resetLog) since(key string, at, now int64) bool {
	r.mu.RLock()
	t, ok := r.at[key]
	hit := at <= r.floor || ok && at <= t
	stale := now > r.until
	r.mu.RUnlock()
	if stale {
		r.mu.Lock()
		if now > r.until {
			r.at, r.floor = nil, 0
			r.any.Store(false)
		}
		r.mu.Unlock()
	}
	return hit
}

// shard is a hash table of entries, guarded by mu: slots is empty or has
// a power-of-two length, and n of its slots hold an entry (live, or
// evicted and not yet dropped). A key's home slot comes from its hash's
// bits above those that chose its shard; the table is at most 3/4 full,
// so a probe always ends at an empty slot.
type shard struct {
	mu    sync.Mutex
	slots []slot
	n     int
	_     [64]byte // keep shards on separate cache lines
}

// slot is one place in a shard's table: an entry and its key's hash, so
// that a probe skips other keys without reading their entries. e is nil
// for an empty slot.
type slot struct {
	h uint64
	e *entry
}

// evictList is the zone's list of entries, most recently used at head,
// their count, and how many moves to the front it has made (moves is
// written under mu, and read without it).
type evictList struct {
	mu         sync.Mutex
	head, tail *entry
	n          int64
	moves      atomic.Int64
	_          [64]byte
}

// entry is one key's state. Its 128 bytes are two cache lines: a lookup
// reads the first (the key, a short key's bytes, the list marks), a
// decision the second (the state).
type entry struct {
	key     string           // points into kbuf for a key of up to inlineKey bytes
	kbuf    [inlineKey]byte  // a short key's bytes
	moved   atomic.Int64     // the list's move count at its last move to the front
	evicted atomic.Bool      // unlinked from the list; set under the list's lock
	prev    *entry           // guarded by the list's lock, as next
	state   algorithms.State // guarded by the key's shard lock
	next    *entry
}

// inlineKey is the longest key an entry holds in itself: an IPv4 address,
// an IPv6 /64 prefix ("ffff:ffff:ffff:ffff::/64"), a short API key. A
// longer one is kept as the request gave it.
const inlineKey = 24

// newEntry returns a fresh entry for key.
func newEntry(key string, l *algorithms.Limit) *entry {
	e := &entry{state: algorithms.NewState(l)}
	if len(key) <= inlineKey {
		n := copy(e.kbuf[:], key)
		// kbuf is never written again: the string stays immutable.
		e.key = unsafe.String(&e.kbuf[0], n)
	} else {
		e.key = key
	}
	return e
}

// New returns an empty store for zone z.
func New(z storage.Zone) *Store {
	maxKeys := int64(z.MaxKeys)
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &Store{limit: z.Limit, seed: maphash.MakeSeed(), maxKeys: maxKeys, stale: max(1, maxKeys/2)}
}

var _ storage.Limiter = (*Store)(nil)

// locate returns key's hash and its shard.
func (s *Store) locate(key string) (uint64, *shard) {
	h := maphash.String(s.seed, key)
	return h, &s.shards[h%numShards]
}

// home is the slot where a probe for hash h starts, in a table of
// mask+1 slots: the hash's bits above the shard's.
func home(h uint64, mask int) int {
	return int(h/numShards) & mask
}

// find returns the index of key's slot in sh, whose entry may be evicted,
// or -1. sh.mu must be held.
func (sh *shard) find(h uint64, key string) int {
	mask := len(sh.slots) - 1
	if mask < 0 {
		return -1
	}
	for i := home(h, mask); ; i = (i + 1) & mask {
		sl := &sh.slots[i]
		if sl.e == nil {
			return -1
		}
		if sl.h == h && sl.e.key == key {
			return i
		}
	}
}

// live returns the index of key's slot in sh if its entry is live, or -1
// (an evicted entry's deletion from the table is under way). sh.mu must
// be held.
func (sh *shard) live(h uint64, key string) int {
	if i := sh.find(h, key); i >= 0 && !sh.slots[i].e.evicted.Load() {
		return i
	}
	return -1
}

// lookup returns key's live entry in sh, or nil. sh.mu must be held.
func (sh *shard) lookup(h uint64, key string) *entry {
	if i := sh.live(h, key); i >= 0 {
		return sh.slots[i].e
	}
	return nil
}

// put stores e, whose key's hash is h, in sh, in place of an evicted entry
// of the same key if there is one. sh.mu must be held.
func (sh *shard) put(h uint64, e *entry) {
	if i := sh.find(h, e.key); i >= 0 {
		sh.slots[i].e = e
		return
	}
	if (sh.n+1)*4 > len(sh.slots)*3 {
		sh.resize(max(8, 2*len(sh.slots)))
	}
	sh.place(h, e)
	sh.n++
}

// place puts e at the first empty slot of its probe. sh.mu must be held,
// and the table must have an empty slot.
func (sh *shard) place(h uint64, e *entry) {
	mask := len(sh.slots) - 1
	i := home(h, mask)
	for sh.slots[i].e != nil {
		i = (i + 1) & mask
	}
	sh.slots[i] = slot{h: h, e: e}
}

// resize moves sh's entries to a table of size slots, a power of two
// above 4/3 of them. sh.mu must be held.
func (sh *shard) resize(size int) {
	old := sh.slots
	sh.slots = make([]slot, size)
	for _, sl := range old {
		if sl.e != nil {
			sh.place(sl.h, sl.e)
		}
	}
}

// deleteAt empties slot i, shifting back the entries after it in its
// probe sequence that would no longer be found past the gap. An entry
// only ever moves towards its home slot. sh.mu must be held.
func (sh *shard) deleteAt(i int) {
	mask := len(sh.slots) - 1
	for j := (i + 1) & mask; sh.slots[j].e != nil; j = (j + 1) & mask {
		// The entry at j may fill the gap at i unless its home is
		// cyclically in (i, j]: then it is already where a probe from
		// its home finds it.
		if k := home(sh.slots[j].h, mask); (j-k)&mask >= (j-i)&mask {
			sh.slots[i] = sh.slots[j]
			i = j
		}
	}
	sh.slots[i] = slot{}
	sh.n--
}

// shrink gives back a table that sweeps and resets left mostly empty:
// when at most an eighth of its slots are used, it is resized to the
// smallest power of two (8 at least) that its entries fill at most half.
// sh.mu must be held.
func (sh *shard) shrink() {
	if len(sh.slots) <= 8 || sh.n*8 > len(sh.slots) {
		return
	}
	if sh.n == 0 {
		sh.slots = nil
		return
	}
	size := 8
	for size < 2*sh.n {
		size *= 2
	}
	sh.resize(size)
}

// Follow makes s keep another store's clock: from now on, every time it is
// given (its methods' now, TakeAll's) is read as that time plus *offset,
// the other clock's lead, which the caller keeps up to date. A local copy
// of a shared state (see Seed) is timed by the shared store's clock.
func (s *Store) Follow(offset *atomic.Int64) {
	s.offset.Store(offset)
}

// at is now on the store's clock.
func (s *Store) at(now int64) int64 {
	if off := s.offset.Load(); off != nil {
		return now + off.Load()
	}
	return now
}

// Seed merges into key's state what d tells of the shared state that
// made it, a decision another store (Redis) made for a request of cost,
// which it charged if charged (see algorithms.Limit.Seed): the copy keeps
// the more restrictive of the two, so that replies seeded in any order
// never take it back. d.At is on the other store's clock, which s should
// Follow. A key the store does not hold is added only if the copy is not
// fresh. A concurrency store is not seeded.
func (s *Store) Seed(key string, d algorithms.Decision, cost int64, charged bool) {
	s.setCopy(key, d, cost, charged, false)
}

// Reseed sets key's state to a copy of the shared state that made d,
// whatever the copy held (see algorithms.Limit.Reseed): what a copy
// follows after the key was reset on the other store, d being a look at
// its state since. A charge made at or before d.At gives nothing back
// since (see Undo): the reset gave it back.
func (s *Store) Reseed(key string, d algorithms.Decision) {
	s.setCopy(key, d, 0, false, true)
}

// setCopy merges d into key's state, or with reseed sets the state from d,
// under its shard's lock. A key the store does not hold is added only if
// the copy is not fresh.
func (s *Store) setCopy(key string, d algorithms.Decision, cost int64, charged, reseed bool) {
	if s.limit.Kind == algorithms.Concurrency {
		return
	}
	set := func(st *algorithms.State) {
		if reseed {
			s.limit.Reseed(st, d)
		} else {
			s.limit.Seed(st, d, cost, charged)
		}
	}
	h, sh := s.locate(key)
	sh.mu.Lock()
	if reseed {
		// A charge made before d, and before the reset, is not the
		// copy's to give back (see Undo).
		s.resets.record(key, d.At, storage.Horizon(&s.limit))
	}
	e := sh.lookup(h, key)
	var victim *entry
	if e == nil {
		st := algorithms.NewState(&s.limit)
		set(&st)
		if s.limit.Fresh(&st, d.At) {
			sh.mu.Unlock()
			return
		}
		e, victim = s.insert(sh, h, key)
		e.state = st
	} else {
		s.touch(e)
		set(&e.state)
	}
	sh.mu.Unlock()
	s.drop(victim)
}

// Take decides one request for key at now. It never fails.
func (s *Store) Take(_ context.Context, key string, now, cost int64) (algorithms.Decision, error) {
	now = s.at(now)
	h, sh := s.locate(key)
	sh.mu.Lock()
	e, victim := s.get(sh, h, key)
	d := s.limit.Take(&e.state, now, cost)
	sh.mu.Unlock()
	s.drop(victim)
	return d, nil
}

// get returns key's entry in sh, inserted if it is not held (and the entry
// it evicted for it, if any, which the caller must drop once it holds no
// lock), or used (see touch). sh.mu must be held.
func (s *Store) get(sh *shard, h uint64, key string) (e, victim *entry) {
	if e = sh.lookup(h, key); e == nil {
		return s.insert(sh, h, key)
	}
	s.touch(e)
	return e, nil
}

// touch records a decision on e: it moves e to the list's front if its
// place is stale (see the package comment). e's shard lock must be held.
func (s *Store) touch(e *entry) {
	if s.list.moves.Load()-e.moved.Load() < s.stale {
		return
	}
	s.list.mu.Lock()
	if !e.evicted.Load() {
		s.list.moveToFront(e)
	}
	s.list.mu.Unlock()
}

// Grant gives key amount milli-units of extra quota for its current
// window at now (see algorithms.Limit.Grant), and returns the decision one
// event would then get.
func (s *Store) Grant(_ context.Context, key string, now, amount int64) (algorithms.Decision, error) {
	if !s.limit.Grantable() {
		return algorithms.Decision{}, algorithms.ErrNoGrant
	}
	now = s.at(now)
	h, sh := s.locate(key)
	sh.mu.Lock()
	e, victim := s.get(sh, h, key)
	d, err := s.limit.Grant(&e.state, now, amount)
	sh.mu.Unlock()
	s.drop(victim)
	return d, err
}

// Undo gives back cost that the Take for key whose Decision is taken
// charged, to where it was charged (see algorithms.Limit.Undo). A key that
// was evicted or swept meanwhile has nothing to give back, nor one reset
// at or after taken.At: the reset gave the charge back.
func (s *Store) Undo(_ context.Context, key string, now, cost int64, taken algorithms.Decision) error {
	now = s.at(now)
	h, sh := s.locate(key)
	sh.mu.Lock()
	if s.resets.any.Load() && s.resets.since(key, taken.At, now) {
		sh.mu.Unlock()
		return nil
	}
	if i := sh.live(h, key); i >= 0 {
		e := sh.slots[i].e
		s.limit.Undo(&e.state, now, cost, taken)
		if s.limit.Kind == algorithms.Concurrency && e.state.Level == 0 {
			s.remove(sh, i)
		}
	}
	sh.mu.Unlock()
	return nil
}

// Peek reports the decision one event for key would get at now, charging
// nothing. ok is false for a key the store does not hold.
func (s *Store) Peek(_ context.Context, key string, now int64) (algorithms.Decision, bool, error) {
	now = s.at(now)
	h, sh := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.lookup(h, key)
	if e == nil {
		return algorithms.Decision{}, false, nil
	}
	return s.limit.Peek(&e.state, now, algorithms.Milli), true, nil
}

// Reset forgets key at now. ok is false for a key the store did not hold.
// A charge made before, at or before now, gives nothing back (see Undo).
func (s *Store) Reset(_ context.Context, key string, now int64) (bool, error) {
	now = s.at(now)
	h, sh := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.live(h, key)
	if i < 0 {
		return false, nil
	}
	// At the latest time the state has seen, if the clock ran backwards:
	// every charge it holds was made at or before that.
	d := s.limit.Peek(&sh.slots[i].e.state, now, 0)
	s.resets.record(key, max(now, d.At), storage.Horizon(&s.limit))
	s.remove(sh, i)
	sh.shrink()
	return true, nil
}

// Sweep forgets every key whose state is fresh at now and returns how many
// it forgot. It locks one shard at a time.
func (s *Store) Sweep(now int64) int {
	now = s.at(now)
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j := 0; j < len(sh.slots); {
			e := sh.slots[j].e
			if e == nil || !(e.evicted.Load() || s.limit.Fresh(&e.state, now)) {
				j++
				continue
			}
			// Not advancing: deleteAt may shift a later entry into
			// slot j. (One shifted from the table's start, across
			// its end, is visited twice: a second look at it changes
			// nothing.)
			if s.remove(sh, j) {
				n++
			}
		}
		sh.shrink()
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

// insert adds a fresh entry for key at the front of the list, and, if
// the zone is full, evicts its least recently used entry, which it returns
// for drop. sh.mu must be held.
func (s *Store) insert(sh *shard, h uint64, key string) (e, victim *entry) {
	e = newEntry(key, &s.limit)
	sh.put(h, e) // replaces an evicted entry of the same key, if any
	s.list.mu.Lock()
	s.list.pushFront(e)
	s.list.n++
	// A concurrency store holds only the keys with requests in flight
	// (Undo forgets a key whose last one ends): bounded by the requests
	// the server runs at once, and evicting one would free its slots.
	if s.list.n > s.maxKeys && s.limit.Kind != algorithms.Concurrency {
		victim = s.list.tail
		s.list.unlink(victim)
		victim.evicted.Store(true)
		s.list.n--
		s.evictions.Add(1)
	}
	s.keys.Store(s.list.n)
	s.list.mu.Unlock()
	return e, victim
}

// drop deletes an evicted entry from its shard's map, unless the key has
// been inserted again meanwhile. It must be called holding no lock.
func (s *Store) drop(victim *entry) {
	if victim == nil {
		return
	}
	h, sh := s.locate(victim.key)
	sh.mu.Lock()
	// A key has one slot at most: inserted again meanwhile, its new
	// entry took the victim's place, and stays.
	if i := sh.find(h, victim.key); i >= 0 && sh.slots[i].e == victim {
		sh.deleteAt(i)
	}
	sh.mu.Unlock()
}

// remove deletes the entry in sh's slot i from sh and the list, and
// reports whether it was a live (counted) key. sh.mu must be held.
func (s *Store) remove(sh *shard, i int) bool {
	e := sh.slots[i].e
	sh.deleteAt(i)
	s.list.mu.Lock()
	defer s.list.mu.Unlock()
	if e.evicted.Load() {
		return false
	}
	s.list.unlink(e)
	e.evicted.Store(true)
	s.list.n--
	s.keys.Store(s.list.n)
	return true
}

// moveToFront moves e to the head of the list. l.mu must be held.
func (l *evictList) moveToFront(e *entry) {
	if l.head == e {
		e.moved.Store(l.moves.Add(1))
		return
	}
	l.unlink(e)
	l.pushFront(e)
}

// pushFront puts e at the head of the list, and counts the move. l.mu
// must be held.
func (l *evictList) pushFront(e *entry) {
	e.moved.Store(l.moves.Add(1))
	e.prev, e.next = nil, l.head
	if l.head != nil {
		l.head.prev = e
	}
	l.head = e
	if l.tail == nil {
		l.tail = e
	}
}

func (l *evictList) unlink(e *entry) {
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
	var hbuf [maxInline]uint64
	shards, hashes := shbuf[:0], hbuf[:0]
	for i := range reqs {
		h, sh := reqs[i].Store.locate(reqs[i].Key)
		shards, hashes = append(shards, sh), append(hashes, h)
	}
	locked := lockAll(append(lockbuf[:0], shards...))

	rejected := -1
	for i := range reqs {
		r := &reqs[i]
		if b := banOf(reqs, i); b >= 0 && !ds[b].Allowed {
			if r.Store.limit.Kind != algorithms.Concurrency {
				// The ban's wait covers the rate's (looked at, not
				// charged, not touched).
				ds[b].WaitAlso(peekBanned(r, shards[i], hashes[i], now))
			}
			ds[i] = algorithms.Decision{Allowed: true} // banned: not decided
			continue
		}
		var st algorithms.State
		if e := shards[i].lookup(hashes[i], r.Key); e != nil {
			r.Store.touch(e) // a rejection is a use too: see the package comment
			st = e.state     // a copy: Peek may bring it up to date
		} else {
			st = algorithms.NewState(&r.Store.limit)
		}
		ds[i] = r.Store.limit.Peek(&st, r.Store.at(now), r.Cost)
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
				e, victims[i] = r.Store.get(shards[i], hashes[i], r.Key)
				ds[i] = r.Store.limit.Take(&e.state, r.Store.at(now), r.Cost)
			}
		}
	}
	if strike(now, reqs, shards, hashes, ds, victims) {
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

// peekBanned is what r's Store would decide on r at now, nothing charged
// and r's key not touched: the rate of a request its ban refuses. sh, r's
// shard (hash h), must be locked. Kept apart from TakeAll's own check,
// whose inline lookup is worth a tenth of a multi-zone decision.
func peekBanned(r *Request, sh *shard, h uint64, now int64) algorithms.Decision {
	st := algorithms.NewState(&r.Store.limit)
	if e := sh.lookup(h, r.Key); e != nil {
		st = e.state // a copy: Peek may bring it up to date
	}
	return r.Store.limit.Peek(&st, r.Store.at(now), r.Cost)
}

// strike gives each ban in reqs that does not hold one strike if a request
// linked to it was rejected, and reports whether a ban started. The
// shards of reqs must be locked.
func strike(now int64, reqs []Request, shards []*shard, hashes []uint64, ds []algorithms.Decision, victims []*entry) (started bool) {
	for b := range reqs {
		r := &reqs[b]
		if r.Store.limit.Kind != algorithms.Ban || !ds[b].Allowed {
			continue
		}
		for j := b + 1; j < len(reqs); j++ {
			if banOf(reqs, j) == b && !ds[j].Allowed {
				var e *entry
				e, victims[b] = r.Store.get(shards[b], hashes[b], r.Key)
				ds[b] = r.Store.limit.Strike(&e.state, r.Store.at(now))
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

var _ storage.Granter = (*Store)(nil)
