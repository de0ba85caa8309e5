package tollgate

import (
	"fmt"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
)

// Memory a key can cost in the memory store, in bytes, for the bound
// checked at load: its entry (128 bytes, with the state, the LRU links
// and a key of up to 24 bytes) and its share of its shard's table (16 to
// 43 bytes: 16-byte slots, from 3/8 to 3/4 full), 165 bytes measured by
// BenchmarkBytesPerKey in storage/memory, rounded up; plus the longest key
// stored as it is (storage.MaxKeyLen), plus a full sliding_log's 8 bytes
// per event.
const (
	keyOverheadBytes = 176
	logEntryBytes    = 8
)

// memoryWarnBytes is the worst-case memory per zone above which a zone on
// the memory store (or with on_storage_error local) is warned about at
// load: 4 GiB.
const memoryWarnBytes = 4 << 30

// worstCaseBytes is the most memory a zone's memory store can hold: every
// one of max_keys keys at its longest with a full state. A sliding_log
// grows its log with its entries, so a key that made one request costs far
// less; this is the bound an attacker with many addresses can reach.
func worstCaseBytes(z storage.Zone) int64 {
	keys := int64(z.MaxKeys)
	if keys <= 0 {
		keys = memory.DefaultMaxKeys
	}
	per := int64(keyOverheadBytes + storage.MaxKeyLen)
	if z.Limit.Kind == algorithms.SlidingLog {
		per += logEntryBytes * z.Limit.Events
	}
	return keys * per
}

// memoryBoundWarning returns a warning when a zone's worst case passes
// memoryWarnBytes, naming what to lower; "" otherwise.
func memoryBoundWarning(z storage.Zone) string {
	worst := worstCaseBytes(z)
	if worst <= memoryWarnBytes {
		return ""
	}
	keys := z.MaxKeys
	if keys <= 0 {
		keys = memory.DefaultMaxKeys
	}
	hint := "lower max_keys"
	if z.Limit.Kind == algorithms.SlidingLog {
		hint = "lower max_keys or events, or use sliding_window, which keeps two counters per key"
	}
	return fmt.Sprintf("zone %s: max_keys %d can hold up to %.1f GiB in memory (%d bytes per key at worst); %s",
		z.Name, keys, float64(worst)/(1<<30), worst/int64(keys), hint)
}

// warnMemoryBound logs memoryBoundWarning for a zone on the memory store.
func (h *Handler) warnMemoryBound(z storage.Zone) {
	if msg := memoryBoundWarning(z); msg != "" {
		h.logger.Warn(msg)
	}
}
