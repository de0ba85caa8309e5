package zoneconf

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// tierLimits checks the zone's tier_key and tiers against its rate s.
// Each tier is the zone's algorithm, cost and max_delay with its own
// events, window and burst.
func (zc *Zone) tierLimits(s *Settings) (map[string]*algorithms.Limit, error) {
	if zc.TierKey == "" && len(zc.Tiers) == 0 {
		return nil, nil
	}
	if zc.TierKey == "" {
		return nil, fmt.Errorf("tiers: need tier_key, the template whose value chooses the tier")
	}
	if len(zc.Tiers) == 0 {
		return nil, fmt.Errorf("tier_key: needs tiers, the limit of each value; got tier_key %q alone", zc.TierKey)
	}
	if !s.Rate {
		return nil, fmt.Errorf("tiers: a tier changes the zone's rate, and the zone has only concurrency")
	}
	out := make(map[string]*algorithms.Limit, len(zc.Tiers))
	for _, value := range SortedTiers(zc.Tiers) {
		l, err := zc.tierLimit(s, zc.Tiers[value])
		if err != nil {
			return nil, fmt.Errorf("tiers %q: %w", value, err)
		}
		out[value] = l
	}
	return out, nil
}

// tierLimit checks one tier; nil for an unlimited one.
func (zc *Zone) tierLimit(s *Settings, t *Tier) (*algorithms.Limit, error) {
	if t == nil {
		return nil, fmt.Errorf("a tier needs events and window (or a rate), or unlimited")
	}
	if t.Unlimited {
		if t.Events != 0 || t.Window != 0 || t.Months != 0 || t.Burst != 0 {
			return nil, fmt.Errorf("unlimited: takes no events, window or burst, got %d per %s, burst %d", t.Events, t.Window, t.Burst)
		}
		return nil, nil
	}
	if t.Events == 0 && t.Window == 0 && t.Months == 0 {
		return nil, fmt.Errorf("events and window are required (or a rate), or unlimited")
	}
	var l algorithms.Limit
	var err error
	switch {
	case s.Loc != nil:
		// A tier of a calendar zone is a calendar window in its zone.
		if t.Burst != 0 {
			return nil, fmt.Errorf("burst: fixed_window has no bucket, got burst %d", t.Burst)
		}
		l, err = calendarLimit(t.Events, t.Window, t.Months, s.Loc)
	case t.Months > 0:
		err = fmt.Errorf("window: %dmo has no fixed length: a window of months needs the zone's align calendar", t.Months)
	default:
		l, err = algorithms.NewLimit(s.Limit.Kind, t.Events, t.Window, t.Burst, time.Duration(s.Limit.MaxDelay)*time.Microsecond)
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
func (zc *Zone) costFits(s *Settings, l algorithms.Limit, of string) error {
	capacity := l.Capacity()
	if s.CostExpr == nil && s.Cost > capacity {
		return fmt.Errorf("cost: %s is above the %s's capacity of %d events (%s), so no request could ever be admitted",
			strings.TrimSpace(zc.Cost), of, capacity/algorithms.Milli, CapacityField(l))
	}
	if zc.DefaultCost != nil && s.DefaultCost > capacity {
		return fmt.Errorf("default_cost: %v is above the %s's capacity of %d events (%s), so a request that uses it could never be admitted",
			*zc.DefaultCost, of, capacity/algorithms.Milli, CapacityField(l))
	}
	return nil
}

// CapacityField names what sets a limit's capacity, for error messages.
func CapacityField(l algorithms.Limit) string {
	switch l.Kind {
	case algorithms.TokenBucket, algorithms.GCRA, algorithms.LeakyBucket:
		return "burst"
	}
	return "events"
}

// SortedTiers returns the tier values in order, for errors and the admin
// API.
func SortedTiers[T any](tiers map[string]T) []string {
	values := make([]string, 0, len(tiers))
	for v := range tiers {
		values = append(values, v)
	}
	sort.Strings(values)
	return values
}
