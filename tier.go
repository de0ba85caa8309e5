package tollgate

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// Tier is one value's limit in a zone with tiers: Events per Window with
// Burst, in place of the zone's own, or Unlimited (the zone does not apply
// to the request).
type Tier struct {
	// Events is how many events the tier admits per Window, > 0.
	// Default: none, required unless unlimited.
	Events int64 `json:"events,omitempty"`

	// Window is the duration Events are counted over, > 0. Default:
	// none, required unless unlimited.
	Window caddy.Duration `json:"window,omitempty"`

	// Burst is the tier's bucket capacity, in events. Default: the
	// tier's events.
	Burst int64 `json:"burst,omitempty"`

	// Unlimited takes the request out of the zone: no state, no headers,
	// no ban or concurrency from it. Default: false.
	Unlimited bool `json:"unlimited,omitempty"`

	// months is a window of calendar months, as Zone's.
	months int64
}

// tierSettings are a zone's tiers, checked: the limit of each listed
// value, nil for an unlimited one.
type tierSettings map[string]*algorithms.Limit

// tierLimits checks the zone's tier_key and tiers against its rate s.
// Each tier is the zone's algorithm, cost and max_delay with its own
// events, window and burst.
func (zc *Zone) tierLimits(s *zoneSettings) (tierSettings, error) {
	if zc.TierKey == "" && len(zc.Tiers) == 0 {
		return nil, nil
	}
	if zc.TierKey == "" {
		return nil, fmt.Errorf("tiers: need tier_key, the template whose value chooses the tier")
	}
	if len(zc.Tiers) == 0 {
		return nil, fmt.Errorf("tier_key: needs tiers, the limit of each value; got tier_key %q alone", zc.TierKey)
	}
	if !s.rate {
		return nil, fmt.Errorf("tiers: a tier changes the zone's rate, and the zone has only concurrency")
	}
	out := make(tierSettings, len(zc.Tiers))
	for _, value := range sortedTiers(zc.Tiers) {
		l, err := zc.tierLimit(s, value, zc.Tiers[value])
		if err != nil {
			return nil, fmt.Errorf("tiers %q: %w", value, err)
		}
		out[value] = l
	}
	return out, nil
}

// tierLimit checks one tier; nil for an unlimited one.
func (zc *Zone) tierLimit(s *zoneSettings, value string, t *Tier) (*algorithms.Limit, error) {
	if t == nil {
		return nil, fmt.Errorf("a tier needs events and window (or a rate), or unlimited")
	}
	if t.Unlimited {
		if t.Events != 0 || t.Window != 0 || t.months != 0 || t.Burst != 0 {
			return nil, fmt.Errorf("unlimited: takes no events, window or burst, got %d per %s, burst %d", t.Events, time.Duration(t.Window), t.Burst)
		}
		return nil, nil
	}
	if t.Events == 0 && t.Window == 0 && t.months == 0 {
		return nil, fmt.Errorf("events and window are required (or a rate), or unlimited")
	}
	var l algorithms.Limit
	var err error
	switch {
	case s.loc != nil:
		// A tier of a calendar zone is a calendar window in its zone.
		if t.Burst != 0 {
			return nil, fmt.Errorf("burst: fixed_window has no bucket, got burst %d", t.Burst)
		}
		l, err = calendarLimit(t.Events, t.Window, t.months, s.loc)
	case t.months > 0:
		err = fmt.Errorf("window: %dmo has no fixed length: a window of months needs the zone's align calendar", t.months)
	default:
		l, err = algorithms.NewLimit(s.limit.Kind, t.Events, time.Duration(t.Window), t.Burst, time.Duration(s.limit.MaxDelay)*time.Microsecond)
	}
	if err != nil {
		return nil, err
	}
	if err := zc.costFits(s, l, "tier"); err != nil {
		return nil, err
	}
	return &l, nil
}

// costFits refuses a fixed cost, or a default_cost, above the capacity of
// l, the limit of a zone or of one of its tiers (of names which): every
// request, or every request whose cost template does not resolve, would be
// rejected. A template's cost is the client's, and above the capacity it
// is a 429 without Retry-After.
func (zc *Zone) costFits(s *zoneSettings, l algorithms.Limit, of string) error {
	capacity := l.Capacity()
	if s.costTemplate == "" && s.cost > capacity {
		return fmt.Errorf("cost: %s is above the %s's capacity of %d events (%s), so no request could ever be admitted",
			strings.TrimSpace(string(zc.Cost)), of, capacity/algorithms.Milli, capacityField(l))
	}
	if zc.DefaultCost != nil && s.defaultCost > capacity {
		return fmt.Errorf("default_cost: %v is above the %s's capacity of %d events (%s), so a request that uses it could never be admitted",
			*zc.DefaultCost, of, capacity/algorithms.Milli, capacityField(l))
	}
	return nil
}

// sortedTiers returns the tier values in order, for errors and the admin
// API.
func sortedTiers[T any](tiers map[string]T) []string {
	values := make([]string, 0, len(tiers))
	for v := range tiers {
		values = append(values, v)
	}
	sort.Strings(values)
	return values
}

// provisionTiers opens each tier of z (a zone's rate part): its own state
// per key, apart from the zone's and every other tier's.
func (h *Handler) provisionTiers(z *zone, key string, tiers tierSettings) error {
	z.tierKey, z.tierHeader = key, headerKey(key)
	z.tiers = make(map[string]*zone, len(tiers))
	for _, value := range sortedTiers(tiers) {
		l := tiers[value]
		if l == nil {
			z.tiers[value] = nil // unlimited
			continue
		}
		// '@' is in no zone name: no tier's state is another zone's.
		t, err := h.openPart(z, roleRate, *l, z.name+"@"+value)
		if err != nil {
			return fmt.Errorf("tiers %q: %w", value, err)
		}
		t.tier = value
		z.tiers[value] = t
		z.all = append(z.all, t)
	}
	return nil
}

// tierFor returns the rate part that decides r in z: the tier its
// tier_key's value names, or z itself for a value not listed; ok is false
// for an unlimited tier, when the zone does not apply.
func (z *zone) tierFor(r *http.Request, repl *caddy.Replacer) (rate *zone, ok bool) {
	var value string
	if z.tierHeader != "" {
		value = strings.Join(r.Header[z.tierHeader], ",")
	} else {
		value = repl.ReplaceAll(z.tierKey, "")
	}
	t, listed := z.tiers[value]
	switch {
	case !listed:
		return z, true
	case t == nil:
		return nil, false
	}
	return t, true
}
