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

// TestWriteZonesCalendar: a calendar zone's limit, and its tiers', is
// written as `rate` and `window` spell it (a month is not 30 days), its
// time zone beside it; a zone of fixed windows as before.
func TestWriteZonesCalendar(t *testing.T) {
	zones := []ZoneInfo{
		{Zone: "monthly", Algorithm: "fixed_window", Events: 100000, Window: 30 * 86400, Burst: 100000, Storage: "redis",
			Calendar: "1mo", Timezone: "America/New_York", TierKey: "{plan}", Tiers: map[string]TierInfo{
				"gold":  {Events: 5000000, Window: 90 * 86400, Burst: 5000000, Calendar: "3mo"},
				"trial": {Events: 1000, Window: 14 * 86400, Burst: 1000},
			}},
		{Zone: "daily", Algorithm: "fixed_window", Events: 2, Window: 86400, Burst: 2, Storage: "memory", Calendar: "1d", Timezone: "UTC"},
		{Zone: "weeks", Algorithm: "fixed_window", Events: 70, Window: 14 * 86400, Burst: 70, Storage: "memory", Calendar: "2w", Timezone: "UTC"},
		{Zone: "tens", Algorithm: "fixed_window", Events: 5, Window: 10 * 86400, Burst: 5, Storage: "memory", Calendar: "10d", Timezone: "UTC"},
		{Zone: "plain", Algorithm: "fixed_window", Events: 2, Window: 86400, Burst: 2, Storage: "memory"},
	}
	var b strings.Builder
	if err := WriteZones(&b, zones); err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(b.String()), "\n")
	for i, want := range [][]string{
		{"monthly", "fixed_window", "100000/mo", "100000", "redis", "-", "calendar America/New_York; tiers by {plan}: gold 5000000/3mo, trial 1000/14d"},
		{"daily", "fixed_window", "2/d", "2", "memory", "-", "calendar UTC"},
		{"weeks", "fixed_window", "70/2w", "70", "memory", "-", "calendar UTC"},
		{"tens", "fixed_window", "5/10d", "5", "memory", "-", "calendar UTC"},
		{"plain", "fixed_window", "2/day", "2", "memory", "-", ""},
	} {
		if i+1 >= len(rows) {
			t.Fatalf("WriteZones wrote %d rows, want %d:\n%s", len(rows)-1, 5, b.String())
		}
		fields := strings.Fields(rows[i+1])
		got := strings.Join(fields[:min(6, len(fields))], " ") + " | " + strings.Join(fields[min(6, len(fields)):], " ")
		if w := strings.Join(want[:6], " ") + " | " + want[6]; got != w {
			t.Errorf("row %d: %q, want %q", i+1, got, w)
		}
	}
}
