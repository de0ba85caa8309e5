package tollgate

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
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

// provisionTiers opens each tier of z (a zone's rate part): its own state
// per key, apart from the zone's and every other tier's.
func (h *Handler) provisionTiers(z *zone, key string, tiers map[string]*algorithms.Limit) error {
	z.tierKey, z.tierHeader = key, headerKey(key)
	z.tiers = make(map[string]*zone, len(tiers))
	for _, value := range zoneconf.SortedTiers(tiers) {
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
