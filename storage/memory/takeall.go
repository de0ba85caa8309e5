package memory

import (
	"context"
	"unsafe"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

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
	var hbuf [maxInline]hashed
	shards, hashes := shbuf[:0], hbuf[:0]
	for i := range reqs {
		h, tag, sh := reqs[i].Store.locate(reqs[i].Key)
		shards, hashes = append(shards, sh), append(hashes, hashed{h: h, tag: tag})
	}
	locked := lockAll(append(lockbuf[:0], shards...))

	// Each zone is decided once, as a take on a copy of its state: a take
	// that rejects decides what a check does, and one that admits is
	// what the zone's take will be if every zone admits (decided on the
	// same state at the same now, a take admits exactly when its check
	// does). Only when another zone rejects is an admitting zone's check
	// decided, on its state as held. A sliding_log is checked and then
	// taken: its copy shares the ring, which a take writes into, over
	// entries the copy has dropped as expired and the state still holds.
	var stbuf [maxInline]algorithms.State
	sts := stbuf[:0]
	if len(reqs) > maxInline {
		sts = make([]algorithms.State, 0, len(reqs))
	}
	sts = sts[:len(reqs)]
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
		st := &sts[i]
		if j := shards[i].find(hashes[i].h, hashes[i].tag); j >= 0 {
			shards[i].touch(j) // a rejection is a use too: see the package comment
			*st = shards[i].state(j)
			// Its slot holds until the locks go: the take need not
			// look again.
			hashes[i].slot = j + 1
		} else {
			*st = algorithms.NewState(&r.Store.limit)
		}
		if !onCopy(r.Store.limit.Kind) {
			ds[i] = r.Store.limit.Peek(st, r.Store.at(now), r.Cost)
		} else {
			r.Store.limit.TakeTo(&ds[i], st, r.Store.at(now), r.Cost)
		}
		if !ds[i].Allowed && !r.DryRun && rejected < 0 {
			rejected = i
		}
	}
	var vbuf [maxInline]bool // elsewhere[i]: reqs[i].Store must evict elsewhere
	elsewhere := vbuf[:0]
	if len(reqs) > maxInline {
		elsewhere = make([]bool, 0, len(reqs))
	}
	elsewhere = elsewhere[:len(reqs)]
	clear(elsewhere)
	for i := range reqs {
		r := &reqs[i]
		b := banOf(reqs, i)
		if !ds[i].Allowed || b >= 0 && !ds[b].Allowed || r.Store.limit.Kind == algorithms.Ban {
			continue
		}
		switch {
		case rejected >= 0 && onCopy(r.Store.limit.Kind):
			// Not taken: what the zone would decide with nothing charged.
			ds[i] = peekBanned(r, shards[i], hashes[i], now)
		case rejected >= 0:
		case onCopy(r.Store.limit.Kind):
			elsewhere[i] = r.Store.keep(shards[i], hashes[i], &sts[i], &ds[i])
		default:
			elsewhere[i] = r.Store.takeLocked(shards[i], hashes[i], now, r.Cost, &ds[i])
		}
	}
	if strike(now, reqs, shards, hashes, ds, elsewhere) {
		rejected = firstRejecting(reqs, ds)
	}
	for _, sh := range locked {
		sh.mu.Unlock()
	}
	for i, e := range elsewhere {
		if e {
			reqs[i].Store.evictElsewhere(shards[i])
		}
	}
	return rejected
}

// onCopy reports whether TakeAll takes a zone of kind on a copy of its
// state (see TakeAll): not a ban, which is struck, not taken, nor a
// sliding_log.
func onCopy(kind algorithms.Kind) bool {
	return kind != algorithms.Ban && kind != algorithms.SlidingLog
}

// peekBanned is what r's Store would decide on r at now, nothing charged
// and r's key not touched: the rate of a request its ban refuses, or of
// one another zone rejects. sh, r's shard (hash h), must be locked. Kept
// apart from TakeAll's own check, whose inline lookup is worth a tenth of
// a multi-zone decision.
func peekBanned(r *Request, sh *shard, k hashed, now int64) algorithms.Decision {
	st := algorithms.NewState(&r.Store.limit)
	if i := sh.find(k.h, k.tag); i >= 0 {
		st = sh.state(i) // a copy: Peek may bring it up to date
	}
	return r.Store.limit.Peek(&st, r.Store.at(now), r.Cost)
}

// strike gives each ban in reqs that does not hold one strike if a request
// linked to it was rejected, and reports whether a ban started. The
// shards of reqs must be locked.
func strike(now int64, reqs []Request, shards []*shard, hashes []hashed, ds []algorithms.Decision, elsewhere []bool) (started bool) {
	for b := range reqs {
		r := &reqs[b]
		if r.Store.limit.Kind != algorithms.Ban || !ds[b].Allowed {
			continue
		}
		for j := b + 1; j < len(reqs); j++ {
			if banOf(reqs, j) == b && !ds[j].Allowed {
				sh := shards[b]
				var i int
				i, elsewhere[b] = r.Store.get(sh, hashes[b].h, hashes[b].tag)
				st := sh.state(i)
				ds[b] = r.Store.limit.Strike(&st, r.Store.at(now))
				sh.setState(i, &st)
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
