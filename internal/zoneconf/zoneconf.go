// Package zoneconf checks a zone's configuration and parses it into the
// limits its parts decide. It takes plain values (the root package copies
// them from its JSON types, Zone and Tier) and knows no Caddy: every check
// of a zone is here, in one place, and each error starts with the field it
// is about and names the value it refused.
package zoneconf

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/costexpr"
)

// Zone is a zone's options, as the config gives them: the root package's
// Zone with Caddy's types (durations, the response matcher) made plain.
// A zero field is an option not given.
type Zone struct {
	Key       string
	Algorithm string
	Events    int64
	MaxEvents int64
	Window    time.Duration
	Months    int64 // a window of calendar months ("1mo"); 0 for any other
	Align     string
	Timezone  string
	Burst     int64
	Cost      string
	// DefaultCost is nil when default_cost is not given.
	DefaultCost *float64
	MaxDelay    time.Duration
	IPv4Prefix  int
	IPv6Prefix  int

	OnStorageError string
	Lease          string

	Concurrency      int64
	ConcurrencyLease time.Duration
	// Adaptive is concurrency adaptive's settings, nil without it.
	Adaptive *Adaptive
	Ban      time.Duration
	BanAfter int64

	TierKey string
	Tiers   map[string]*Tier // a nil tier is a tier given without a limit

	// CountResponse is whether count_response is given, CountStatus its
	// status codes or classes, CountHeaders whether it matches headers.
	CountResponse bool
	CountStatus   []int
	CountHeaders  bool
	CostResponse  string
}

// Tier is one tier's options.
type Tier struct {
	Events    int64
	Window    time.Duration
	Months    int64
	Burst     int64
	Unlimited bool
}

// Settings are a zone's options, checked and parsed, defaults applied.
type Settings struct {
	Rate           bool             // the zone has a rate (events and window)
	Limit          algorithms.Limit // the rate, or the slots of a zone of concurrency alone
	Loc            *time.Location   // a calendar window's time zone, else nil
	Slots          *algorithms.Limit
	Adaptive       *AdaptiveSettings // concurrency adaptive, or nil
	Ban            *algorithms.Limit
	Tiers          map[string]*algorithms.Limit // each listed value's limit, nil for an unlimited one
	Key            string
	V4Bits, V6Bits int
	CostExpr       *costexpr.Expr // the cost when it reads placeholders, else nil
	Cost           int64          // constant cost, milli
	DefaultCost    int64          // milli
	OnError        OnError
	Lease          bool      // quota leases allowed (lease on), where the algorithm and the response options allow
	Response       *Response // count_response, cost_response; nil without them
	// RequestJSON are the paths of the {http.rate_limit.request.json.*}
	// placeholders in key, cost, tier_key and cost_response: a request the
	// zone applies to has its JSON body read.
	RequestJSON []string
	// ReadsRequest: a request the zone applies to has its JSON body read
	// (a {http.rate_limit.request.json.*} or {http.rate_limit.request.size}
	// placeholder in those fields).
	ReadsRequest bool
}

// OnError is what a zone does when its store cannot answer in time
// (on_storage_error).
type OnError int

// on_storage_error's modes.
const (
	FailAllow OnError = iota
	FailDeny
	FailLocal
)

// DefaultKey is key when it is not set: the Caddyfile's {client_ip}.
const DefaultKey = "{http.vars.client_ip}"

// DefaultIPv6Prefix is ipv6_prefix when it is not set.
const DefaultIPv6Prefix = 64

// DefaultLease is concurrency_lease when it is not set.
const DefaultLease = 30 * time.Second

// algorithm is the zone's algorithm: as written, else token_bucket beside a
// burst (a bucket's capacity), else sliding_log (the Caddyfile adapter
// writes token_bucket for a zone written with rate).
func (zc *Zone) algorithm() string {
	if zc.Algorithm != "" {
		return zc.Algorithm
	}
	if zc.Burst != 0 {
		return algorithms.TokenBucket.String()
	}
	for _, t := range zc.Tiers {
		if t != nil && t.Burst != 0 {
			return algorithms.TokenBucket.String()
		}
	}
	return algorithms.SlidingLog.String()
}

// Parse checks the zone's values and returns them parsed, defaults
// applied. Its errors start with the field they are about.
func Parse(zc Zone) (Settings, error) {
	var s Settings
	kind, err := algorithms.ParseKind(zc.algorithm())
	if err != nil {
		return s, fmt.Errorf("algorithm: %w", err)
	}
	events, eventsField := zc.Events, "events"
	if zc.MaxEvents != 0 {
		if zc.Events != 0 {
			return s, fmt.Errorf("events and max_events: give one or the other (max_events is mholt/caddy-ratelimit's name for events), got %d and %d", zc.Events, zc.MaxEvents)
		}
		events, eventsField = zc.MaxEvents, "max_events"
	}
	if err := zc.guards(&s); err != nil {
		return s, err
	}
	s.Rate = events != 0 || zc.Window != 0 || zc.Months != 0
	loc, err := zc.location(kind)
	if err != nil {
		return s, err
	}
	s.Loc = loc
	if !s.Rate && s.Slots == nil && s.Adaptive == nil {
		return s, fmt.Errorf("events and window are required (or rate), unless the zone has only concurrency")
	}
	if !s.Rate {
		if err := zc.rateOnly(); err != nil {
			return s, err
		}
		if s.Slots != nil {
			s.Limit = *s.Slots
		}
	} else {
		if loc != nil {
			s.Limit, err = calendarLimit(events, zc.Window, zc.Months, loc)
		} else {
			s.Limit, err = algorithms.NewLimit(kind, events, zc.Window, zc.Burst, zc.MaxDelay)
			if err != nil && zc.Algorithm == "" && kind == algorithms.SlidingLog && events > algorithms.MaxLogEvents {
				err = fmt.Errorf("events: a zone with events and window and no algorithm is a sliding_log (at most events in any window, exactly), which keeps a time per event and allows at most %d, got %d; set algorithm sliding_window (two counters per key) or token_bucket, or write rate",
					algorithms.MaxLogEvents, events)
			}
		}
		if err != nil {
			if rest, ok := strings.CutPrefix(err.Error(), "events: "); ok && eventsField != "events" {
				err = fmt.Errorf("%s: %s", eventsField, rest)
			}
			return s, err
		}
	}
	if err := zc.ban(&s); err != nil {
		return s, err
	}
	if err := zc.keys(&s); err != nil {
		return s, err
	}
	if err := zc.costs(&s); err != nil {
		return s, err
	}
	if s.Tiers, err = zc.tierLimits(&s); err != nil {
		return s, err
	}
	if err := zc.response(&s); err != nil {
		return s, err
	}
	if err := zc.requestJSON(&s); err != nil {
		return s, err
	}

	switch zc.Lease {
	case "", "on":
		s.Lease = true
	case "off":
	default:
		return s, fmt.Errorf("lease: must be on or off, got %q", zc.Lease)
	}

	switch zc.OnStorageError {
	case "allow":
		s.OnError = FailAllow
	case "deny":
		s.OnError = FailDeny
	case "", "local":
		s.OnError = FailLocal
	default:
		return s, fmt.Errorf("on_storage_error: must be allow, deny or local, got %q", zc.OnStorageError)
	}
	return s, nil
}

// keys checks and parses the zone's key and IP prefixes into s.
func (zc *Zone) keys(s *Settings) error {
	s.Key = zc.Key
	if s.Key == "" {
		s.Key = DefaultKey
	}
	if zc.IPv4Prefix < 0 || zc.IPv4Prefix > 32 {
		return fmt.Errorf("ipv4_prefix: must be in [0, 32], got %d", zc.IPv4Prefix)
	}
	if zc.IPv6Prefix < 0 || zc.IPv6Prefix > 128 {
		return fmt.Errorf("ipv6_prefix: must be in [0, 128], got %d", zc.IPv6Prefix)
	}
	s.V4Bits, s.V6Bits = zc.IPv4Prefix, zc.IPv6Prefix
	if s.V4Bits == 0 {
		s.V4Bits = 32
	}
	if s.V6Bits == 0 {
		s.V6Bits = DefaultIPv6Prefix
	}
	return nil
}

// requestJSON checks the request-body placeholders of every field that
// may name one, and notes their paths in s.
func (zc *Zone) requestJSON(s *Settings) error {
	for _, f := range [...]struct{ name, value string }{
		{"key", zc.Key}, {"cost", zc.Cost}, {"tier_key", zc.TierKey}, {"cost_response", zc.CostResponse},
	} {
		paths, err := JSONPaths(f.value, RequestJSONPrefix)
		if err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		s.RequestJSON = append(s.RequestJSON, paths...)
		s.ReadsRequest = s.ReadsRequest || len(paths) > 0 || strings.Contains(f.value, "{"+RequestSize+"}")
	}
	return nil
}

// costs checks and parses the zone's cost and default_cost into s, and
// checks that they fit the zone's rate.
func (zc *Zone) costs(s *Settings) error {
	s.DefaultCost = algorithms.Milli
	if zc.DefaultCost != nil {
		m, ok := algorithms.CostMilli(*zc.DefaultCost)
		if !ok {
			return fmt.Errorf("default_cost: must be a finite number >= 0, got %v", *zc.DefaultCost)
		}
		s.DefaultCost = m
	}
	switch c := strings.TrimSpace(zc.Cost); {
	case c == "":
		s.Cost = algorithms.Milli
	case strings.Contains(c, "{"):
		e, err := costexpr.Compile(c)
		if err != nil {
			return fmt.Errorf("cost: %w", err)
		}
		s.CostExpr = e
	default:
		m, ok := algorithms.ParseCost(c)
		if !ok && strings.ContainsAny(c, "+-*/()") {
			// A constant expression ("1000 * 4"): its value. Anything
			// else ("-1") gets the error below.
			if e, err := costexpr.Compile(c); err == nil {
				f, isConst := e.Constant()
				if m, ok = algorithms.CostMilli(f); !ok || !isConst {
					return fmt.Errorf("cost: %q is not a finite number >= 0", zc.Cost)
				}
			}
		}
		if !ok {
			return fmt.Errorf("cost: must be a finite number >= 0, a placeholder template or an expression, got %q", zc.Cost)
		}
		s.Cost = m
	}
	if s.Rate { // a zone of concurrency alone counts requests, not costs
		return zc.costFits(s, s.Limit, "zone")
	}
	return nil
}
