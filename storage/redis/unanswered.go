package redis

import (
	"sync"
	"time"
)

// maxUnanswered bounds the grants an unanswered keeps: past it, those
// whose id Redis no longer keeps go, then all of them.
const maxUnanswered = 1024

// unanswered keeps the grants with an id whose call failed in this
// process: Redis may have applied one and its answer been lost, and
// then a call with the same id finds it applied already. That call is
// the first to know it was applied: it announces it and reports it
// applied, once (see zone.GrantOnce). A grant is kept for as long as
// Redis keeps its id (storage.Horizon). Its methods are safe for
// concurrent use; the zero value is ready.
type unanswered struct {
	mu sync.Mutex
	m  map[string]time.Time // Redis key and id -> until
}

// add keeps the grant of id to rkey for horizon µs.
func (u *unanswered) add(rkey, id string, horizon int64) {
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[string]time.Time{}
	}
	if len(u.m) >= maxUnanswered {
		for k, until := range u.m {
			if !now.Before(until) {
				delete(u.m, k)
			}
		}
		if len(u.m) >= maxUnanswered {
			clear(u.m)
		}
	}
	u.m[rkey+"!grant:"+id] = now.Add(time.Duration(horizon) * time.Microsecond)
}

// answer reports whether the grant of id to rkey was kept, unanswered,
// and forgets it: its answer is given now.
func (u *unanswered) answer(rkey, id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	k := rkey + "!grant:" + id
	until, ok := u.m[k]
	if ok {
		delete(u.m, k)
	}
	return ok && time.Now().Before(until)
}
