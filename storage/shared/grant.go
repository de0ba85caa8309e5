package shared

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// ErrNoGrants is the error of a grant to a limiter whose store keeps no
// grants.
var ErrNoGrants = errors.New("its store keeps no grants")

// grantIDs keeps the ids of the grants made on stores that keep no ids
// themselves (memory), so that a grant sent again with the same id is
// applied once per store, key and window.
var grantIDs = idSet{max: maxGrantIDs}

// maxGrantIDs bounds the ids grantIDs keeps: past it, the oldest is
// forgotten, even if its window has not ended.
const maxGrantIDs = 10_000

// idSet is a set of ids, each kept until a time of its own, bounded by
// max: the ids in a map, and in a queue in the order they were added,
// from which expired ones are dropped as new ones come and, when max are
// kept, the oldest. Each id is queued once and dropped once: a grant's
// work is O(1), amortised. The zero value (max 0) keeps every id.
type idSet struct {
	sync.Mutex
	max   int
	m     map[string]int64 // id -> until (monotonic µs)
	queue []queuedID       // queue[head:]: the ids in the order added
	head  int
}

// queuedID is an id as queued, with the until it was added with: an id
// dropped once expired and added again is queued twice, and only its
// latest entry stands for it in the map.
type queuedID struct {
	id    string
	until int64
}

// has reports whether id is kept and its time has not come at now.
// s must be locked.
func (s *idSet) has(id string, now int64) bool {
	until, ok := s.m[id]
	return ok && now < until
}

// add keeps id until until, dropping at now the oldest ids whose time has
// come, and the oldest of all while max are kept. s must be locked.
func (s *idSet) add(id string, now, until int64) {
	if s.m == nil {
		s.m = map[string]int64{}
	}
	for s.head < len(s.queue) {
		q := s.queue[s.head]
		expired := now >= q.until
		if !expired && (s.max <= 0 || len(s.m) < s.max) {
			break
		}
		if u, ok := s.m[q.id]; ok && u == q.until {
			delete(s.m, q.id)
		}
		s.queue[s.head] = queuedID{}
		s.head++
	}
	if s.head > len(s.queue)/2 {
		// Reuse the dropped half: each id is copied at most once per
		// time the queue's length doubles.
		n := copy(s.queue, s.queue[s.head:])
		clear(s.queue[n:])
		s.queue, s.head = s.queue[:n], 0
	}
	s.m[id] = until
	s.queue = append(s.queue, queuedID{id, until})
}

// len returns how many ids are kept, expired or not. s must be locked.
func (s *idSet) len() int { return len(s.m) }

// GrantOnce grants amount to key on l, whose limit is limit, once for id
// (none if ""): on a store that keeps ids (Redis), in its script; on
// another, once per process and scope (see GrantScope). applied is false
// for a grant whose id was applied already: d is then the key's state.
func GrantOnce(ctx context.Context, l storage.Limiter, limit *algorithms.Limit, scope any, key string, now, amount int64, id string) (d algorithms.Decision, applied bool, err error) {
	if g, ok := l.(storage.OnceGranter); ok {
		return g.GrantOnce(ctx, key, now, amount, id)
	}
	g, ok := l.(storage.Granter)
	if !ok {
		return d, false, ErrNoGrants
	}
	if id == "" {
		d, err = g.Grant(ctx, key, now, amount)
		return d, err == nil, err
	}
	name := fmt.Sprintf("%p %q %q", scope, key, id)
	mono := Micros()
	grantIDs.Lock()
	defer grantIDs.Unlock()
	if grantIDs.has(name, mono) {
		d, _, err = l.Peek(ctx, key, now)
		return d, false, err
	}
	if d, err = g.Grant(ctx, key, now, amount); err != nil {
		return d, false, err
	}
	grantIDs.add(name, mono, mono+storage.Horizon(limit))
	return d, true, nil
}

// GrantScope identifies where l's grants are kept, so that a grant to a
// zone defined by several handlers is made once per store: its memory
// store, or its Redis keys, which are the same from every handler whose
// client reaches the same keys, whatever its pool size or timeout, for the
// same zone name and algorithm.
func GrantScope(l storage.Limiter) any {
	if rl, ok := l.(*Limiter); ok {
		return rl.grantScope()
	}
	return l
}

// GrantedElsewhere has l learn a grant of amount to key that another
// handler's client made in l's scope in this process (see GrantScope), d
// the decision after it. A limiter that no other client reaches (memory)
// has nothing to learn.
func GrantedElsewhere(l storage.Limiter, key string, now, amount int64, d algorithms.Decision) {
	if rl, ok := l.(*Limiter); ok {
		rl.grantedElsewhere(key, now, amount, d)
	}
}
