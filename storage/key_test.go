package storage

import "testing"

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
		if got := MaskIP(c.key, c.v4bits, c.v6bits); got != c.want {
			t.Errorf("MaskIP(%q, %d, %d) = %q, want %q", c.key, c.v4bits, c.v6bits, got, c.want)
		}
		// The key a zone stores: before, a zone keeping both families
		// whole (32 and 128) stored an IPv4-mapped address as it came, a
		// second key for the same client beside its plain IPv4 one.
		if got := StoredKey(c.key, c.v4bits, c.v6bits); got != c.want {
			t.Errorf("StoredKey(%q) with prefixes %d and %d = %q, want %q", c.key, c.v4bits, c.v6bits, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { MaskIP("203.0.113.7", 32, 64) }); n != 0 {
		t.Errorf("MaskIP of a whole IPv4 key: %v allocations, want 0", n)
	}
}
