package memory

import (
	"fmt"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// PoolKey identifies a zone's state, for a pool of stores kept across
// config reloads: a zone whose algorithm or limit changes starts afresh,
// since its old state means something else. A Redis zone's local copy is kept apart from a memory zone of the same
// name and limit: it runs on Redis's clock and holds what Redis decided,
// so a reload between Redis and memory starts the zone afresh either way.
//
// Concurrency counts are requests in flight, which a reload does not end:
// they are kept whatever max_keys and the lease (which memory does not
// use) say, so that the requests running across a reload keep their
// slots, and give them back where they took them.
func PoolKey(z storage.Zone, local bool) string {
	l := z.Limit
	maxKeys := z.MaxKeys
	if l.Kind == algorithms.Concurrency {
		l.Window, maxKeys = 0, 0
	}
	key := fmt.Sprintf("%s/%s/%d/%d/%d/%d/%d/%d", z.Name, l.Kind, l.Events, l.Window, l.Burst, l.MaxDelay, l.Hold, maxKeys)
	if c := l.Calendar; c.Unit != algorithms.NoUnit {
		// Windows of the same nominal length in another zone or unit
		// are other windows.
		loc := "UTC"
		if c.Loc != nil {
			loc = c.Loc.String()
		}
		key += "/" + c.String() + "@" + loc
	}
	if local {
		key = "local:" + key
	}
	return key
}
