package memory

import (
	"fmt"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// logEntryBytes is what a full sliding_log holds per event: one
// timestamp. The rest of a key's memory is BytesPerKey.
const logEntryBytes = 8

// memoryWarnBytes is the worst-case memory per zone above which a zone on
// the memory store (or with on_storage_error local) is warned about at
// load: 4 GiB.
const memoryWarnBytes = 4 << 30

// worstCaseBytes is the most memory a zone's memory store can hold: every
// one of max_keys keys with a full state (a key's bytes are not kept). A sliding_log
// grows its log with its entries, so a key that made one request costs far
// less; this is the bound an attacker with many addresses can reach.
func worstCaseBytes(z storage.Zone) int64 {
	keys := int64(z.MaxKeys)
	if keys <= 0 {
		keys = DefaultMaxKeys
	}
	per := BytesPerKey(z.Limit.Kind)
	if z.Limit.Kind == algorithms.SlidingLog {
		per += logEntryBytes * z.Limit.Events
	}
	return keys * per
}

// BoundWarning returns a warning when a zone's worst case passes
// memoryWarnBytes, naming what to lower; "" otherwise.
func BoundWarning(z storage.Zone) string {
	worst := worstCaseBytes(z)
	if worst <= memoryWarnBytes {
		return ""
	}
	keys := z.MaxKeys
	if keys <= 0 {
		keys = DefaultMaxKeys
	}
	hint := "lower max_keys"
	if z.Limit.Kind == algorithms.SlidingLog {
		hint = "lower max_keys or events, or use sliding_window, which keeps two counters per key"
	}
	return fmt.Sprintf("zone %s: max_keys %d can hold up to %.1f GiB in memory (%d bytes per key at worst); %s",
		z.Name, keys, float64(worst)/(1<<30), worst/int64(keys), hint)
}
