package tollgate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/costexpr"
	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// Zone is one rate limit: Events per Window for each distinct resolved Key,
// applied to the requests that match.
type Zone struct {
	// MatcherSetsRaw limits the zone to the requests that match; without
	// it the zone applies to every request the handler sees. Default:
	// every request.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// Key is a template of Caddy placeholders naming who is limited; one
	// limiter state exists per distinct resolved key. A key that resolves to
	// the empty string is one shared identity. Default: "{http.vars.client_ip}"
	// (the Caddyfile's {client_ip}), which honours trusted_proxies.
	Key string `json:"key,omitempty"`

	// Algorithm is one of token_bucket, gcra, sliding_window, sliding_log,
	// fixed_window, leaky_bucket. Default: by how the zone is written:
	// token_bucket in a zone with a burst (its own or a tier's), and in a
	// Caddyfile zone written with rate; otherwise sliding_log, which is
	// mholt/caddy-ratelimit's meaning of events and window (at most events
	// in any window, exactly).
	Algorithm string `json:"algorithm,omitempty"`

	// Events is how many events the zone admits per Window, > 0.
	// Default: none, required with window (or rate).
	Events int64 `json:"events,omitempty"`

	// MaxEvents is mholt/caddy-ratelimit's name for Events, accepted so
	// that its JSON configs load unchanged. Give one or the other.
	// Default: none, give events or max_events.
	MaxEvents int64 `json:"max_events,omitempty"`

	// Window is the duration Events are counted over, > 0. In JSON a
	// number of nanoseconds or a duration string ("1h", "1d"); "1w" is 7
	// days, and "1mo" (and multiples) a calendar month, which only a
	// calendar window (Align) has. Default: none, required with events
	// (or rate).
	Window caddy.Duration `json:"window,omitempty"`

	// Align "calendar" makes a fixed_window's windows calendar periods in
	// Timezone: a window of whole days starts at local midnight, one of
	// whole weeks on Monday, one of months ("1mo") on the 1st; days of 23
	// or 25 hours and months of 28 to 31 days are whole windows. Without
	// it, windows are fixed spans aligned to multiples of the span since
	// the Unix epoch. Default: none.
	Align string `json:"align,omitempty"`

	// Timezone is the IANA time zone of a calendar window, such as
	// "Europe/Berlin". Default: UTC.
	Timezone string `json:"timezone,omitempty"`

	// months is a window of calendar months ("1mo"), which Window cannot
	// hold; 0 for any other window.
	months int64

	// Burst is the bucket capacity of token_bucket, gcra and leaky_bucket,
	// in events. Default: Events.
	Burst int64 `json:"burst,omitempty"`

	// Cost is what one request counts for: a number, a template such as
	// "{http.request.header.X-Request-Weight}", or an expression of
	// numbers and placeholders with + - * /, parentheses, max(...) and
	// min(...), such as
	// "max({http.rate_limit.request.json.max_tokens}, {http.rate_limit.request.json.max_completion_tokens}) * {price_out}".
	// Fractions are allowed. Default: 1.
	Cost Cost `json:"cost,omitempty"`

	// DefaultCost is the cost of a request whose Cost template or
	// expression has no value that is a finite number >= 0. Default: 1.
	DefaultCost *float64 `json:"default_cost,omitempty"`

	// MaxDelay makes a leaky_bucket shape instead of police: a request that
	// does not fit now waits until it fits, up to MaxDelay. Default: 0.
	MaxDelay caddy.Duration `json:"max_delay,omitempty"`

	// IPv4Prefix groups IPv4 keys by network: a key that is an IPv4
	// address is masked to this many bits. Default: 32.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix groups IPv6 keys by network: a key that is an IPv6
	// address is masked to this many bits. Default: 64 (one host usually
	// holds a whole /64, so a longer prefix lets it mint identities).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// OnStorageError decides what happens when the store cannot answer in
	// time: "local" (the default: enforce the zone from this instance's
	// memory until the store answers again; that memory follows the
	// decisions the store made on this instance, so a key goes on from
	// where it stood), "allow" (fail open) or "deny" (503 with
	// Retry-After: 1). Default: local.
	OnStorageError string `json:"on_storage_error,omitempty"`

	// Lease "off" decides every request of the zone by one round trip to
	// a Redis store. "on" (the default) lets each instance decide a key
	// it sees often from a lease: a small share of the key's quota
	// debited on Redis before it is spent, returned when the lease ends
	// (see docs/redis.md). Only token_bucket, gcra, a policing
	// leaky_bucket, fixed_window and sliding_window lease, and only in a
	// zone without count_response or cost_response; the memory store
	// ignores it. Default: on.
	Lease string `json:"lease,omitempty"`

	// DryRun makes the zone record its decisions without rejecting.
	// Default: false.
	DryRun bool `json:"dry_run,omitempty"`

	// Concurrency limits the requests of one key in flight in the zone at
	// once, from admission until the rest of the handler chain returns.
	// Alone (a zone without events and window), or beside the rate, when
	// both must admit a request. Default: 0 (no limit on requests in
	// flight).
	Concurrency int64 `json:"concurrency,omitempty"`

	// ConcurrencyAdaptive makes the zone's in-flight limit per key follow
	// the upstream's latency (Caddyfile: concurrency adaptive): it is
	// recomputed every sample window from the round trips of the requests
	// the zone admitted, between min and max, and a request above it is
	// shed (503 with Retry-After). Its state is in each instance's memory,
	// whatever the storage: each instance adapts on its own. Alone, or
	// beside the rate; not with Concurrency. {} gives every default.
	// Default: none.
	ConcurrencyAdaptive *Adaptive `json:"concurrency_adaptive,omitempty"`

	// ConcurrencyLease is how long a concurrency slot held in Redis lasts
	// unless the instance holding it renews it (every third of it, while
	// the request runs): the slots of an instance that died free within
	// one lease. Default: 30s; at least 1s.
	ConcurrencyLease caddy.Duration `json:"concurrency_lease,omitempty"`

	// Ban refuses every request of a key to the zone for this long once
	// the zone has rejected it BanAfter times within one window.
	// Default: 0 (no ban).
	Ban caddy.Duration `json:"ban,omitempty"`

	// BanAfter is how many rejections within one window start a ban.
	// Default: 1.
	BanAfter int64 `json:"ban_after,omitempty"`

	// TierKey is a template (a header, a user's claim, a value set by
	// Caddy's map directive) whose value chooses the request's limit from
	// Tiers; a value not listed gets the zone's own. Default: none.
	TierKey string `json:"tier_key,omitempty"`

	// Tiers maps a TierKey value to its limit. A key's state is kept per
	// tier. Default: none.
	Tiers map[string]*Tier `json:"tiers,omitempty"`

	// CountResponse makes the zone charge only the requests whose response
	// matches (status codes or classes, headers; Caddy's response
	// matcher, as in reverse_proxy's handle_response): the cost is
	// reserved when the request arrives and given back when the response
	// does not match. Default: none (every admitted request counts).
	CountResponse *caddyhttp.ResponseMatcher `json:"count_response,omitempty"`

	// CostResponse is a template or an expression (as Cost's) whose value,
	// once the response is complete, is the request's actual cost, such as
	// "{http.response.header.X-Usage}", "{http.response.size}" or
	// "{http.rate_limit.response.json.usage.input_tokens} * {price_in} + {http.rate_limit.response.json.usage.output_tokens} * {price_out}": the zone
	// reserves Cost (the estimate) up front and settles to it, giving back
	// the difference or owing the excess past the capacity. A value that
	// is not a number keeps the estimate. Default: none (the cost is
	// Cost).
	CostResponse string `json:"cost_response,omitempty"`
}

// Adaptive is concurrency adaptive's settings: each zero field is its
// default, chosen for a typical HTTP upstream (see docs/reference.md).
type Adaptive struct {
	// Min is the least limit, whatever the latency says. Default: 1.
	Min int64 `json:"min,omitempty"`
	// Max is the greatest limit. Default: 1000.
	Max int64 `json:"max,omitempty"`
	// Initial is the limit before the first window closes, where slow
	// start (doubling a window until a queue shows) begins. Default: 2.
	Initial int64 `json:"initial,omitempty"`
	// Window is a sample window's least length. Default: 1s.
	Window caddy.Duration `json:"window,omitempty"`
	// MinSamples is a sample window's least number of round trips.
	// Default: 20.
	MinSamples int64 `json:"min_samples,omitempty"`
	// Percentile is the round trip of a window taken as recent, in (0, 1).
	// Default: 0.9.
	Percentile float64 `json:"percentile,omitempty"`
	// Tolerance is how far above the baseline recent may go before it is
	// queueing, >= 1. Default: 1.25.
	Tolerance float64 `json:"tolerance,omitempty"`
	// Smoothing is the share of a growth step taken per window, in (0, 1].
	// Default: 0.2.
	Smoothing float64 `json:"smoothing,omitempty"`
	// Epoch is how many windows (give or take a quarter) pass between two
	// re-measurements of the baseline. Default: 30.
	Epoch int64 `json:"epoch,omitempty"`
	// MaxKeys is how many keys get a controller of their own; the keys
	// beyond share one. Default: 10000.
	MaxKeys int `json:"max_keys,omitempty"`
	// Status is the status of a shed request. Default: 503.
	Status int `json:"status,omitempty"`
}

// Cost is a request cost: a number, or a template of placeholders. In JSON
// it is a number or a string.
type Cost string

// UnmarshalJSON accepts a JSON number or string.
func (c *Cost) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*c = Cost(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("cost: want a number or a string, got %s", b)
	}
	*c = Cost(n.String())
	return nil
}

// MarshalJSON writes a constant cost as a number and a template as a string.
func (c Cost) MarshalJSON() ([]byte, error) {
	if _, ok := algorithms.ParseCost(string(c)); ok {
		return []byte(c), nil
	}
	return json.Marshal(string(c))
}

// zone is a provisioned Zone.
type zone struct {
	name     string
	spec     storage.Zone
	matchers caddyhttp.MatcherSets
	key      string // template
	clientIP bool   // key is exactly the client IP: read it without the replacer
	header   string // key is exactly one request header, this one (canonical): read it without the replacer
	v4bits   int
	v6bits   int

	costTemplate *costexpr.Expr // the cost template or expression; nil when the cost is constant
	cost         int64          // constant cost, milli
	defaultCost  int64          // milli

	onError zoneconf.OnError
	// lease: the zone's rate parts may be decided from quota leases (see
	// storage.Zone.Lease): lease on, and no settlement to reach Redis.
	lease bool

	// Zone is what the store runtime knows of this part: its limiter, its
	// memory store or local copy, whether it is a dry run.
	shared.Zone

	// quota is this part's place in the rate-limit headers, built once;
	// a ban has no policy.
	quota ratelimitheader.Quota

	// The {http.rate_limit.limit} value, boxed once (see placeholders).
	limitValue any

	metrics *zoneMetrics       // nil when Caddy's metrics are off
	errLog  shared.LogThrottle // store failures log at most once per shared.LogInterval
	// emptyKey warns once that the zone's key resolved empty (on a base).
	emptyKey emptyKeyWarning

	role  partRole // what this part of its zone limits (see partRole)
	base  *zone    // the zone this is a part of: the one in the handler's zones
	parts []*zone  // on a base: its parts in decision order, itself among them
	ban   *zone    // on a base: its ban part, or nil
	// adaptive, on a base: its concurrency adaptive part (not among its
	// parts: decided in this process before them), or nil; the base
	// itself in a zone of concurrency adaptive alone.
	adaptive *zone
	status   int // on an adaptive part: the status of a request it sheds
	// adaptivePool, on an adaptive part: its key in adaptiveZones.
	adaptivePool string
	all          []*zone // on a base: its parts and its tiers' rate parts

	// Tiers, on a base with a rate: the template, the header it is (see
	// headerKey), and each listed value's rate part (nil: unlimited).
	tierKey    string
	tierHeader string
	tiers      map[string]*zone
	tier       string // on a tier's rate part: its value

	// response, on a base: its count_response and cost_response, or nil.
	response *responseRule
	// requestJSON, on a base: its key, cost, tier_key or cost_response
	// reads the request's JSON body.
	requestJSON bool
}

// validate checks every value of the zone, naming the field and the
// value. It is the one set of zone checks: the Caddyfile adapter runs it on
// each zone it parses (so that `caddy adapt` fails with the file and line
// of the field), and Validate runs it on every zone of a JSON config.
func (zc *Zone) validate() error {
	_, err := zc.settings()
	return err
}

// settings checks the zone's values and returns them parsed, defaults
// applied (see zoneconf.Parse). Its errors start with the field they are
// about.
func (zc *Zone) settings() (zoneconf.Settings, error) {
	c := zoneconf.Zone{
		Key:              zc.Key,
		Algorithm:        zc.Algorithm,
		Events:           zc.Events,
		MaxEvents:        zc.MaxEvents,
		Window:           time.Duration(zc.Window),
		Months:           zc.months,
		Align:            zc.Align,
		Timezone:         zc.Timezone,
		Burst:            zc.Burst,
		Cost:             string(zc.Cost),
		DefaultCost:      zc.DefaultCost,
		MaxDelay:         time.Duration(zc.MaxDelay),
		IPv4Prefix:       zc.IPv4Prefix,
		IPv6Prefix:       zc.IPv6Prefix,
		OnStorageError:   zc.OnStorageError,
		Lease:            zc.Lease,
		Concurrency:      zc.Concurrency,
		ConcurrencyLease: time.Duration(zc.ConcurrencyLease),
		Ban:              time.Duration(zc.Ban),
		BanAfter:         zc.BanAfter,
		TierKey:          zc.TierKey,
		CountResponse:    zc.CountResponse != nil,
		CostResponse:     zc.CostResponse,
	}
	if m := zc.CountResponse; m != nil {
		c.CountStatus, c.CountHeaders = m.StatusCode, m.Headers != nil
	}
	if a := zc.ConcurrencyAdaptive; a != nil {
		c.Adaptive = &zoneconf.Adaptive{Min: a.Min, Max: a.Max, Initial: a.Initial, Window: time.Duration(a.Window),
			MinSamples: a.MinSamples, Percentile: a.Percentile, Tolerance: a.Tolerance, Smoothing: a.Smoothing,
			Epoch: a.Epoch, MaxKeys: a.MaxKeys, Status: a.Status}
	}
	if zc.Tiers != nil {
		c.Tiers = make(map[string]*zoneconf.Tier, len(zc.Tiers))
		for value, t := range zc.Tiers {
			if t == nil {
				c.Tiers[value] = nil
				continue
			}
			c.Tiers[value] = &zoneconf.Tier{Events: t.Events, Window: time.Duration(t.Window), Months: t.months, Burst: t.Burst, Unlimited: t.Unlimited}
		}
	}
	return zoneconf.Parse(c)
}

// provisionZone builds a zone that Validate has checked: its parts, each
// with its limiter.
func (h *Handler) provisionZone(ctx caddy.Context, name string, zc *Zone) (*zone, error) {
	s, err := zc.settings()
	if err != nil {
		return nil, err
	}
	if (s.Ban != nil || s.Slots != nil) && !h.memory && h.redis == nil {
		return nil, fmt.Errorf("concurrency and ban: need storage memory or redis, which decide them with the rate as one step")
	}
	common := &zone{
		name:         name,
		key:          s.Key,
		clientIP:     s.Key == zoneconf.DefaultKey,
		header:       headerKey(s.Key),
		v4bits:       s.V4Bits,
		v6bits:       s.V6Bits,
		costTemplate: s.CostExpr,
		cost:         s.Cost,
		defaultCost:  s.DefaultCost,
		onError:      s.OnError,
		lease:        s.Lease && s.Response == nil,
		Zone:         shared.Zone{DryRun: zc.DryRun},
	}
	if zc.MatcherSetsRaw != nil {
		mods, err := ctx.LoadModule(zc, "MatcherSetsRaw")
		if err != nil {
			return nil, fmt.Errorf("loading matchers: %w", err)
		}
		if err := common.matchers.FromInterface(mods); err != nil {
			return nil, fmt.Errorf("match: %w", err)
		}
	}

	if !s.Rate && s.Slots == nil {
		// concurrency adaptive alone: the zone is its adaptive part.
		z, err := h.openAdaptive(common, s.Adaptive)
		if err != nil {
			return nil, err
		}
		z.adaptive, z.all = z, []*zone{z}
		return z, nil
	}
	role := roleRate
	if !s.Rate {
		role = roleSlots
	}
	z, err := h.openPart(common, role, s.Limit, name)
	if err != nil {
		return nil, err
	}
	if s.Ban != nil {
		if z.ban, err = h.openPart(z, roleBan, *s.Ban, name); err != nil {
			return nil, fmt.Errorf("ban: %w", err)
		}
		z.parts = append(z.parts, z.ban)
	}
	z.parts = append(z.parts, z)
	if s.Rate && s.Slots != nil {
		slots, err := h.openPart(z, roleSlots, *s.Slots, name)
		if err != nil {
			return nil, fmt.Errorf("concurrency: %w", err)
		}
		// Its own item in the RateLimit headers, beside the rate's; no
		// zone name has a '/'.
		slots.quota.Name = name + "/concurrency"
		slots.quota.Policy = ratelimitheader.PolicyItem(slots.quota.Name, *s.Slots)
		z.parts = append(z.parts, slots)
	}
	z.all = append(z.all, z.parts...)
	if s.Adaptive != nil {
		if z.adaptive, err = h.openAdaptive(z, s.Adaptive); err != nil {
			return nil, err
		}
		z.all = append(z.all, z.adaptive)
	}
	if r := s.Response; r != nil {
		z.response = &responseRule{match: zc.CountResponse, cost: r.Cost, json: r.JSON, headers: r.Headers}
	}
	z.requestJSON = s.ReadsRequest
	if err := h.checkSettlers(z); err != nil {
		return nil, err
	}
	if s.Tiers != nil {
		if err := h.provisionTiers(z, zc.TierKey, s.Tiers); err != nil {
			return nil, err
		}
	}
	for _, p := range z.all {
		p.Settles = z.response != nil
		p.Delays = zc.MaxDelay > 0 && !zc.DryRun
	}
	if len(z.parts) > 1 && s.Rate {
		for _, rate := range z.all {
			if rate == z || rate.tier != "" {
				rate.quota.ZonePolicy = z.policyWith(rate)
			}
		}
	}
	return z, nil
}

// policyWith is the RateLimit-Policy of z's parts with rate (the zone's
// rate part or a tier's) as the rate.
func (z *zone) policyWith(rate *zone) string {
	var items []string
	for _, p := range z.parts {
		if p == z {
			p = rate
		}
		if p.quota.Policy != "" {
			items = append(items, p.quota.Policy)
		}
	}
	return strings.Join(items, ", ")
}

// release closes what the zone's parts opened.
func (z *zone) release() {
	for _, p := range z.all {
		if c, ok := p.Limiter.(interface{ Close() }); ok {
			c.Close()
		}
		if p.adaptivePool != "" {
			_, _ = adaptiveZones.Delete(p.adaptivePool)
		}
	}
}

// sweep forgets fresh keys in the memory stores of the zone's parts.
func (z *zone) sweep(now int64) {
	for _, p := range z.all {
		if s, ok := p.Limiter.(interface{ Sweep(int64) int }); ok {
			s.Sweep(now)
		}
		if p.Local != nil {
			p.Local.Sweep(now)
		}
	}
}

// resolveKey returns the zone's key for the request, masked to the zone's
// IP prefixes when it is an IP address, and bounded in size.
func (z *zone) resolveKey(r *http.Request, repl *caddy.Replacer) string {
	var key string
	switch {
	case z.clientIP:
		key, _ = caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	case z.header != "":
		// What the replacer makes of {http.request.header.<name>}, without
		// scanning the template or allocating for a header given once.
		key = strings.Join(r.Header[z.header], ",")
	default:
		key = repl.ReplaceAll(z.key, "")
	}
	return z.storedKey(key)
}

// headerKey returns the canonical name of the request header a key
// template is exactly, such as "{http.request.header.X-API-Key}" (the
// Caddyfile's {header.X-API-Key}), or "".
func headerKey(template string) string {
	name, ok := strings.CutPrefix(template, "{http.request.header.")
	if !ok {
		return ""
	}
	name, ok = strings.CutSuffix(name, "}")
	if !ok || name == "" || strings.ContainsAny(name, "{}:") {
		return "" // not one placeholder, or one with a default value
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

// storedKey is the key the zone stores for a resolved key (see
// storage.StoredKey). The handler and the admin API share it.
func (z *zone) storedKey(key string) string {
	return storage.StoredKey(key, z.v4bits, z.v6bits)
}

// resolveCost returns the request's cost in milli-units.
func (z *zone) resolveCost(repl *caddy.Replacer) int64 {
	if z.costTemplate == nil {
		return z.cost
	}
	if f, ok := z.costTemplate.Eval(repl.Get); ok {
		if m, ok := algorithms.CostMilli(f); ok {
			return m
		}
	}
	return z.defaultCost
}
