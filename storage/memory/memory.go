// Package memory is Tollgate's in-process store: one Store per zone, a
// sharded hash table from resolved key to limiter state. A decision locks
// only its key's shard; TakeAll decides several zones' keys as one step by
// locking all of their shards.
//
// Each shard is its own open-addressing table (linear probing, deletion by
// backward shift) of fixed slots that hold everything a decision needs:
// the key's two hashes, which stand for the key, and its state, 32 bytes
// for every algorithm but sliding_log and a calendar window, whose slots
// are 48 (see table.go). A decision
// hashes its key, locks its shard, and reads and writes one slot: in a
// server, where the store's memory is mostly out of the processor's
// caches by the next request, that is one cache miss, where an entry
// behind a pointer and a recency list were three. The table holds no
// pointer (a sliding_log's rings aside), so the collector never scans
// it. The hashes are seeded at random for each store, so no client can
// choose keys that collide into long probes. A table grows at 13/16 full
// and shrinks when a sweep or a reset leaves it at most 1/8 full.
//
// The store is bounded by MaxKeys for the whole zone, exactly: a count of
// the zone's keys is kept, no key is evicted while the zone holds fewer,
// and past it each new key evicts one, which is counted. The key evicted
// is chosen by CLOCK within the new key's shard: every slot has a bit that
// a decision on its key sets (admitted or rejected, it is a use) and that
// a new key starts without (see shard.add); to evict, the shard's hand goes round its table,
// clearing the bits it passes, and evicts the first key whose bit it
// finds clear. A key used since the hand last passed it is never evicted:
// a client over its limit that keeps asking cannot be forgotten, and
// admitted again, by someone minting keys, since the hand must go round
// the whole shard (its share of MaxKeys) between two of its requests to
// evict it. Exact LRU needs a list that every decision writes under a
// lock for the zone; CLOCK writes one bit in the slot the decision writes
// anyway. A zone of fewer than 2,048 keys has fewer shards (one under
// 2,048), so that each shard holds enough keys for its hand to choose
// from; a new key whose shard holds no other evicts from the next shard
// that does, once its own lock is released. Sweep forgets keys whose
// state is fresh again, which changes no decision.
//
// Locks: a shard's mutex guards its table; the count is atomic. No
// goroutine waits for a lock while it holds one, but TakeAll, which locks
// its shards in address order.
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

// shardBits is how many bits of a key's hash choose its shard: a store
// has at most 1<<shardBits shards.
const shardBits = 6

// minShardKeys is the fewest keys of MaxKeys a store gives each shard:
// below 64 * minShardKeys, it has fewer shards.
const minShardKeys = 1024

// Store is one zone's in-memory limiter. It is safe for concurrent use. It
// never holds more than MaxKeys keys.
type Store struct {
	limit     algorithms.Limit
	seed      maphash.Seed // the hash: the shard and home slot
	tagSeed   maphash.Seed // the tag, the key's second hash
	maxKeys   int64
	mask      uint64 // the shards in use: hash & mask is the shard
	keys      atomic.Int64
	evictions atomic.Int64
	// offset, when set (see Follow), is added to every time the store
	// is given, so that it keeps another store's clock.
	offset atomic.Pointer[atomic.Int64]
	resets resetLog
	shards [1 << shardBits]shard
}

// resetLog is when the store's keys were last reset, for as long as a
// charge made before may still be given back (storage.Horizon): an Undo
// of a charge made at or before its key's reset gives nothing back, since
// the reset forgot the charge, and what the key holds now was charged
// since. A slot has no room for the time (the table keeps no more than
// a decision needs), and resets are rare (the admin API's, a local copy
// following another instance's): the log is a small map beside the
// table, that only Reset writes, and that an Undo reads only while any is
// set.
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

// last is the time key was last reset, if a reset within the horizon
// is kept (the log's floor, if later), or 0, key's shard lock held.
func (r *resetLog) last(key string, now int64) int64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if now > r.until {
		return 0
	}
	return max(r.floor, r.at[key])
}

// New returns an empty store for zone z.
func New(z storage.Zone) *Store {
	maxKeys := int64(z.MaxKeys)
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	n := int64(1)
	for n < 1<<shardBits && 2*n*minShardKeys <= maxKeys {
		n *= 2
	}
	s := &Store{limit: z.Limit, seed: maphash.MakeSeed(), tagSeed: maphash.MakeSeed(), maxKeys: maxKeys, mask: uint64(n - 1)}
	for i := range s.shards {
		s.shards[i].init(&z.Limit)
	}
	return s
}

var _ storage.Limiter = (*Store)(nil)

// locate returns key's hash, its tag and its shard.
func (s *Store) locate(key string) (h, tag uint64, sh *shard) {
	h = maphash.String(s.seed, key)
	tag = maphash.String(s.tagSeed, key)&^refBit | usedBit
	return h, tag, &s.shards[h&s.mask]
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
// which it charged if charged (see algorithms.Limit.Seed): the local copy keeps
// the more restrictive of the two, so that replies seeded in any order
// never take it back. d.At is on the other store's clock, which s should
// Follow. A key the store does not hold is added only if the local copy
// is not fresh. A concurrency store is not seeded.
func (s *Store) Seed(key string, d algorithms.Decision, cost int64, charged bool) {
	s.setCopy(key, d, cost, charged, false)
}

// Reseed sets key's state to a copy of the shared state that made d,
// whatever the local copy held (see algorithms.Limit.Reseed): what a local copy
// follows after the key was reset on the other store, d being a look at
// its state since. A charge made at or before d.At gives nothing back
// since (see Undo): the reset gave it back.
func (s *Store) Reseed(key string, d algorithms.Decision) {
	s.setCopy(key, d, 0, false, true)
}

// setCopy merges d into key's state, or with reseed sets the state from d,
// under its shard's lock. A key the store does not hold is added only if
// the local copy is not fresh.
func (s *Store) setCopy(key string, d algorithms.Decision, cost int64, charged, reseed bool) {
	if s.limit.Kind == algorithms.Concurrency {
		return
	}
	h, tag, sh := s.locate(key)
	sh.mu.Lock()
	if reseed {
		// A charge made before d, and before the reset, is not the
		// local copy's to give back (see Undo).
		s.resets.record(key, d.At, storage.Horizon(&s.limit))
	}
	i := sh.find(h, tag)
	var st algorithms.State
	if i >= 0 {
		sh.touch(i)
		st = sh.state(i)
	}
	if reseed {
		s.limit.Reseed(&st, d)
	} else {
		s.limit.Seed(&st, d, cost, charged)
	}
	elsewhere := false
	if i < 0 {
		if s.limit.Fresh(&st, d.At) {
			sh.mu.Unlock()
			return
		}
		i, elsewhere = s.insert(sh, h, tag)
	}
	sh.setState(i, &st)
	sh.mu.Unlock()
	if elsewhere {
		s.evictElsewhere(sh)
	}
}

// Take decides one request for key at now. It never fails.
func (s *Store) Take(_ context.Context, key string, now, cost int64) (d algorithms.Decision, err error) {
	h, tag, sh := s.locate(key)
	sh.mu.Lock()
	elsewhere := s.takeLocked(sh, hashed{h: h, tag: tag}, now, cost, &d)
	sh.mu.Unlock()
	if elsewhere {
		s.evictElsewhere(sh)
	}
	return d, nil
}

// hashed is a key's hash and tag (see Store.locate), and, once a lookup
// under its shard's lock found it, 1 + its slot (0: not known).
type hashed struct {
	h, tag uint64
	slot   int
}

// takeLocked decides a request of cost for the key k in sh at now, as
// Take does, into *d, sh.mu held; elsewhere is insert's. A key whose slot
// k knows was found and touched since sh was locked. It is the hot path
// of every decision: it loads and stores a bucket's or a packed window's
// words itself, as shard.load and shard.store do (the helpers, inlined,
// still take the slot apart twice), and has the algorithm write the
// decision where Take returns it from (Limit.TakeTo into Take's named
// result): a Decision returned by value and stored again is read back in
// wider loads than it was written with, a stall of several ns a copy.
func (s *Store) takeLocked(sh *shard, k hashed, now, cost int64, d *algorithms.Decision) (elsewhere bool) {
	now = s.at(now)
	i := k.slot - 1
	if i < 0 {
		if i = sh.find(k.h, k.tag); i >= 0 {
			sh.touch(i)
		} else {
			i, elsewhere = s.insert(sh, k.h, k.tag)
		}
	}
	w := sh.slot(i)
	entry := uint32(w[1] & genMask >> genShift)
	switch {
	case sh.packed:
		st := unpack(w)
		s.limit.TakeTo(d, &st, now, cost)
		if fits(&st) {
			pack(w, &st)
		} else {
			sh.store(i, w, &st)
		}
	case len(w) == bucketStride:
		st := algorithms.State{At: int64(w[2]), Level: int64(w[3])}
		s.limit.TakeTo(d, &st, now, cost)
		w[2], w[3] = uint64(st.At), uint64(st.Level)
	default:
		st := sh.load(i, w)
		s.limit.TakeTo(d, &st, now, cost)
		sh.store(i, w, &st)
	}
	d.Entry = entry // after the take, which writes the whole decision
	return elsewhere
}

// keep stores st, the state a take decided on a copy of, as the state of
// the key k in sh, adding the key if k knows no slot of it (see hashed),
// and notes its entry in d, the take's decision; elsewhere is insert's.
// sh.mu must be held, since before the copy was read.
func (s *Store) keep(sh *shard, k hashed, st *algorithms.State, d *algorithms.Decision) (elsewhere bool) {
	i := k.slot - 1
	if i < 0 {
		i, elsewhere = s.insert(sh, k.h, k.tag)
	}
	sh.setState(i, st)
	d.Entry = sh.entry(i)
	return elsewhere
}

// get returns the slot of the key whose hash is h and tag is tag in sh,
// used (see shard.touch), or inserted if it is not held; elsewhere is
// insert's. sh.mu must be held.
func (s *Store) get(sh *shard, h, tag uint64) (i int, elsewhere bool) {
	if i = sh.find(h, tag); i >= 0 {
		sh.touch(i)
		return i, false
	}
	return s.insert(sh, h, tag)
}

// insert adds a fresh key, whose hash is h and tag is tag, to sh, and
// returns its slot. If the zone is full, it evicts a key first: from sh
// (see shard.evict), or, when sh holds no other, from another shard it
// can lock without waiting. If none can be, it reports elsewhere: the
// caller must then call evictElsewhere once it holds no lock, and until
// then the zone holds one key more than MaxKeys. A concurrency store
// evicts nothing: it holds only the keys with requests in flight (Undo
// forgets a key whose last one ends), bounded by the requests the server
// runs at once, and evicting one would free its slots. sh.mu must be
// held.
func (s *Store) insert(sh *shard, h, tag uint64) (i int, elsewhere bool) {
	if s.limit.Kind == algorithms.Concurrency {
		s.keys.Add(1)
		return sh.add(h, tag), false
	}
	for n := s.keys.Load(); n < s.maxKeys; n = s.keys.Load() {
		if s.keys.CompareAndSwap(n, n+1) {
			return sh.add(h, tag), false
		}
	}
	// Full: one key out for this one in, the count unchanged.
	switch {
	case sh.n > 0:
		sh.evict()
		s.evictions.Add(1)
	case s.tryEvict(sh):
		s.evictions.Add(1)
	default:
		s.keys.Add(1)
		elsewhere = true
	}
	return sh.add(h, tag), elsewhere
}

// tryEvict evicts a key from a shard other than own that holds one and
// that it can lock without waiting, and reports whether it did. own's
// lock is held.
func (s *Store) tryEvict(own *shard) bool {
	for k := range s.mask + 1 {
		sh := &s.shards[k]
		if sh == own || !sh.mu.TryLock() {
			continue
		}
		ok := sh.n > 0
		if ok {
			sh.evict()
		}
		sh.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// evictElsewhere evicts a key from the first shard after own that holds
// one (or from own, if none does), if the zone still holds more than
// MaxKeys: what insert left to do (its elsewhere). It must be called
// holding no lock.
func (s *Store) evictElsewhere(own *shard) {
	start := (uintptr(unsafe.Pointer(own)) - uintptr(unsafe.Pointer(&s.shards[0]))) / unsafe.Sizeof(*own)
	for k := uint64(1); k <= s.mask+1; k++ {
		sh := &s.shards[(uint64(start)+k)&s.mask]
		sh.mu.Lock()
		if sh.n > 0 && s.keys.Load() > s.maxKeys {
			sh.evict()
			s.keys.Add(-1)
			s.evictions.Add(1)
			sh.mu.Unlock()
			return
		}
		sh.mu.Unlock()
	}
}

// Grant gives key amount milli-units of extra quota for its current
// window at now (see algorithms.Limit.Grant), and returns the decision one
// event would then get.
func (s *Store) Grant(_ context.Context, key string, now, amount int64) (algorithms.Decision, error) {
	if !s.limit.Grantable() {
		return algorithms.Decision{}, algorithms.ErrNoGrant
	}
	now = s.at(now)
	h, tag, sh := s.locate(key)
	sh.mu.Lock()
	i, elsewhere := s.get(sh, h, tag)
	st := sh.state(i)
	d, err := s.limit.Grant(&st, now, amount)
	sh.setState(i, &st)
	sh.mu.Unlock()
	if elsewhere {
		s.evictElsewhere(sh)
	}
	return d, err
}

// Undo gives back cost that the Take for key whose Decision is taken
// charged, to where it was charged (see algorithms.Limit.Undo). A key that
// was evicted or swept meanwhile has nothing to give back, even once it
// is back (a new entry: see shard.add), nor one reset at or after
// taken.At: the reset gave the charge back.
func (s *Store) Undo(_ context.Context, key string, now, cost int64, taken algorithms.Decision) error {
	now = s.at(now)
	h, tag, sh := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.resets.any.Load() && s.resets.since(key, taken.At, now) {
		return nil
	}
	if i := sh.find(h, tag); i >= 0 && !sh.replaced(i, &taken) {
		st := sh.state(i)
		s.limit.Undo(&st, now, cost, taken)
		sh.setState(i, &st)
		if s.limit.Kind == algorithms.Concurrency && st.Level == 0 {
			s.remove(sh, i)
		}
	}
	return nil
}

// Peek reports the decision one event for key would get at now, charging
// nothing. ok is false for a key the store does not hold.
func (s *Store) Peek(ctx context.Context, key string, now int64) (algorithms.Decision, bool, error) {
	d, _, ok, err := s.PeekGrant(ctx, key, now)
	return d, ok, err
}

// PeekGrant is Peek, and granted the milli-units granted to key's current
// window (see algorithms.Limit.Granted).
func (s *Store) PeekGrant(_ context.Context, key string, now int64) (d algorithms.Decision, granted int64, ok bool, err error) {
	now = s.at(now)
	h, tag, sh := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(h, tag)
	if i < 0 {
		return d, 0, false, nil
	}
	st := sh.state(i)
	d = s.limit.Peek(&st, now, algorithms.Milli)
	sh.setState(i, &st)
	return d, s.limit.Granted(&st, d.At), true, nil
}

// Reset forgets key at now. ok is false for a key the store did not hold.
// A charge made before, at or before now, gives nothing back (see Undo).
// On a clock that ran back since the key's latest decision, the reset is
// dated after it, and a bucket's or an epoch window's key is left a fresh
// state that holds the clock later still (see storage.ResetAt).
func (s *Store) Reset(_ context.Context, key string, now int64) (bool, error) {
	now = s.at(now)
	h, tag, sh := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(h, tag)
	if i < 0 {
		return false, nil
	}
	// Dated after the latest time the state has seen, if the clock ran
	// backwards (see storage.ResetAt): a bucket's or an epoch window's
	// latest decision's. (A calendar window's state keeps only its
	// window's start, gcra's its debt's end: a charge made later in the
	// window, or before the debt's end, on a clock since run back, is
	// dated after the reset.)
	st := sh.state(i)
	d := s.limit.Peek(&st, now, 0)
	last := int64(0)
	if s.resets.any.Load() {
		last = s.resets.last(key, now)
	}
	mark, hold := storage.ResetAt(now, d.At, last)
	s.resets.record(key, mark, storage.Horizon(&s.limit))
	if fresh, ok := s.limit.HeldAt(hold); ok && hold > now {
		// The fresh state holds the clock, so that a decision since
		// is dated after the reset.
		sh.setState(i, &fresh)
		return true, nil
	}
	s.remove(sh, i)
	sh.shrink()
	return true, nil
}

// Sweep forgets every key whose state is fresh at now and returns how many
// it forgot. It locks one shard at a time.
func (s *Store) Sweep(now int64) int {
	now = s.at(now)
	n := 0
	for i := range s.mask + 1 {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j := 0; j < sh.size; {
			if sh.words[j*sh.stride+1] == 0 {
				j++
				continue
			}
			if st := sh.state(j); !s.limit.Fresh(&st, now) {
				j++
				continue
			}
			// Not advancing: deleteAt may shift a later key into
			// slot j. (One shifted from the table's start, across
			// its end, is looked at twice: a second look at it
			// changes nothing.)
			s.remove(sh, j)
			n++
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

// remove deletes the key in sh's slot i. sh.mu must be held.
func (s *Store) remove(sh *shard, i int) {
	sh.deleteAt(i)
	s.keys.Add(-1)
}

var (
	_ storage.Granter     = (*Store)(nil)
	_ storage.GrantPeeker = (*Store)(nil)
)
