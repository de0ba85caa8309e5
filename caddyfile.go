package tollgate

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rate_limit [<matcher>] {
//		zone <name> {
//			match {             # several: any of them
//				<matchers>
//			}
//			key          <template>
//			algorithm    token_bucket|gcra|sliding_window|sliding_log|fixed_window|leaky_bucket
//			events       <n>
//			window       <duration>          # also 1w (7 days), and 1mo (a calendar month) with align calendar
//			align        calendar            # fixed_window: windows are days, weeks (from Monday), months (from the 1st)
//			timezone     <IANA name>         # of a calendar window; default UTC
//			rate         <n>/<unit>          # shorthand for events + window: 10/s, 600/m, 5000/h, 100/10s, 10000/d, 1000000/mo
//			burst        <n>
//			cost         <number|template|expression>
//			default_cost <number>
//			max_delay    <duration>
//			ipv4_prefix  <bits>
//			ipv6_prefix  <bits>
//			on_storage_error allow|deny|local
//			dry_run
//			concurrency  <n>                 # requests of one key in flight at once
//			concurrency  adaptive [{ ... }]  # an in-flight limit that follows the upstream's latency (docs/reference.md)
//			concurrency_lease <duration>     # Redis: a dead instance's slots free within this; default 30s
//			lease        on|off              # Redis: decide hot keys from quota leases; default on
//			ban          <duration>          # refuse a key this long once the zone rejected it ban_after times in a window
//			ban_after    <n>                 # default 1
//			tier <template> {                # the limit per value of template; others get the zone's
//				<value> <rate> [burst <n>] | unlimited
//			}
//		}
//		storage memory|redis [{ ... }]
//		headers ietf|ietf-draft-03|x-ratelimit|none ...
//		status  <code>
//		jitter  <fraction>
//		max_keys <n>
//		sweep_interval <duration>
//		log_key
//		disable_metrics
//	}
//
// An option given twice is an error, but for match. Every value is checked here, by the
// same checks as a JSON config's (Zone.validate and Validate), so that an
// error names the file and line of the field and its value.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	directive := d.Token()
	if d.NextArg() {
		return d.ArgErr()
	}
	at := map[string]caddyfile.Token{} // where each option is written
	for d.NextBlock(0) {
		opt := d.Val()
		if opt != "zone" {
			if _, seen := at[opt]; seen {
				return d.Errf("option '%s' given twice", opt)
			}
			at[opt] = d.Token()
		}
		switch opt {
		case "zone":
			if err := h.unmarshalZone(d); err != nil {
				return err
			}
		case "storage":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			if err := storageModuleError(name); err != nil {
				return d.WrapErr(err)
			}
			unm, err := caddyfile.UnmarshalModule(d, storageNamespace+"."+name)
			if err != nil {
				return err
			}
			h.StorageRaw = caddyconfig.JSONModuleObject(unm, "module", name, nil)
		case "headers":
			h.Headers = d.RemainingArgs()
			if len(h.Headers) == 0 {
				return d.ArgErr()
			}
		case "status":
			v, err := intArg(d)
			if err != nil {
				return err
			}
			h.Status = int(v)
		case "jitter":
			v, err := floatArg(d)
			if err != nil {
				return err
			}
			h.Jitter = v
		case "max_keys":
			v, err := intArg(d)
			if err != nil {
				return err
			}
			h.MaxKeys = int(v)
		case "sweep_interval":
			v, err := durationArg(d)
			if err != nil {
				return err
			}
			h.SweepInterval = v
		case "log_key":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.LogKey = true
		case "disable_metrics":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.DisableMetrics = true
		case "distributed":
			return d.WrapErr(errDistributed)
		default:
			return d.Errf("unrecognized subdirective '%s'", opt)
		}
	}
	if err := h.Validate(); err != nil {
		return errAt(tokenFor(err, at, directive), err)
	}
	return nil
}

func (h *Handler) unmarshalZone(d *caddyfile.Dispenser) error {
	zoneTok := d.Token()
	if !d.NextArg() {
		return d.ArgErr()
	}
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if err := zoneconf.ValidName(name); err != nil {
		return d.Err(err.Error())
	}
	if _, dup := h.RateLimits[name]; dup {
		return d.Errf("zone '%s' defined twice", name)
	}
	z := new(Zone)
	at := map[string]caddyfile.Token{} // where each option is written
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		// match may be given several times: the zone applies to a
		// request that any of them matches (as in mholt/caddy-ratelimit).
		if _, seen := at[opt]; seen && opt != "match" {
			return d.Errf("zone '%s': option '%s' given twice", name, opt)
		}
		at[opt] = d.Token()
		var err error
		switch opt {
		case "match":
			var set caddy.ModuleMap
			if set, err = caddyhttp.ParseCaddyfileNestedMatcherSet(d); err == nil {
				z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
			}
		case "key":
			z.Key, err = stringArg(d)
		case "algorithm":
			z.Algorithm, err = stringArg(d)
		case "events":
			z.Events, err = intArg(d)
		case "window":
			var s string
			if s, err = stringArg(d); err == nil {
				var window time.Duration
				window, z.months, err = parseWindow(s)
				z.Window = caddy.Duration(window)
				if err != nil {
					err = d.Errf("zone '%s': window: %v", name, err)
				}
			}
		case "align":
			z.Align, err = stringArg(d)
		case "timezone":
			z.Timezone, err = stringArg(d)
		case "rate":
			var s string
			if s, err = stringArg(d); err == nil {
				var window time.Duration
				z.Events, window, z.months, err = parseRate(s)
				z.Window = caddy.Duration(window)
				if err != nil {
					err = d.Errf("zone '%s': rate: %v", name, err)
				}
			}
		case "burst":
			z.Burst, err = intArg(d)
		case "cost":
			var s string
			s, err = stringArg(d)
			z.Cost = Cost(s)
		case "default_cost":
			var v float64
			if v, err = floatArg(d); err == nil {
				z.DefaultCost = &v
			}
		case "max_delay":
			z.MaxDelay, err = durationArg(d)
		case "ipv4_prefix":
			var v int64
			v, err = intArg(d)
			z.IPv4Prefix = int(v)
		case "ipv6_prefix":
			var v int64
			v, err = intArg(d)
			z.IPv6Prefix = int(v)
		case "on_storage_error":
			z.OnStorageError, err = stringArg(d)
		case "lease":
			z.Lease, err = stringArg(d)
		case "dry_run":
			if d.NextArg() {
				return d.ArgErr()
			}
			z.DryRun = true
		case "concurrency":
			if d.NextArg() && d.Val() == "adaptive" {
				at["concurrency adaptive"] = d.Token()
				z.ConcurrencyAdaptive, err = unmarshalAdaptive(d, name)
				break
			}
			d.Prev()
			if z.Concurrency, err = intArg(d); err == nil && z.Concurrency <= 0 {
				// 0 would read as no concurrency at all.
				err = d.Errf("zone '%s': concurrency: must be greater than 0, got %d", name, z.Concurrency)
			}
		case "concurrency_lease":
			z.ConcurrencyLease, err = durationArg(d)
		case "ban":
			z.Ban, err = durationArg(d)
		case "ban_after":
			z.BanAfter, err = intArg(d)
		case "tier":
			err = unmarshalTiers(d, name, z, at)
		case "count_response":
			z.CountResponse, err = unmarshalCountResponse(d)
		case "cost_response":
			z.CostResponse, err = stringArg(d)
		default:
			return d.Errf("zone '%s': unrecognized subdirective '%s'", name, opt)
		}
		if err != nil {
			return err
		}
	}
	_, rate := at["rate"]
	_, events := at["events"]
	_, window := at["window"]
	if rate && (events || window) {
		return errAt(at["rate"], fmt.Errorf("zone '%s': rate is shorthand for events and window; give one or the other", name))
	}
	_, slots := at["concurrency"]
	if !rate && (!events || !window) && (events || window || !slots) {
		return errAt(zoneTok, fmt.Errorf("zone '%s': a zone requires both events and window (or rate), unless it has only concurrency", name))
	}
	if rate {
		at["events"], at["window"] = at["rate"], at["rate"]
		if z.Algorithm == "" { // a rate reads as a refill rate: a bucket
			z.Algorithm = "token_bucket"
		}
	}
	if tok, ok := at["tier"]; ok {
		at["tiers"], at["tier_key"] = tok, tok
	}
	if err := z.validate(); err != nil {
		return errAt(tokenFor(err, at, zoneTok), fmt.Errorf("zone '%s': %w", name, err))
	}
	if h.RateLimits == nil {
		h.RateLimits = make(map[string]*Zone)
	}
	h.RateLimits[name] = z
	if len(h.RateLimits) > 1 || len(h.ZoneOrder) > 0 {
		if len(h.ZoneOrder) == 0 {
			for n := range h.RateLimits {
				if n != name {
					h.ZoneOrder = append(h.ZoneOrder, n)
				}
			}
		}
		h.ZoneOrder = append(h.ZoneOrder, name)
	}
	return nil
}

// unmarshalTiers parses `tier <template> { <value> <rate> [burst <n>] |
// unlimited ... }`, noting where each value is written in at (as `tiers
// "<value>"`, the start of its errors).
func unmarshalTiers(d *caddyfile.Dispenser, name string, z *Zone, at map[string]caddyfile.Token) error {
	tmpl, err := stringArg(d)
	if err != nil {
		return err
	}
	z.TierKey = tmpl
	z.Tiers = map[string]*Tier{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		value := d.Val()
		if _, dup := z.Tiers[value]; dup {
			return d.Errf("zone '%s': tier value '%s' given twice", name, value)
		}
		at[fmt.Sprintf("tiers %q", value)] = d.Token()
		t, err := parseTier(d.RemainingArgs())
		if err != nil {
			return d.Errf("zone '%s': tiers %q: %v", name, value, err)
		}
		z.Tiers[value] = t
	}
	if len(z.Tiers) == 0 {
		return d.Errf("zone '%s': tier: needs a block of values, each with a rate (and burst) or unlimited", name)
	}
	return nil
}

// unmarshalAdaptive parses concurrency adaptive's optional block of
// settings (the dispenser is on "adaptive").
func unmarshalAdaptive(d *caddyfile.Dispenser, name string) (*Adaptive, error) {
	if d.NextArg() {
		return nil, d.Errf("zone '%s': concurrency adaptive: unexpected argument '%s' (settings go in a block)", name, d.Val())
	}
	a := &Adaptive{}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return nil, d.Errf("zone '%s': concurrency adaptive: %s given twice", name, opt)
		}
		seen[opt] = true
		var err error
		var v int64
		var f float64
		switch opt {
		case "min", "max", "initial", "min_samples", "epoch", "max_keys", "status":
			v, err = intArg(d)
		case "percentile", "tolerance", "smoothing":
			f, err = floatArg(d)
		case "window":
			var w caddy.Duration
			w, err = durationArg(d)
			v, a.Window = int64(w), w
		default:
			return nil, d.Errf("zone '%s': concurrency adaptive: unrecognized setting '%s'", name, opt)
		}
		if err != nil {
			return nil, err
		}
		if v == 0 && f == 0 {
			// 0 would read as the default.
			return nil, d.Errf("zone '%s': concurrency adaptive: %s: must be greater than 0, got %s", name, opt, d.Val())
		}
		switch opt {
		case "min":
			a.Min = v
		case "max":
			a.Max = v
		case "initial":
			a.Initial = v
		case "min_samples":
			a.MinSamples = v
		case "epoch":
			a.Epoch = v
		case "max_keys":
			a.MaxKeys = int(v)
		case "status":
			a.Status = int(v)
		case "percentile":
			a.Percentile = f
		case "tolerance":
			a.Tolerance = f
		case "smoothing":
			a.Smoothing = f
		}
	}
	return a, nil
}

// parseTier parses a tier line's arguments: <rate> [burst <n>], or
// unlimited.
func parseTier(args []string) (*Tier, error) {
	switch {
	case len(args) == 1 && args[0] == "unlimited":
		return &Tier{Unlimited: true}, nil
	case len(args) == 1 || (len(args) == 3 && args[1] == "burst"):
		events, window, months, err := parseRate(args[0])
		if err != nil {
			return nil, fmt.Errorf("rate: %v", err)
		}
		t := &Tier{Events: events, Window: caddy.Duration(window), months: months}
		if len(args) == 3 {
			if t.Burst, err = strconv.ParseInt(args[2], 10, 64); err != nil {
				return nil, fmt.Errorf("burst: want a whole number, got %q", args[2])
			}
		}
		return t, nil
	}
	return nil, fmt.Errorf("want <rate> [burst <n>] or unlimited, got %q", strings.Join(args, " "))
}

// tokenFor returns where the field an error is about is written: the
// option the error starts with ("burst: ...", or "burst and max_delay:
// ..."), else def.
func tokenFor(err error, at map[string]caddyfile.Token, def caddyfile.Token) caddyfile.Token {
	field, _, ok := strings.Cut(err.Error(), ": ")
	if !ok {
		return def
	}
	field, _, _ = strings.Cut(field, " and ")
	if tok, ok := at[field]; ok {
		return tok
	}
	return def
}

// errAt returns err with the file and line of tok (and its import chain),
// as the Dispenser's own errors have them.
func errAt(tok caddyfile.Token, err error) error {
	d := caddyfile.NewDispenser([]caddyfile.Token{tok})
	d.Next()
	return d.WrapErr(err)
}

// ParseRate parses a rate such as "10/s", "600/m", "5000/h", "2/d",
// "7/w" or "100/10s" into events and window. A rate per month ("1000/mo")
// is a calendar window, which has no duration: an error here.
func ParseRate(s string) (int64, time.Duration, error) {
	events, window, months, err := parseRate(s)
	if err == nil && months > 0 {
		err = fmt.Errorf("%q: a month has no fixed length", s)
	}
	return events, window, err
}

// parseRate is ParseRate, and also parses rates per months ("1000/mo",
// "1000/3mo") into events and months.
func parseRate(s string) (int64, time.Duration, int64, error) {
	if num, per, ok := strings.Cut(s, "/"); ok && strings.HasSuffix(per, "mo") {
		if per == "mo" {
			per = "1mo"
		}
		events, err := strconv.ParseInt(num, 10, 64)
		if err != nil || events <= 0 {
			return 0, 0, 0, fmt.Errorf("%q: events must be a whole number > 0, got %q", s, num)
		}
		_, months, err := parseWindow(per)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("%q: window %q: %v", s, per, err)
		}
		return events, 0, months, nil
	}
	events, window, err := parseFixedRate(s)
	return events, window, 0, err
}

func parseFixedRate(s string) (int64, time.Duration, error) {
	num, per, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("%q: want <events>/<window>, e.g. 10/s or 100/10s", s)
	}
	events, err := strconv.ParseInt(num, 10, 64)
	if err != nil || events <= 0 {
		return 0, 0, fmt.Errorf("%q: events must be a whole number > 0, got %q", s, num)
	}
	var window time.Duration
	switch per {
	case "ms":
		window = time.Millisecond
	case "s":
		window = time.Second
	case "m":
		window = time.Minute
	case "h":
		window = time.Hour
	case "d":
		window = day
	case "w":
		window = week
	default:
		if per == "" || per[0] < '0' || per[0] > '9' {
			return 0, 0, fmt.Errorf("%q: unknown window %q (want ms, s, m, h, d, w, mo or a duration such as 10s)", s, per)
		}
		window, _, err = parseWindow(per)
		if err != nil {
			return 0, 0, fmt.Errorf("%q: window %q: %v", s, per, err)
		}
	}
	if window <= 0 {
		return 0, 0, fmt.Errorf("%q: window must be greater than 0", s)
	}
	return events, window, nil
}

func stringArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

func intArg(d *caddyfile.Dispenser) (int64, error) {
	opt := d.Val()
	s, err := stringArg(d)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, d.Errf("%s: want a whole number, got '%s'", opt, s)
	}
	return v, nil
}

func floatArg(d *caddyfile.Dispenser) (float64, error) {
	opt := d.Val()
	s, err := stringArg(d)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, d.Errf("%s: want a finite number, got '%s'", opt, s)
	}
	return v, nil
}

func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	opt := d.Val()
	s, err := stringArg(d)
	if err != nil {
		return 0, err
	}
	v, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, d.Errf("%s: want a duration such as 1m, got '%s': %v", opt, s, err)
	}
	return caddy.Duration(v), nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
