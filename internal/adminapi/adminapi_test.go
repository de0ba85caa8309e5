package adminapi

import (
	"strings"
	"testing"
)

func TestFormatLimit(t *testing.T) {
	for _, c := range []struct {
		events int64
		window float64
		want   string
	}{
		{100, 60, "100/min"},
		{5, 3600, "5/h"},
		{20, 1, "20/s"},
		{2, 86400, "2/day"},
		{1000, 7 * 86400, "1000/week"},
		{100, 10, "100/10s"},
		{5, 90, "5/1m30s"},
		{1, 0.5, "1/500ms"},
	} {
		if got := FormatLimit(c.events, c.window); got != c.want {
			t.Errorf("FormatLimit(%d, %v) = %q, want %q", c.events, c.window, got, c.want)
		}
	}
}

func TestFormatSeconds(t *testing.T) {
	for _, c := range []struct {
		s    float64
		want string
	}{
		{0, "0s"},
		{-1, "0s"},
		{0.0004, "1ms"},
		{0.6, "600ms"},
		{1, "1s"},
		{59.2, "1m"},
		{90, "1m30s"},
		{872, "14m32s"},
		{3600, "1h"},
		{3661, "1h1m"},
		{86400, "1d"},
		{90061, "1d1h"},
	} {
		if got := FormatSeconds(c.s); got != c.want {
			t.Errorf("FormatSeconds(%v) = %q, want %q", c.s, got, c.want)
		}
	}
}

func TestKeyURI(t *testing.T) {
	for _, c := range []struct{ zone, key, want string }{
		{"api", "customer-42", "/rate_limit/zones/api/keys/customer-42"},
		{"api", "a/b c", "/rate_limit/zones/api/keys/a%2Fb%20c"},
		{"api", "100%?x#y", "/rate_limit/zones/api/keys/100%25%3Fx%23y"},
		{"api", "..", "/rate_limit/zones/api/keys/%2E%2E"},
		{"api", ".", "/rate_limit/zones/api/keys/%2E"},
		{"api", "a..b", "/rate_limit/zones/api/keys/a..b"},
		{"api", "2001:db8::1", "/rate_limit/zones/api/keys/2001:db8::1"},
		{"api", "", "/rate_limit/zones/api/keys/"},
	} {
		if got := KeyURI(c.zone, "keys", c.key); got != c.want {
			t.Errorf("KeyURI(%q, %q) = %q, want %q", c.zone, c.key, got, c.want)
		}
	}
}

// TestWriteKeyLease: a key's table tells the lease the answering instance
// holds, and that Redis's remaining does not count it.
func TestWriteKeyLease(t *testing.T) {
	var b strings.Builder
	st := KeyState{Zone: "api", Key: "all", Allowed: true, Remaining: 80, Lease: &LeaseState{Events: 12, Left: 0.2}}
	if err := WriteKey(&b, st); err != nil {
		t.Fatal(err)
	}
	want := "lease      12 events held by this instance for 200ms (not in remaining)"
	if !strings.Contains(b.String(), want) {
		t.Errorf("WriteKey wrote\n%s\nwant a line %q", b.String(), want)
	}
	b.Reset()
	st.Lease = nil
	if err := WriteKey(&b, st); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "lease") {
		t.Errorf("WriteKey wrote a lease line without a lease:\n%s", b.String())
	}
}
