// Package adminapi is the admin API's wire format, shared by its endpoint
// (the root package's AdminAPI, under Prefix) and the `caddy rate-limit`
// CLI: the JSON of its answers and requests, its paths, and how the CLI
// shows the answers to people. It knows no Caddy and no net/http.
package adminapi

import (
	"fmt"
	"net/url"
	"strings"
)

// Prefix is the admin API path of the endpoint.
const Prefix = "/rate_limit/"

// ZoneInfo is one zone in GET /rate_limit/zones.
type ZoneInfo struct {
	Zone      string  `json:"zone"`
	Algorithm string  `json:"algorithm"`
	Events    int64   `json:"events"`
	Window    float64 `json:"window"` // seconds
	Burst     int64   `json:"burst"`
	Storage   string  `json:"storage"`
	DryRun    bool    `json:"dry_run"`
	Keys      *int    `json:"keys"` // null for a store that keeps no count

	// A calendar window: its length as configured ("1d", "1mo"; window
	// is then its nominal length) and its time zone.
	Calendar string `json:"calendar,omitempty"`
	Timezone string `json:"timezone,omitempty"`

	Concurrency      int64   `json:"concurrency,omitempty"`
	ConcurrencyLease float64 `json:"concurrency_lease,omitempty"` // seconds
	Ban              float64 `json:"ban,omitempty"`               // seconds
	BanAfter         int64   `json:"ban_after,omitempty"`

	// Adaptive is the zone's concurrency adaptive, in a zone with it.
	Adaptive *AdaptiveInfo `json:"adaptive,omitempty"`

	TierKey string              `json:"tier_key,omitempty"`
	Tiers   map[string]TierInfo `json:"tiers,omitempty"`
}

// AdaptiveInfo is a zone's concurrency adaptive in GET /rate_limit/zones:
// its bounds, and its controllers now, added up over its keys (and over
// the live configurations' states of the zone, each instance's own).
type AdaptiveInfo struct {
	Min      int64   `json:"min"`
	Max      int64   `json:"max"`
	Window   float64 `json:"window"`    // seconds
	Limit    int64   `json:"limit"`     // the keys' limits, added up
	InFlight int64   `json:"in_flight"` // the keys' requests in flight
	Shed     int64   `json:"shed"`      // requests shed (a dry run: that it would have shed)
}

// AdaptiveState is one key's concurrency adaptive controller in GET
// /rate_limit/zones/<zone>/keys/<key>.
type AdaptiveState struct {
	Limit    int64   `json:"limit"` // requests admitted in flight now
	InFlight int64   `json:"in_flight"`
	Baseline float64 `json:"baseline"` // seconds: the round trip of an upstream not queueing; 0 until learnt
	Recent   float64 `json:"recent"`   // seconds: the last window's percentile round trip
	Gradient float64 `json:"gradient"` // the last window's, in [0.5, 1]
	Windows  int64   `json:"windows"`  // sample windows closed
}

// TierInfo is one tier's limit in GET /rate_limit/zones.
type TierInfo struct {
	Events    int64   `json:"events,omitempty"`
	Window    float64 `json:"window,omitempty"`   // seconds; a calendar window's nominal length
	Calendar  string  `json:"calendar,omitempty"` // a calendar window as configured ("1mo"), as ZoneInfo's
	Burst     int64   `json:"burst,omitempty"`
	Unlimited bool    `json:"unlimited,omitempty"`
}

// KeyState is one key's state in GET /rate_limit/zones/<zone>/keys/<key>,
// as a request for one event would see it now.
type KeyState struct {
	Zone      string  `json:"zone"`
	Key       string  `json:"key"`       // as stored
	Allowed   bool    `json:"allowed"`   // whether one more event would be admitted now
	Remaining int64   `json:"remaining"` // whole events available now
	Reset     float64 `json:"reset"`     // seconds until the quota is whole again
	Wait      float64 `json:"wait"`      // seconds until one event would be admitted
	// Granted is the events granted to the key's current window (the
	// window algorithms), grants added up; omitted when none is.
	Granted float64 `json:"granted,omitempty"`

	// Ban is the key's ban, in a zone with one.
	Ban *BanState `json:"ban,omitempty"`
	// InFlight is the key's requests in flight, in a zone with
	// concurrency.
	InFlight *int64 `json:"in_flight,omitempty"`
	// Adaptive is the key's controller, in a zone with concurrency
	// adaptive.
	Adaptive *AdaptiveState `json:"adaptive,omitempty"`
	// Tier is the tier whose state this is (?tier=), in a zone with tiers.
	Tier string `json:"tier,omitempty"`
	// Lease is the quota lease the instance that answers holds on the
	// key (Redis, a hot key), omitted when it holds none: events debited
	// on Redis that this instance may spend without a round trip, which
	// Remaining (Redis's) does not count.
	Lease *LeaseState `json:"lease,omitempty"`
}

// LeaseState is an instance's quota lease on a key.
type LeaseState struct {
	Events float64 `json:"events"`       // whole events left in it
	Left   float64 `json:"seconds_left"` // seconds until it ends
}

// BanState is a key's ban in GET /rate_limit/zones/<zone>/keys/<key> and
// /bans/<key>.
type BanState struct {
	Banned      bool    `json:"banned"`
	Left        float64 `json:"seconds_left"` // seconds until the ban ends; 0 when not banned
	StrikesLeft int64   `json:"strikes_left"` // rejections the key may still get in this window before a ban
}

// GrantRequest is the body of POST .../keys/<key>/grant.
type GrantRequest struct {
	// Amount is the events granted, > 0; fractions count as costs do.
	Amount float64 `json:"amount"`
	// ID, if set (or the Idempotency-Key header), makes the grant apply
	// once to the key and window, however often it is sent.
	ID string `json:"id,omitempty"`
}

// MaxGrantID bounds a grant id's length.
const MaxGrantID = 128

// GrantID returns the grant's id from the Idempotency-Key header (header)
// or the body's id (the same if both are given), checked.
func GrantID(header, body string) (string, error) {
	id := header
	switch {
	case id == "":
		id = body
	case body != "" && body != id:
		return "", fmt.Errorf("grant: the Idempotency-Key header %q and the body's id %q differ", id, body)
	}
	if len(id) > MaxGrantID {
		return "", fmt.Errorf("grant: id must be at most %d bytes, got %d", MaxGrantID, len(id))
	}
	for _, c := range id {
		if c <= ' ' || c == 0x7f {
			return "", fmt.Errorf("grant: id %q: must be printable, without spaces", id)
		}
	}
	return id, nil
}

// KeyURI is the admin API path of a key in a zone (path "keys"), or of its
// ban ("bans"), zone and key each one path segment.
func KeyURI(zone, path, key string) string {
	return Prefix + "zones/" + pathSegment(zone) + "/" + path + "/" + pathSegment(key)
}

// pathSegment escapes s as one path segment: url.PathEscape escapes '/',
// '%', '?', '#' and spaces, and keeps the ':' of an IPv6 address, which a
// segment may hold. A segment "." or ".." is escaped too, or the admin
// endpoint's mux would clean it away as a step in the path.
func pathSegment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}
