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
var grantIDs = struct {
	sync.Mutex
	m map[string]int64 // scope, key and id -> until (monotonic µs)
}{m: map[string]int64{}}

// maxGrantIDs is how many ids grantIDs keeps before it drops those whose
// window has ended.
const maxGrantIDs = 10_000

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
	if until, ok := grantIDs.m[name]; ok && mono < until {
		d, _, err = l.Peek(ctx, key, now)
		return d, false, err
	}
	if len(grantIDs.m) >= maxGrantIDs {
		for k, until := range grantIDs.m {
			if mono >= until {
				delete(grantIDs.m, k)
			}
		}
	}
	if d, err = g.Grant(ctx, key, now, amount); err != nil {
		return d, false, err
	}
	grantIDs.m[name] = mono + storage.Horizon(limit)
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
