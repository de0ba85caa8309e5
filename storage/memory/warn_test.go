package memory

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

func TestMemoryBoundWarning(t *testing.T) {
	limit := func(kind algorithms.Kind, events int64) algorithms.Limit {
		l, err := algorithms.NewLimit(kind, events, time.Hour, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, c := range []struct {
		name    string
		zone    storage.Zone
		warning string // "" for none
	}{
		{"token bucket, default max_keys", storage.Zone{Name: "tb", Limit: limit(algorithms.TokenBucket, 100000)}, ""},
		{"sliding_log 100000/h, default max_keys", storage.Zone{Name: "log", Limit: limit(algorithms.SlidingLog, 100000)},
			"zone log: max_keys 1000000 can hold up to 745.2 GiB in memory (800178 bytes per key at worst); lower max_keys or events, or use sliding_window"},
		{"sliding_log 100000/h, max_keys 2000", storage.Zone{Name: "log", Limit: limit(algorithms.SlidingLog, 100000), MaxKeys: 2000}, ""},
		{"sliding_log 1000/h, max_keys 1000000", storage.Zone{Name: "log", Limit: limit(algorithms.SlidingLog, 1000), MaxKeys: 1000000},
			"zone log: max_keys 1000000 can hold up to 7.6 GiB"},
		{"sliding_log 100/h, max_keys 1000000", storage.Zone{Name: "log", Limit: limit(algorithms.SlidingLog, 100), MaxKeys: 1000000}, ""},
		{"token bucket, 20M keys", storage.Zone{Name: "many", Limit: limit(algorithms.TokenBucket, 10), MaxKeys: 20_000_000}, ""},
		{"token bucket, 60M keys", storage.Zone{Name: "many", Limit: limit(algorithms.TokenBucket, 10), MaxKeys: 60_000_000},
			"zone many: max_keys 60000000 can hold up to 4.4 GiB in memory (79 bytes per key at worst); lower max_keys"},
		{"sliding_window, 40M keys", storage.Zone{Name: "many", Limit: limit(algorithms.SlidingWindow, 10), MaxKeys: 40_000_000},
			"zone many: max_keys 40000000 can hold up to 4.4 GiB in memory (119 bytes per key at worst); lower max_keys"},
	} {
		got := BoundWarning(c.zone)
		if (c.warning == "") != (got == "") || !strings.HasPrefix(got, c.warning) {
			t.Errorf("%s: warning %q, want one starting %q", c.name, got, c.warning)
		}
	}
}
