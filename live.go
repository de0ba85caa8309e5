package tollgate

import (
	"reflect"
	"sort"
	"sync"

	"github.com/caddy-tollgate/tollgate/storage"
)

// live is the set of provisioned handlers, which the admin API and the
// store metrics read: Provision adds a handler once its zones are built,
// Cleanup removes it. During a config reload both the old and the new
// configuration's handlers are live for a moment. Never touched on the
// request path.
var live struct {
	mu       sync.Mutex
	handlers []*Handler // in the order they were provisioned
}

// registerLive adds h, whose zones are built and will not change.
func registerLive(h *Handler) {
	live.mu.Lock()
	defer live.mu.Unlock()
	live.handlers = append(live.handlers, h)
}

// unregisterLive removes h, if it is live, and returns the names of its
// zones that no live handler defines any more. A handler whose Provision
// failed was never live, but its zones' names are returned all the same,
// for the metric series it may have created.
func unregisterLive(h *Handler) []string {
	live.mu.Lock()
	defer live.mu.Unlock()
	for i, x := range live.handlers {
		if x == h {
			live.handlers = append(live.handlers[:i], live.handlers[i+1:]...)
			break
		}
	}
	var gone []string
	for _, z := range h.zones {
		if !liveZoneNamed(z.name) {
			gone = append(gone, z.name)
		}
	}
	return gone
}

// liveZoneNamed reports whether a live handler defines a zone called
// name. live.mu must be held.
func liveZoneNamed(name string) bool {
	for _, h := range live.handlers {
		for _, z := range h.zones {
			if z.name == name {
				return true
			}
		}
	}
	return false
}

// liveZone is a zone of a live handler.
type liveZone struct {
	z       *zone
	h       *Handler
	now     func() int64 // the handler's clock
	backend string       // the storage module's name
}

// liveZones returns the live handlers' zones, sorted by name, in the
// order their handlers were provisioned within a name. The caller may use
// them after the lock is released: a zone does not change once built.
func liveZones() []liveZone {
	live.mu.Lock()
	defer live.mu.Unlock()
	var zs []liveZone
	for _, h := range live.handlers {
		for _, z := range h.zones {
			zs = append(zs, liveZone{z: z, h: h, now: h.now, backend: backendName(h.backend)})
		}
	}
	sort.SliceStable(zs, func(i, j int) bool { return zs[i].z.name < zs[j].z.name })
	return zs
}

// keyCounter is a store that counts its keys: the memory store.
type keyCounter interface{ Len() int }

// evictionCounter is a store that counts its evictions: the memory store.
type evictionCounter interface{ Evictions() int64 }

// distinctStores appends to seen the stores of zs that count their keys
// and are not in seen yet, and returns it. One memory store serves every
// zone with the same name and limit (across handlers and reloads), so it
// must be counted once.
func distinctStores(seen []storage.Limiter, zs ...liveZone) []storage.Limiter {
	for _, lz := range zs {
	next:
		for _, p := range lz.z.all {
			if p != lz.z && p.tier == "" {
				continue // a ban or a concurrency beside the rate: not keys of their own
			}
			l := p.Limiter
			if _, ok := l.(keyCounter); !ok || !reflect.TypeOf(l).Comparable() {
				continue
			}
			for _, s := range seen {
				if s == l {
					continue next
				}
			}
			seen = append(seen, l)
		}
	}
	return seen
}

// storeCount is a zone name's key count and evictions, over its distinct
// memory stores.
type storeCount struct {
	zone      string
	keys      int
	evictions int64
}

// liveStoreCounts returns the key counts of the live zones that have
// memory stores and metrics (not those of a handler with
// disable_metrics), one per zone name, sorted by name.
func liveStoreCounts() []storeCount {
	var zs []liveZone
	for _, lz := range liveZones() {
		if lz.z.metrics != nil {
			zs = append(zs, lz)
		}
	}
	var counts []storeCount
	for i := 0; i < len(zs); {
		j := i
		for j < len(zs) && zs[j].z.name == zs[i].z.name {
			j++
		}
		stores := distinctStores(nil, zs[i:j]...)
		if len(stores) > 0 {
			c := storeCount{zone: zs[i].z.name}
			for _, s := range stores {
				c.keys += s.(keyCounter).Len()
				if e, ok := s.(evictionCounter); ok {
					c.evictions += e.Evictions()
				}
			}
			counts = append(counts, c)
		}
		i = j
	}
	return counts
}
