package zoneconf

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

func TestParseDefaults(t *testing.T) {
	s, err := Parse(Zone{Events: 10, Window: time.Minute})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !s.Rate || s.Limit.Kind != algorithms.SlidingLog || s.Limit.Events != 10 {
		t.Errorf("rate %v, limit %v %d, want a sliding_log of 10", s.Rate, s.Limit.Kind, s.Limit.Events)
	}
	if s.Key != DefaultKey || s.V4Bits != 32 || s.V6Bits != DefaultIPv6Prefix {
		t.Errorf("key %q, prefixes /%d /%d, want %q, /32 /%d", s.Key, s.V4Bits, s.V6Bits, DefaultKey, DefaultIPv6Prefix)
	}
	if s.Cost != algorithms.Milli || s.DefaultCost != algorithms.Milli || s.CostExpr != nil {
		t.Errorf("cost %d, default %d, expression %v, want 1 event each and no expression", s.Cost, s.DefaultCost, s.CostExpr)
	}
	if s.OnError != FailLocal || s.Slots != nil || s.Ban != nil || s.Tiers != nil || s.Response != nil {
		t.Errorf("got %+v, want on_storage_error local and no guards, tiers or response", s)
	}
	if !s.Lease {
		t.Error("lease off by default, want on")
	}
}

func TestParseParts(t *testing.T) {
	s, err := Parse(Zone{
		Events: 5, Window: time.Hour, Burst: 8, Concurrency: 2, Ban: time.Minute,
		TierKey: "{http.request.header.Plan}",
		Tiers:   map[string]*Tier{"pro": {Events: 50, Window: time.Hour}, "free": {Unlimited: true}},
		Cost:    "{http.rate_limit.request.json.usage.tokens}", CountResponse: true, CountStatus: []int{4},
	})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if s.Limit.Kind != algorithms.TokenBucket {
		t.Errorf("algorithm %v, want token_bucket beside a burst", s.Limit.Kind)
	}
	if s.Slots == nil || s.Slots.Events != 2 || s.Ban == nil {
		t.Errorf("slots %v, ban %v, want 2 slots and a ban", s.Slots, s.Ban)
	}
	if pro, free, ok := s.Tiers["pro"], s.Tiers["free"], len(s.Tiers) == 2; !ok || pro == nil || pro.Events != 50 || pro.Kind != algorithms.TokenBucket || free != nil {
		t.Errorf("tiers %v, want pro a token_bucket of 50 and free unlimited (nil)", s.Tiers)
	}
	if len(s.RequestJSON) != 1 || s.RequestJSON[0] != "usage.tokens" {
		t.Errorf("request JSON paths %q, want [usage.tokens]", s.RequestJSON)
	}
	if s.Response == nil || s.Response.Headers || s.Response.Cost != nil {
		t.Errorf("response %+v, want a status match that reads no header", s.Response)
	}
}

// TestReadsRequest: a zone reads the request's JSON body when its key,
// cost, tier_key or cost_response names a request placeholder.
func TestReadsRequest(t *testing.T) {
	for _, c := range []struct {
		zone Zone
		want bool
	}{
		{Zone{Events: 5, Window: time.Hour}, false},
		{Zone{Events: 5, Window: time.Hour, Cost: "{http.request.header.W}"}, false},
		{Zone{Events: 5, Window: time.Hour, Cost: "{http.rate_limit.request.size} / 4"}, true},
		{Zone{Events: 5, Window: time.Hour, Key: "{http.rate_limit.request.json.model}"}, true},
		{Zone{Events: 5, Window: time.Hour, TierKey: "{http.rate_limit.request.json.model}", Tiers: map[string]*Tier{"m": {Events: 1, Window: time.Hour}}}, true},
		{Zone{Algorithm: "token_bucket", Events: 5, Window: time.Hour, CostResponse: "{http.rate_limit.response.json.usage.n} * {http.rate_limit.request.json.n}"}, true},
	} {
		s, err := Parse(c.zone)
		if err != nil {
			t.Fatalf("Parse(%+v): %v", c.zone, err)
		}
		if s.ReadsRequest != c.want {
			t.Errorf("Parse(%+v): reads the request %v, want %v", c.zone, s.ReadsRequest, c.want)
		}
	}
}

func TestParseCalendar(t *testing.T) {
	s, err := Parse(Zone{Algorithm: "fixed_window", Events: 3, Months: 1, Align: AlignCalendar, Timezone: "Europe/Berlin",
		Tiers: map[string]*Tier{"gold": {Events: 9, Window: 7 * 24 * time.Hour}}, TierKey: "{http.vars.plan}"})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if s.Loc == nil || s.Loc.String() != "Europe/Berlin" || s.Limit.Calendar.Unit != algorithms.Month {
		t.Errorf("loc %v, unit %v, want a month in Europe/Berlin", s.Loc, s.Limit.Calendar.Unit)
	}
	if g := s.Tiers["gold"]; g == nil || g.Calendar.Unit != algorithms.Week || g.Calendar.Loc != s.Loc {
		t.Errorf("tier gold %v, want a calendar week in the zone's time zone", g)
	}
}

func TestParseErrors(t *testing.T) {
	one := 1.5
	for _, c := range []struct {
		name string
		zone Zone
		want string // the error's start: the field and the value
	}{
		{"no rate", Zone{}, "events and window are required"},
		{"both events", Zone{Events: 1, MaxEvents: 2, Window: time.Second}, "events and max_events: give one or the other"},
		{"max_events named", Zone{MaxEvents: -1, Window: time.Second}, "max_events: "},
		{"algorithm", Zone{Algorithm: "nope", Events: 1, Window: time.Second}, "algorithm: "},
		{"lease alone", Zone{Events: 1, Window: time.Second, ConcurrencyLease: time.Second}, "concurrency_lease: only with concurrency, got concurrency_lease 1s"},
		{"burst without rate", Zone{Concurrency: 1, Burst: 3}, "burst: belongs to a rate, and the zone has only concurrency (no events and window); got burst 3"},
		{"default_cost without rate", Zone{Concurrency: 1, DefaultCost: &one}, "default_cost: belongs to a rate, and the zone has only concurrency (no events and window); got default_cost 1.5"},
		{"ban without rate", Zone{Concurrency: 1, Ban: time.Minute}, "ban: a ban counts the zone's rejections within its window, so it needs a rate (events and window); got ban 1m0s"},
		{"ipv6_prefix", Zone{Events: 1, Window: time.Second, IPv6Prefix: 129}, "ipv6_prefix: must be in [0, 128], got 129"},
		{"cost above", Zone{Events: 2, Window: time.Second, Cost: " 3 "}, "cost: 3 is above the zone's capacity of 2 events (events)"},
		{"tier cost above", Zone{Events: 5, Window: time.Second, Burst: 5, Cost: "3", TierKey: "{x}", Tiers: map[string]*Tier{"a": {Events: 2, Window: time.Second}}}, `tiers "a": cost: 3 is above the tier's capacity of 2 events (burst)`},
		{"tier nil", Zone{Events: 5, Window: time.Second, TierKey: "{x}", Tiers: map[string]*Tier{"a": nil}}, `tiers "a": a tier needs events and window`},
		{"tier months", Zone{Events: 5, Window: time.Second, TierKey: "{x}", Tiers: map[string]*Tier{"a": {Events: 1, Months: 1}}}, `tiers "a": window: 1mo has no fixed length`},
		{"tiers alone", Zone{Events: 5, Window: time.Second, TierKey: "{x}"}, `tier_key: needs tiers, the limit of each value; got tier_key "{x}" alone`},
		{"months", Zone{Events: 1, Months: 1}, "window: 1mo has no fixed length: a window of months needs align calendar"},
		{"calendar hours", Zone{Algorithm: "fixed_window", Events: 1, Window: time.Hour, Align: AlignCalendar}, "window: align calendar needs whole days, weeks or months (1d, 1w, 1mo and multiples), got 1h0m0s"},
		{"timezone", Zone{Algorithm: "fixed_window", Events: 1, Window: 24 * time.Hour, Align: AlignCalendar, Timezone: "Mars/Base"}, `timezone: unknown time zone "Mars/Base"`},
		{"count_response empty", Zone{Events: 1, Window: time.Second, CountResponse: true}, "count_response: give a status or a header to match"},
		{"count_response status", Zone{Events: 1, Window: time.Second, CountResponse: true, CountStatus: []int{600}}, "count_response: status 600 is neither a class"},
		{"cost_response", Zone{Events: 1, Window: time.Second, CostResponse: "5"}, `cost_response: must be a placeholder template such as {http.response.header.X-Usage}, got "5"`},
		{"cost_response path", Zone{Algorithm: "fixed_window", Events: 1, Window: time.Second, CostResponse: "{http.rate_limit.response.json.a..b}"}, "cost_response: {http.rate_limit.response.json.a..b}: a dotted path of names"},
		{"on_storage_error", Zone{Events: 1, Window: time.Second, OnStorageError: "maybe"}, `on_storage_error: must be allow, deny or local, got "maybe"`},
		{"lease", Zone{Events: 1, Window: time.Second, Lease: "maybe"}, `lease: must be on or off, got "maybe"`},
	} {
		_, err := Parse(c.zone)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: Parse = %v, want an error starting %q", c.name, err, c.want)
		}
	}
}

func TestOrder(t *testing.T) {
	zones := map[string]int{"c": 0, "a": 0, "b": 0, "d": 0}
	got, err := Order([]string{"d", "b"}, zones)
	if want := "d b a c"; err != nil || strings.Join(got, " ") != want {
		t.Errorf("Order = %q, %v, want %q", got, err, want)
	}
	for _, c := range []struct {
		order []string
		want  string
	}{
		{[]string{"x"}, `zone_order: "x" is not a zone in rate_limits`},
		{[]string{"a", "a"}, `zone_order: "a" given twice`},
	} {
		if _, err := Order(c.order, zones); err == nil || err.Error() != c.want {
			t.Errorf("Order(%q) = %v, want %q", c.order, err, c.want)
		}
	}
}

func TestValidName(t *testing.T) {
	for name, ok := range map[string]bool{"api_v1.eu-west": true, "": false, "a/b": false, "a b": false, strings.Repeat("x", 65): false} {
		if err := ValidName(name); (err == nil) != ok {
			t.Errorf("ValidName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}
