package memory

import (
	"context"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// Settle settles the Take for key whose Decision is taken, which reserved
// milli-units, to actual milli-units, under the key's shard lock (see
// algorithms.Limit.Settle). A give-back to a key evicted or swept
// meanwhile gives nothing, even once the key is back (a new entry); an
// excess owed by such a key is owed by its state now. A key reset since taken.At settles nothing: the reset gave the
// reservation back and forgave what the key owed (see Undo). At the
// reset's very µs the charge may have come before it or after: a
// give-back then gives nothing (it must not mint), an excess is owed (it
// must not be forgiven).
func (s *Store) Settle(_ context.Context, key string, now, reserved, actual int64, taken algorithms.Decision) error {
	if actual == reserved || s.limit.Kind == algorithms.Concurrency {
		return nil
	}
	now = s.at(now)
	h, tag, sh := s.locate(key)
	sh.mu.Lock()
	at := taken.At
	if actual > reserved {
		at++ // a reset strictly after the charge forgives it
	}
	if s.resets.any.Load() && s.resets.since(key, at, now) {
		sh.mu.Unlock()
		return nil
	}
	i, elsewhere := -1, false
	if actual < reserved {
		i = sh.find(h, tag)
	} else {
		i, elsewhere = s.get(sh, h, tag)
	}
	if actual < reserved && i >= 0 && sh.replaced(i, &taken) {
		i = -1 // a new entry of the key: not what was charged
	}
	if i >= 0 {
		st := sh.state(i)
		s.limit.Settle(&st, now, reserved, actual, taken)
		sh.setState(i, &st)
	}
	sh.mu.Unlock()
	if elsewhere {
		s.evictElsewhere(sh)
	}
	return nil
}

var _ storage.Settler = (*Store)(nil)
