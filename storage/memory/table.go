package memory

import (
	"sync"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// A shard's table is one slice of words, a slot every stride words, with
// no pointer in it (the collector never scans it), in one of three
// layouts:
//
//	bucket family (32 bytes):
//	word 0: the key's hash (its shard's bits low, its home slot's above)
//	word 1: the key's tag, a second hash of the key, seeded apart, with
//	        bit 0 set (the slot is used), bit 1 the CLOCK bit (used
//	        since the hand last came by), and bits 2 to 17 the entry's
//	        generation (see shard.add), not part of the tag
//	word 2, 3: the state's At and Level
//
//	packed window (32 bytes: fixed_window without a calendar, and
//	sliding_window):
//	word 0: the hash
//	word 1: the tag's low 32 bits (its flag and generation bits as above) and, in
//	        the high 32, the state's Level
//	word 2: the state's At
//	word 3: the state's Prev (low 32 bits) and Head (high 32, signed)
//
//	wide (48 bytes: sliding_log, a calendar window, and a packed table
//	that was given a state its fields cannot hold):
//	words 0 to 3 as the bucket family's; word 4, 5: Prev and Head
//
// so that every slot but a sliding_log's is 32 bytes: two to a cache
// line, and never across two (the tables of 8 slots or more are
// allocated in size classes that are multiples of 256 bytes, or whole
// pages, each aligned to its size). A packed window holds a count of
// up to 2^32-1 milli-units (4.29 million events) and a grant of up to
// 2^31-1 (2.1 million events), far above most windows' limits: a state
// beyond them (a zone of more events, a large grant, a large debt owed
// by a settlement) widens its shard's table to 48-byte slots for good,
// in one pass as a resize does, so that nothing is ever rounded or
// capped. A key is its two hashes: 110 bits, or 78 in a packed table
// (or one widened from one). Two keys that agree on all of them share a
// state: with the hashes seeded at random for each store, that is about
// one chance in 2^39 for a zone's whole million keys at 78 bits (2^71 at
// 110), far below the odds of a memory error; a client cannot aim for it
// without the seeds. A sliding_log's ring, which grows with its entries,
// is kept beside the table, in logs, slot for slot.
const (
	usedBit = 1
	refBit  = 2
	// genShift and genMask place an entry's generation in word 1.
	genShift = 2
	genMask  = 0xffff << genShift

	bucketStride = 4 // words a slot of the bucket family or a packed window holds
	windowStride = 6 // words a wide slot holds

	// packedTag is the part of word 1 that a packed slot's tag keeps.
	packedTag = 1<<32 - 1
)

// maxFill is how full, in sixteenths, a table may be before it doubles:
// 13/16, so that it is between 13/32 and 13/16 full. With slots of 32
// bytes, a lookup's linear probe (2.6 slots on average at 3/4 full) stays
// mostly within the line of its home slot and the next, which the
// processor fetches together; fuller, inserts' probes grow fast (1/(1-f)^2).
const maxFill = 13

// BytesPerKey is the most heap a key of a zone of kind holds in the
// store, a sliding_log's ring aside: its slot (and a sliding_log's ring
// header) over the least fill a growing table has, 13/32; for the
// windows, a wide slot's (a packed table may widen). A key's bytes are
// not kept. A table is sized by the most keys its shard has held since
// it last shrank.
func BytesPerKey(kind algorithms.Kind) int64 {
	slot := int64(strideOf(kind)) * 8
	if kind == algorithms.SlidingLog {
		slot += 24 // the ring's slice header, in logs
	}
	return (slot*32 + maxFill - 1) / maxFill
}

// strideOf is how many words a slot of kind holds at most: the bucket
// family's state is At and Level only.
func strideOf(k algorithms.Kind) int {
	switch k {
	case algorithms.TokenBucket, algorithms.GCRA, algorithms.LeakyBucket:
		return bucketStride
	}
	return windowStride
}

// packs reports whether a table for l starts packed: the windows without
// a calendar (a calendar window keeps its end, a time, in Prev).
func packs(l *algorithms.Limit) bool {
	return (l.Kind == algorithms.FixedWindow || l.Kind == algorithms.SlidingWindow) && l.Calendar.Unit == algorithms.NoUnit
}

// fits reports whether a packed slot holds s: Level and Prev in 32 bits
// unsigned, Head in 32 signed.
func fits(s *algorithms.State) bool {
	return uint64(s.Level)|uint64(s.Prev) <= 1<<32-1 && s.Head == int64(int32(s.Head))
}

// shard is one table of a store, guarded by mu: size is 0 or a power of
// two, n of its slots are used, and hand is the CLOCK's place. A key's
// home slot comes from its hash's bits above those that choose its shard;
// the table is at most maxFill/16 full, so a probe always ends at an
// empty slot.
type shard struct {
	mu     sync.Mutex
	words  []uint64  // size slots of stride words
	logs   [][]int64 // a sliding_log's rings, one per slot; nil for other kinds
	size   int
	n      int
	hand   int
	stride int
	tags   uint64   // the bits of word 1 that are the tag and its used bit (refBit and the generation clear)
	gen    uint16   // the generation of the entry last added (see add)
	packed bool     // the slots are packed windows
	log    bool     // the store is a sliding_log's: logs is kept
	_      [64]byte // keep shards on separate cache lines
}

// init sets up an empty shard for a store of limit l.
func (sh *shard) init(l *algorithms.Limit) {
	sh.stride, sh.tags, sh.packed = strideOf(l.Kind), ^uint64(refBit|genMask), false
	if packs(l) {
		sh.stride, sh.tags, sh.packed = bucketStride, packedTag&^(refBit|genMask), true
	}
	sh.log = l.Kind == algorithms.SlidingLog
}

// home is the slot where a probe for hash h starts, in a table of mask+1
// slots: the hash's bits above the shard's.
func home(h uint64, mask int) int {
	return int(h>>shardBits) & mask
}

// find returns the index of the slot of the key whose hash is h and tag
// is tag (usedBit set, refBit clear), or -1. sh.mu must be held.
func (sh *shard) find(h, tag uint64) int {
	if sh.size == 0 {
		return -1
	}
	mask, w, st, m := sh.size-1, sh.words, sh.stride, sh.tags
	tag &= m
	for i := home(h, mask); ; i = (i + 1) & mask {
		b := i * st
		t := w[b+1]
		if t == 0 {
			return -1
		}
		if w[b] == h && t&m == tag {
			return i
		}
	}
}

// touch sets slot i's CLOCK bit, if it is not set already (a decision
// that finds it set writes nothing). sh.mu must be held.
func (sh *shard) touch(i int) {
	if t := &sh.words[i*sh.stride+1]; *t&refBit == 0 {
		*t |= refBit
	}
}

// slot returns slot i's words. sh.mu must be held.
func (sh *shard) slot(i int) []uint64 {
	b := i * sh.stride
	return sh.words[b : b+sh.stride : b+sh.stride]
}

// state returns slot i's state. sh.mu must be held.
func (sh *shard) state(i int) algorithms.State {
	return sh.load(i, sh.slot(i))
}

// load returns the state in w, slot i's words (see slot). sh.mu must be
// held.
func (sh *shard) load(i int, w []uint64) algorithms.State {
	if sh.packed {
		return unpack(w)
	}
	s := algorithms.State{At: int64(w[2]), Level: int64(w[3])}
	if len(w) == windowStride {
		s.Prev, s.Head = int64(w[4]), int64(w[5])
	}
	if sh.log {
		s.Log = sh.logs[i]
	}
	return s
}

// unpack returns the state in a packed slot's words w.
func unpack(w []uint64) algorithms.State {
	_ = w[3]
	return algorithms.State{At: int64(w[2]), Level: int64(w[1] >> 32), Prev: int64(uint32(w[3])), Head: int64(int32(w[3] >> 32))}
}

// pack stores s, which fits, in a packed slot's words w.
func pack(w []uint64, s *algorithms.State) {
	_ = w[3]
	w[1] = uint64(uint32(w[1])) | uint64(s.Level)<<32
	w[2] = uint64(s.At)
	w[3] = uint64(uint32(s.Prev)) | uint64(s.Head)<<32
}

// setState stores s in slot i. sh.mu must be held.
func (sh *shard) setState(i int, s *algorithms.State) {
	sh.store(i, sh.slot(i), s)
}

// store stores s in w, slot i's words (see slot), widening a packed
// table that cannot hold it. sh.mu must be held.
func (sh *shard) store(i int, w []uint64, s *algorithms.State) {
	if sh.packed {
		if fits(s) {
			pack(w, s)
			return
		}
		sh.widen()
		w = sh.slot(i)
	}
	w[2], w[3] = uint64(s.At), uint64(s.Level)
	if len(w) == windowStride {
		w[4], w[5] = uint64(s.Prev), uint64(s.Head)
	}
	if sh.log {
		sh.logs[i] = s.Log
	}
}

// add puts a fresh key, whose hash is h and tag is tag, in sh, growing
// the table if it would be more than maxFill/16 full, and returns its slot. Its
// CLOCK bit is clear, as SIEVE inserts (Zhang et al., NSDI '24): a key asked
// for once (a flood's one-time keys) is the hand's first choice, and one
// asked for again before the hand reaches it is kept for a turn. With the
// bit set, a flood's keys all looked used: the first eviction's hand went
// round clearing every bit, then took the first key in table order, which
// might be a client over its limit asked for just before the flood.
// The entry gets the shard's next generation (1 to 65535, round): a
// decision carries it (Decision.Entry), and a give-back to an entry of
// another generation, the key evicted or swept and added again since,
// gives nothing back (see Store.Undo). The key must not be in sh. sh.mu
// must be held.
func (sh *shard) add(h, tag uint64) int {
	if (sh.n+1)*16 > sh.size*maxFill {
		sh.resize(max(8, 2*sh.size))
	}
	mask, st := sh.size-1, sh.stride
	i := home(h, mask)
	for sh.words[i*st+1] != 0 {
		i = (i + 1) & mask
	}
	b := i * st
	sh.gen = sh.gen%0xffff + 1
	sh.words[b], sh.words[b+1] = h, tag&sh.tags|uint64(sh.gen)<<genShift
	sh.n++
	return i
}

// entry is the generation of slot i's entry (see add). sh.mu must be
// held.
func (sh *shard) entry(i int) uint32 {
	return uint32(sh.words[i*sh.stride+1] & genMask >> genShift)
}

// replaced reports whether slot i holds another entry of its key than
// the one that decided taken: the key was evicted or swept, and added
// again, since. A decision that carries no entry (another store's, which
// a local copy gives back) is given back to the key as it is. sh.mu must
// be held.
func (sh *shard) replaced(i int, taken *algorithms.Decision) bool {
	return taken.Entry != 0 && taken.Entry != sh.entry(i)
}

// widen moves a packed table's keys to wide slots, in place: same size,
// same places, the tags as short as they were. sh.mu must be held.
func (sh *shard) widen() {
	old := sh.words
	sh.words = make([]uint64, sh.size*windowStride)
	for i := 0; i < sh.size; i++ {
		o := old[i*bucketStride : (i+1)*bucketStride]
		if o[1] == 0 {
			continue
		}
		s := unpack(o)
		w := sh.words[i*windowStride : (i+1)*windowStride]
		w[0], w[1] = o[0], uint64(uint32(o[1]))
		w[2], w[3], w[4], w[5] = uint64(s.At), uint64(s.Level), uint64(s.Prev), uint64(s.Head)
	}
	sh.stride, sh.packed = windowStride, false
}

// resize moves sh's keys to a table of size slots, a power of two above
// 4/3 of them. sh.mu must be held.
func (sh *shard) resize(size int) {
	old, oldLogs, st := sh.words, sh.logs, sh.stride
	sh.words, sh.size = make([]uint64, size*st), size
	sh.logs = nil
	if sh.log {
		sh.logs = make([][]int64, size)
	}
	mask := size - 1
	for b := 0; b < len(old); b += st {
		if old[b+1] == 0 {
			continue
		}
		i := home(old[b], mask)
		for sh.words[i*st+1] != 0 {
			i = (i + 1) & mask
		}
		copy(sh.words[i*st:(i+1)*st], old[b:b+st])
		if sh.log {
			sh.logs[i] = oldLogs[b/st]
		}
	}
	sh.hand &= mask
}

// deleteAt empties slot i, shifting back the keys after it in its probe
// sequence that would no longer be found past the gap. A key only ever
// moves towards its home slot. sh.mu must be held.
func (sh *shard) deleteAt(i int) {
	mask, w, st := sh.size-1, sh.words, sh.stride
	for j := (i + 1) & mask; w[j*st+1] != 0; j = (j + 1) & mask {
		// The key at j may fill the gap at i unless its home is
		// cyclically in (i, j]: then it is already where a probe from
		// its home finds it.
		if k := home(w[j*st], mask); (j-k)&mask >= (j-i)&mask {
			copy(w[i*st:(i+1)*st], w[j*st:(j+1)*st])
			if sh.log {
				sh.logs[i] = sh.logs[j]
			}
			i = j
		}
	}
	clear(w[i*st : (i+1)*st])
	if sh.log {
		sh.logs[i] = nil
	}
	sh.n--
}

// evict removes the key the CLOCK hand comes to first with its bit
// clear, clearing the bits it passes: a key used since the hand last
// passed it stays for another turn. sh must hold a key. sh.mu must be
// held.
func (sh *shard) evict() {
	mask, w, st := sh.size-1, sh.words, sh.stride
	for i := sh.hand & mask; ; i = (i + 1) & mask {
		t := &w[i*st+1]
		switch {
		case *t == 0:
		case *t&refBit != 0:
			*t &^= refBit
		default:
			sh.deleteAt(i)
			// The next key of the probe may have moved into slot i:
			// the hand looks there next.
			sh.hand = i
			return
		}
	}
}

// shrink gives back a table that sweeps and resets left mostly empty:
// when at most an eighth of its slots are used, it is resized to the
// smallest power of two (8 at least) that its keys fill at most half.
// sh.mu must be held.
func (sh *shard) shrink() {
	if sh.size <= 8 || sh.n*8 > sh.size {
		return
	}
	if sh.n == 0 {
		sh.words, sh.logs, sh.size, sh.hand = nil, nil, 0, 0
		return
	}
	size := 8
	for size < 2*sh.n {
		size *= 2
	}
	sh.resize(size)
}
