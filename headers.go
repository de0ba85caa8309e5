package tollgate

import (
	"fmt"
	"github.com/caddy-tollgate/tollgate/algorithms"
	"net/http"
	"strconv"
	"strings"
)

// headerModes is a set of rate-limit header modes.
type headerModes uint8

const (
	headersIETF headerModes = 1 << iota
	headersDraft03
	headersX
)

// parseHeaderModes parses the headers field: one or more of ietf,
// ietf-draft-03, x-ratelimit, or none alone. Default: ietf.
func parseHeaderModes(modes []string) (headerModes, error) {
	if len(modes) == 0 {
		return headersIETF, nil
	}
	var m headerModes
	for _, s := range modes {
		var bit headerModes
		switch s {
		case "ietf":
			bit = headersIETF
		case "ietf-draft-03":
			bit = headersDraft03
		case "x-ratelimit":
			bit = headersX
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

// shownRemaining is a decision's remaining as the headers, the
// {http.rate_limit.remaining} placeholder, the admin API and the events
// show it: the whole units available now, never below 0. A key that owes
// an excess (cost_response past the capacity) is below empty in the
// store, which is how long it waits; it has nothing available.
func shownRemaining(remaining int64) int64 { return max(remaining, 0) }

// ceilSeconds rounds µs up to whole seconds.
func ceilSeconds(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + microsPerSecond - 1) / microsPerSecond
}

// writeHeaders sets the configured rate-limit headers for the applied zones
// in results. rejected is the index of the rejecting result, or -1, and
// retryAfter the Retry-After sent with it (-1 for none).
func (h *Handler) writeHeaders(hdr http.Header, results []result, rejected int, retryAfter, now int64) {
	if h.headers == 0 || len(results) == 0 {
		return
	}
	if h.headers&headersIETF != 0 {
		h.writeIETF(hdr, results, rejected, retryAfter)
	}
	if h.headers&(headersDraft03|headersX) == 0 {
		return
	}
	m := mostRestrictive(results, rejected)
	res := &results[m]
	if rejected >= 0 {
		m = shown(results, rejected)
		res = &results[m]
	}
	limit := strconv.FormatInt(res.Z.spec.Limit.Events, 10)
	remaining := strconv.FormatInt(shownRemaining(res.D.Remaining), 10)
	reset := ceilSeconds(res.D.Reset)
	if rejected >= 0 && retryAfter >= 0 {
		reset = retryAfter
	}
	if h.headers&headersDraft03 != 0 {
		hdr["Ratelimit-Limit"] = []string{limit}
		hdr["Ratelimit-Remaining"] = []string{remaining}
		hdr["Ratelimit-Reset"] = []string{strconv.FormatInt(reset, 10)}
	}
	if h.headers&headersX != 0 {
		hdr["X-Ratelimit-Limit"] = []string{limit}
		hdr["X-Ratelimit-Remaining"] = []string{remaining}
		hdr["X-Ratelimit-Reset"] = []string{strconv.FormatInt(ceilSeconds(now)+reset, 10)}
	}
}

// writeIETF writes RateLimit-Policy and RateLimit
// (draft-ietf-httpapi-ratelimit-headers-11), one list item per zone.
func (h *Handler) writeIETF(hdr http.Header, results []result, rejected int, retryAfter int64) {
	var policy string
	calendar := false
	for i := range results {
		calendar = calendar || results[i].Z.spec.Limit.Calendar.Unit != algorithms.NoUnit
	}
	if calendar {
		// A calendar window's w is its own window's length: built per
		// request.
		var b strings.Builder
		for i := range results {
			item := results[i].Z.policyAt(results[i].D.At)
			if item == "" {
				continue
			}
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			b.WriteString(item)
		}
		policy = b.String()
	} else if len(results) == 1 {
		policy = results[0].Z.policy // built at provision: no allocation
	} else if p := onlyZonePolicy(results); p != "" {
		policy = p // one zone's parts: built at provision too
	} else {
		var b strings.Builder
		for i := range results {
			if results[i].Z.policy == "" {
				continue // a ban: no quota to advertise
			}
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			b.WriteString(results[i].Z.policy)
		}
		policy = b.String()
	}
	if rejected >= 0 {
		rejected = shown(results, rejected)
	}
	var arr [160]byte
	buf := arr[:0]
	for i := range results {
		res := &results[i]
		if res.Z.policy == "" {
			continue
		}
		if len(buf) > 0 {
			buf = append(buf, ", "...)
		}
		buf = append(buf, '"')
		buf = append(buf, res.Z.hname...)
		buf = append(buf, `";r=`...)
		buf = strconv.AppendInt(buf, shownRemaining(res.D.Remaining), 10)
		buf = append(buf, ";t="...)
		t := ceilSeconds(res.D.Reset)
		if i == rejected && retryAfter >= 0 {
			t = retryAfter // the contract: the rejecting zone's t is Retry-After
		}
		buf = strconv.AppendInt(buf, t, 10)
	}
	// Two small allocations: the value (a tiny, pointer-free object) and
	// one slice for both headers' values. One larger object holding both
	// measured slower.
	vals := make([]string, 2)
	vals[0], vals[1] = policy, string(buf)
	hdr["Ratelimit-Policy"] = vals[0:1:1]
	hdr["Ratelimit"] = vals[1:2:2]
}

// onlyZonePolicy is the RateLimit-Policy built at provision for results
// that are all one zone's parts, or "".
func onlyZonePolicy(results []result) string {
	if zoneEnd(results, 0) != len(results) {
		return ""
	}
	for i := range results {
		if results[i].Z.role == roleRate {
			return results[i].Z.zonePolicy
		}
	}
	return ""
}

// shown is the result whose quota the headers and placeholders report
// for the rejecting result rejected: itself, or for a ban its zone's rate,
// which follows it.
func shown(results []result, rejected int) int {
	if results[rejected].Z.role == roleBan {
		return rejected + 1
	}
	return rejected
}

// mostRestrictive is the index of the rejecting result, or else of the one
// with the fewest remaining events (the later reset on a tie), bans aside.
func mostRestrictive(results []result, rejected int) int {
	if rejected >= 0 {
		return shown(results, rejected)
	}
	m := 0
	if results[0].Z.role == roleBan {
		m = 1
	}
	for i := m + 1; i < len(results); i++ {
		if results[i].Z.role == roleBan {
			continue
		}
		a, b := &results[i].D, &results[m].D
		if a.Remaining < b.Remaining || (a.Remaining == b.Remaining && a.Reset > b.Reset) {
			m = i
		}
	}
	return m
}
