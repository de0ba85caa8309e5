package ratelimitheader

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// part is a zone part with its quota, as the root's zone is.
type part struct {
	q  Quota
	sz shared.Zone
}

func (p *part) HeaderQuota() *Quota { return &p.q }

func newPart(t *testing.T, name string, ban bool, l algorithms.Limit, d algorithms.Decision) shared.Part[*part] {
	t.Helper()
	p := &part{}
	p.q = Quota{Name: name, Limit: &l}
	if !ban {
		p.q.Policy = PolicyItem(name, l)
	}
	return shared.Part[*part]{Z: p, Zone: &p.sz, D: d}
}

func limit(t *testing.T, kind algorithms.Kind, events int64, window time.Duration) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewLimit(kind, events, window, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestParseModes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Modes
		err  string
	}{
		{"", ModeIETF, ""},
		{"ietf x-ratelimit", ModeIETF | ModeX, ""},
		{"ietf-draft-03", ModeDraft03, ""},
		{"none", 0, ""},
		{"none ietf", 0, `headers: none cannot be combined with other modes, got "none ietf"`},
		{"ietf ietf", 0, `headers: mode "ietf" given twice`},
		{"rfc", 0, `headers: unknown mode "rfc"`},
	} {
		got, err := ParseModes(strings.Fields(c.in))
		if c.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), c.err) {
				t.Errorf("ParseModes(%q) = %v, want an error starting %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseModes(%q) = %v, %v, want %v", c.in, got, err, c.want)
		}
	}
}

func TestPolicyItem(t *testing.T) {
	conc, err := algorithms.NewConcurrency(3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		l    algorithms.Limit
		want string
	}{
		{limit(t, algorithms.FixedWindow, 100, time.Minute), `"z";q=100;w=60`},
		{limit(t, algorithms.FixedWindow, 5, 1500*time.Millisecond), `"z";q=5;w=2`},
		{limit(t, algorithms.TokenBucket, 10, 100*time.Millisecond), `"z";q=100;w=1`},
		{conc, `"z";q=3;qu="concurrent-requests"`},
	} {
		if got := PolicyItem("z", c.l); got != c.want {
			t.Errorf("PolicyItem(%v %d per %dµs) = %q, want %q", c.l.Kind, c.l.Events, c.l.Window, got, c.want)
		}
	}
}

func TestIETF(t *testing.T) {
	minute := limit(t, algorithms.FixedWindow, 10, time.Minute)
	ban, err := algorithms.NewBan(1, time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	parts := []shared.Part[*part]{
		newPart(t, "a", true, ban, algorithms.Decision{Allowed: false, Wait: 3_000_000}),
		newPart(t, "a", false, minute, algorithms.Decision{Remaining: 4, Reset: 1_500_000}),
		newPart(t, "b", false, minute, algorithms.Decision{Allowed: true, Remaining: -2, Reset: 30_000_000}),
	}
	policy, value := IETF(parts, 0, 7, false)
	if want := `"a";q=10;w=60, "b";q=10;w=60`; policy != want {
		t.Errorf("policy %q, want %q", policy, want)
	}
	// The ban rejected: its zone's rate shows Retry-After; b owes, r=0.
	if want := `"a";r=4;t=7, "b";r=0;t=30`; value != want {
		t.Errorf("value %q, want %q", value, want)
	}
	if got := MostRestrictive(parts, -1); got != 2 {
		t.Errorf("MostRestrictive(allowed) = %d, want 2 (fewest remaining, the ban aside)", got)
	}
	if got := Shown(parts, 0); got != 1 {
		t.Errorf("Shown(the ban) = %d, want 1, its zone's rate", got)
	}
	if l, r, reset := Single(parts, 0, 7); l != "10" || r != "4" || reset != 7 {
		t.Errorf("Single = %s, %s, %d, want 10, 4, 7", l, r, reset)
	}
	parts[1].Z.q.ZonePolicy = "built once"
	if policy, _ := IETF(parts[:2], -1, -1, true); policy != "built once" {
		t.Errorf("one zone's policy %q, want its ZonePolicy", policy)
	}
}

func TestRetryAfter(t *testing.T) {
	if got := RetryAfter(1, 0, "z", "k"); got != 1 {
		t.Errorf("RetryAfter(1µs) = %d, want at least 1", got)
	}
	if got := RetryAfter(2_000_001, 0, "z", "k"); got != 3 {
		t.Errorf("RetryAfter(2.000001s) = %d, want 3", got)
	}
	seen := map[int64]bool{}
	for _, key := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		got := RetryAfter(100_000_000, 1, "z", key)
		if got < 100 || got > 200 || got != RetryAfter(100_000_000, 1, "z", key) {
			t.Errorf("RetryAfter(100s, jitter 1, %q) = %d, want one value in [100, 200]", key, got)
		}
		seen[got] = true
	}
	if len(seen) < 2 {
		t.Errorf("jitter gave 8 keys %d distinct values, want a spread", len(seen))
	}
}

func TestAdmitWait(t *testing.T) {
	l := limit(t, algorithms.FixedWindow, 1, time.Second)
	parts := []shared.Part[*part]{
		newPart(t, "a", false, l, algorithms.Decision{Wait: 2}),
		newPart(t, "b", false, l, algorithms.Decision{Wait: 5}),
		newPart(t, "c", false, l, algorithms.Decision{Allowed: true, Wait: 9}),
	}
	if got := AdmitWait(parts); got != 5 {
		t.Errorf("AdmitWait = %d, want 5", got)
	}
	parts[1].Zone.DryRun = true
	if got := AdmitWait(parts); got != 2 {
		t.Errorf("AdmitWait, b a dry run = %d, want 2", got)
	}
	parts[0].D.Wait = algorithms.Never
	if got := AdmitWait(parts); got != algorithms.Never {
		t.Errorf("AdmitWait = %d, want Never", got)
	}
}
