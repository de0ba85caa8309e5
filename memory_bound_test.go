package tollgate

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
		got := memoryBoundWarning(c.zone)
		if (c.warning == "") != (got == "") || !strings.HasPrefix(got, c.warning) {
			t.Errorf("%s: warning %q, want one starting %q", c.name, got, c.warning)
		}
	}
}

func TestMaskIP(t *testing.T) {
	for _, c := range []struct {
		key            string
		v4bits, v6bits int
		want           string
	}{
		{"203.0.113.7", 32, 64, "203.0.113.7"},
		{"203.0.113.7", 24, 64, "203.0.113.0/24"},
		{"2001:db8:1:2:3:4:5:6", 32, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 32, 128, "2001:db8:1:2:3:4:5:6"},
		{"2001:db8:1:2:3:4:5:6", 32, 48, "2001:db8:1::/48"},
		{"::ffff:203.0.113.7", 32, 64, "203.0.113.7"},
		{"::ffff:203.0.113.7", 16, 64, "203.0.0.0/16"},
		{"::ffff:203.0.113.7", 32, 128, "203.0.113.7"},
		{"2001:db8::1", 32, 128, "2001:db8::1"},
		{"fe80::1%eth0", 32, 64, "fe80::/64"},
		{"not-an-ip", 8, 8, "not-an-ip"},
		{"", 8, 8, ""},
		{"api-key:with:colons", 32, 64, "api-key:with:colons"},
	} {
		if got := maskIP(c.key, c.v4bits, c.v6bits); got != c.want {
			t.Errorf("maskIP(%q, %d, %d) = %q, want %q", c.key, c.v4bits, c.v6bits, got, c.want)
		}
		// The key a zone stores: before, a zone keeping both families
		// whole (32 and 128) stored an IPv4-mapped address as it came, a
		// second key for the same client beside its plain IPv4 one.
		z := &zone{v4bits: c.v4bits, v6bits: c.v6bits}
		if got := z.storedKey(c.key); got != c.want {
			t.Errorf("storedKey(%q) with prefixes %d and %d = %q, want %q", c.key, c.v4bits, c.v6bits, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { maskIP("203.0.113.7", 32, 64) }); n != 0 {
		t.Errorf("maskIP of a whole IPv4 key: %v allocations, want 0", n)
	}
}
