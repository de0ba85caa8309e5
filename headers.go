package tollgate

import (
	"net/http"
	"strconv"

	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
)

// microsPerSecond converts the µs of decisions to the seconds of the
// admin API and the events.
const microsPerSecond = 1_000_000

// HeaderQuota is the part's place in the rate-limit headers.
func (z *zone) HeaderQuota() *ratelimitheader.Quota { return &z.quota }

// writeHeaders sets the configured rate-limit headers for the applied zones
// in results. rejected is the index of the rejecting result, or -1, and
// retryAfter the Retry-After sent with it (-1 for none).
func (h *Handler) writeHeaders(hdr http.Header, results []result, rejected int, retryAfter, now int64) {
	if h.headers == 0 || len(results) == 0 {
		return
	}
	if h.headers&ratelimitheader.ModeIETF != 0 {
		oneZone := len(results) > 1 && zoneEnd(results, 0) == len(results)
		policy, value := ratelimitheader.IETF(results, rejected, retryAfter, oneZone)
		// Two small allocations: the value (a tiny, pointer-free object)
		// and one slice for both headers' values. One larger object
		// holding both measured slower.
		vals := make([]string, 2)
		vals[0], vals[1] = policy, value
		hdr["Ratelimit-Policy"] = vals[0:1:1]
		hdr["Ratelimit"] = vals[1:2:2]
	}
	if h.headers&(ratelimitheader.ModeDraft03|ratelimitheader.ModeX) == 0 {
		return
	}
	limit, remaining, reset := ratelimitheader.Single(results, rejected, retryAfter)
	if h.headers&ratelimitheader.ModeDraft03 != 0 {
		hdr["Ratelimit-Limit"] = []string{limit}
		hdr["Ratelimit-Remaining"] = []string{remaining}
		hdr["Ratelimit-Reset"] = []string{strconv.FormatInt(reset, 10)}
	}
	if h.headers&ratelimitheader.ModeX != 0 {
		hdr["X-Ratelimit-Limit"] = []string{limit}
		hdr["X-Ratelimit-Remaining"] = []string{remaining}
		hdr["X-Ratelimit-Reset"] = []string{strconv.FormatInt(ratelimitheader.CeilSeconds(now)+reset, 10)}
	}
}
