package ratelimitheader

import (
	"math"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// AdmitWait is the µs until every part of a rejected request that is not
// a dry run would admit it, or algorithms.Never. Each part's wait was
// found with nothing charged, and a part that admits a request at some
// time admits it at every later time while nothing else is charged, so the
// longest wait is when they all do.
func AdmitWait[Z any](parts []shared.Part[Z]) int64 {
	var wait int64
	for i := range parts {
		d := &parts[i].D
		if parts[i].Zone.DryRun || d.Allowed {
			continue
		}
		if d.Wait == algorithms.Never {
			return algorithms.Never
		}
		wait = max(wait, d.Wait)
	}
	return wait
}

// RetryAfter is Retry-After for a wait of µs: ceil(wait * (1 + jitter *
// u)) seconds, at least 1, where u in [0, 1) is derived from a hash of the
// zone and key, so that one identity always gets the same spread.
func RetryAfter(wait int64, jitter float64, zone, key string) int64 {
	secs := float64(wait) / 1e6
	if jitter > 0 {
		secs *= 1 + jitter*jitterFraction(zone, key)
	}
	s := int64(math.Ceil(secs))
	if s < 1 {
		s = 1
	}
	return s
}

// jitterFraction maps (zone, key) to [0, 1) with FNV-1a, without allocating.
func jitterFraction(zone, key string) float64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(zone); i++ {
		h = (h ^ uint64(zone[i])) * prime
	}
	h = (h ^ 0xff) * prime // separator: no byte of a zone name is 0xff
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	// FNV's low bits mix poorly; finish with a 64-bit avalanche.
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return float64(h>>11) / (1 << 53)
}
