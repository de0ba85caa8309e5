// Package ratelimitheader builds the values of the rate-limit response
// headers from a request's decisions: RateLimit-Policy and RateLimit
// (draft-ietf-httpapi-ratelimit-headers-11), and the single-limit
// RateLimit-* of draft 03 and X-RateLimit-*. It knows no Caddy and no
// net/http: the root package writes the values on the response. Building
// them allocates nothing but the RateLimit value itself.
package ratelimitheader

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// Modes is a set of rate-limit header modes.
type Modes uint8

// The header modes.
const (
	ModeIETF Modes = 1 << iota
	ModeDraft03
	ModeX
)

// ParseModes parses the headers field: one or more of ietf,
// ietf-draft-03, x-ratelimit, or none alone. Default: ietf.
func ParseModes(modes []string) (Modes, error) {
	if len(modes) == 0 {
		return ModeIETF, nil
	}
	var m Modes
	for _, s := range modes {
		var bit Modes
		switch s {
		case "ietf":
			bit = ModeIETF
		case "ietf-draft-03":
			bit = ModeDraft03
		case "x-ratelimit":
			bit = ModeX
		case "none":
			if len(modes) > 1 {
				return 0, fmt.Errorf("headers: none cannot be combined with other modes, got %q", strings.Join(modes, " "))
			}
			return 0, nil
		default:
			return 0, fmt.Errorf("headers: unknown mode %q (want ietf, ietf-draft-03, x-ratelimit or none)", s)
		}
		if m&bit != 0 {
			return 0, fmt.Errorf("headers: mode %q given twice", s)
		}
		m |= bit
	}
	return m, nil
}

const microsPerSecond = 1_000_000

// ShownRemaining is a decision's remaining as the headers, the
// {http.rate_limit.remaining} placeholder, the admin API and the events
// show it: the whole units available now, never below 0. A key that owes
// an excess (cost_response past the capacity) is below empty in the
// store, which is how long it waits; it has nothing available.
func ShownRemaining(remaining int64) int64 { return max(remaining, 0) }

// CeilSeconds rounds µs up to whole seconds.
func CeilSeconds(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + microsPerSecond - 1) / microsPerSecond
}

// Quota is a zone part's place in the headers, set once at provision.
type Quota struct {
	// Name is the part's name in the RateLimit headers.
	Name string
	// Policy is the part's RateLimit-Policy list item (see PolicyItem);
	// "" for a ban, which has no quota to advertise and is shown as the
	// rate that follows it.
	Policy string
	// ZonePolicy, on a rate part (the zone's or a tier's) of a zone with
	// a ban or concurrency: the RateLimit-Policy of the zone's parts with
	// this rate, when they are all a request applies.
	ZonePolicy string
	// Limit is the part's limit.
	Limit *algorithms.Limit
}

// Zone is a zone part as the headers see it: its Quota.
type Zone interface {
	HeaderQuota() *Quota
}

// PolicyItem is a RateLimit-Policy list item for limit l of the part
// named name: quota per window in whole seconds, a window under one
// second written as the equivalent quota per second.
func PolicyItem(name string, l algorithms.Limit) string {
	if l.Kind == algorithms.Concurrency {
		return `"` + name + `";q=` + strconv.FormatInt(l.Events, 10) + `;qu="concurrent-requests"`
	}
	const second = int64(time.Second / time.Microsecond)
	q, w := l.Events, l.Window/second
	switch {
	case l.Window < second:
		q, w = max(1, l.Events*second/l.Window), 1
	case l.Window%second != 0:
		w = (l.Window + second - 1) / second
	}
	return `"` + name + `";q=` + strconv.FormatInt(q, 10) + `;w=` + strconv.FormatInt(w, 10)
}

// policyAt is q's RateLimit-Policy list item for a decision made at now:
// for a calendar window, the quota per the length of the window that holds
// now (a DST day is 82800 or 90000 seconds, a month 28 to 31 days); for
// any other part its item built at provision.
func (q *Quota) policyAt(now int64) string {
	cal := q.Limit.Calendar
	if cal.Unit == algorithms.NoUnit || q.Policy == "" {
		return q.Policy
	}
	p := cal.Period(now)
	return `"` + q.Name + `";q=` + strconv.FormatInt(q.Limit.Events, 10) + `;w=` + strconv.FormatInt(CeilSeconds(p.End-p.Start), 10)
}

// IETF returns the values of RateLimit-Policy and RateLimit, one list item
// per part (a ban aside). rejected is the index of the rejecting part, or
// -1, and retryAfter the Retry-After sent with it (-1 for none); oneZone
// tells that the parts are all one zone's.
func IETF[Z Zone](parts []shared.Part[Z], rejected int, retryAfter int64, oneZone bool) (policy, value string) {
	calendar := false
	for i := range parts {
		calendar = calendar || parts[i].Z.HeaderQuota().Limit.Calendar.Unit != algorithms.NoUnit
	}
	if calendar {
		// A calendar window's w is its own window's length: built per
		// request.
		var b strings.Builder
		for i := range parts {
			item := parts[i].Z.HeaderQuota().policyAt(parts[i].D.At)
			if item == "" {
				continue
			}
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			b.WriteString(item)
		}
		policy = b.String()
	} else if len(parts) == 1 {
		policy = parts[0].Z.HeaderQuota().Policy // built at provision: no allocation
	} else if p := onlyZonePolicy(parts, oneZone); p != "" {
		policy = p // one zone's parts: built at provision too
	} else {
		var b strings.Builder
		for i := range parts {
			q := parts[i].Z.HeaderQuota()
			if q.Policy == "" {
				continue // a ban: no quota to advertise
			}
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			b.WriteString(q.Policy)
		}
		policy = b.String()
	}
	if rejected >= 0 {
		rejected = Shown(parts, rejected)
	}
	var arr [160]byte
	buf := arr[:0]
	for i := range parts {
		res := &parts[i]
		q := res.Z.HeaderQuota()
		if q.Policy == "" {
			continue
		}
		if len(buf) > 0 {
			buf = append(buf, ", "...)
		}
		buf = append(buf, '"')
		buf = append(buf, q.Name...)
		buf = append(buf, `";r=`...)
		buf = strconv.AppendInt(buf, ShownRemaining(res.D.Remaining), 10)
		buf = append(buf, ";t="...)
		t := CeilSeconds(res.D.Reset)
		if i == rejected && retryAfter >= 0 {
			t = retryAfter // the contract: the rejecting zone's t is Retry-After
		}
		buf = strconv.AppendInt(buf, t, 10)
	}
	return policy, string(buf)
}

// onlyZonePolicy is the RateLimit-Policy built at provision for parts
// that are all one zone's, or "".
func onlyZonePolicy[Z Zone](parts []shared.Part[Z], oneZone bool) string {
	if !oneZone {
		return ""
	}
	for i := range parts {
		if p := parts[i].Z.HeaderQuota().ZonePolicy; p != "" {
			return p // the rate part's: only a rate part has one
		}
	}
	return ""
}

// Single returns the values of the single-limit headers (draft 03's
// RateLimit-*, X-RateLimit-*): the limit and remaining of the most
// restrictive part (see MostRestrictive), and the seconds until its reset,
// or Retry-After (retryAfter >= 0) on a rejection.
func Single[Z Zone](parts []shared.Part[Z], rejected int, retryAfter int64) (limit, remaining string, reset int64) {
	res := &parts[MostRestrictive(parts, rejected)]
	limit = strconv.FormatInt(res.Z.HeaderQuota().Limit.Events, 10)
	remaining = strconv.FormatInt(ShownRemaining(res.D.Remaining), 10)
	reset = CeilSeconds(res.D.Reset)
	if rejected >= 0 && retryAfter >= 0 {
		reset = retryAfter
	}
	return limit, remaining, reset
}

// Shown is the part whose quota the headers and placeholders report for
// the rejecting part rejected: itself, or for a ban its zone's rate, which
// follows it.
func Shown[Z Zone](parts []shared.Part[Z], rejected int) int {
	if parts[rejected].Z.HeaderQuota().Policy == "" {
		return rejected + 1
	}
	return rejected
}

// MostRestrictive is the index of the rejecting part, or else of the one
// with the fewest remaining events (the later reset on a tie), bans aside.
func MostRestrictive[Z Zone](parts []shared.Part[Z], rejected int) int {
	if rejected >= 0 {
		return Shown(parts, rejected)
	}
	m := 0
	if parts[0].Z.HeaderQuota().Policy == "" {
		m = 1
	}
	for i := m + 1; i < len(parts); i++ {
		if parts[i].Z.HeaderQuota().Policy == "" {
			continue
		}
		a, b := &parts[i].D, &parts[m].D
		if a.Remaining < b.Remaining || (a.Remaining == b.Remaining && a.Reset > b.Reset) {
			m = i
		}
	}
	return m
}
