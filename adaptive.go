package tollgate

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/bodyscan"
	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// adaptiveZones holds every adaptive part's state across config reloads:
// a zone with the same name and settings finds what the previous
// configuration learnt, and counts the requests it still has in flight.
var adaptiveZones = caddy.NewUsagePool()

// pooledAdaptive is an adaptive part's state in adaptiveZones.
type pooledAdaptive struct{ *shared.Adaptive }

// Destruct implements caddy.Destructor: the state holds nothing beyond
// memory.
func (pooledAdaptive) Destruct() error { return nil }

// openAdaptive opens the adaptive concurrency part of zone z (whose
// shared fields are set): a controller per key in this process's memory,
// whatever the handler's storage (see shared.Adaptive), the same across
// reloads while the zone's name and settings stay.
func (h *Handler) openAdaptive(z *zone, a *zoneconf.AdaptiveSettings) (*zone, error) {
	p := &zone{
		name:     z.name,
		role:     roleAdaptive,
		spec:     storage.Zone{Name: z.name},
		matchers: z.matchers,
		key:      z.key,
		clientIP: z.clientIP,
		header:   z.header,
		v4bits:   z.v4bits,
		v6bits:   z.v6bits,
		onError:  z.onError,
		status:   a.Status,
	}
	p.adaptivePool = fmt.Sprintf("%s\x00%+v\x00%d", z.name, a.Config, a.MaxKeys)
	v, _, err := adaptiveZones.LoadOrNew(p.adaptivePool, func() (caddy.Destructor, error) {
		return pooledAdaptive{shared.NewAdaptive(a.Config, a.MaxKeys)}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("concurrency adaptive: %w", err)
	}
	p.Adaptive = v.(pooledAdaptive).Adaptive
	p.Limiter = p.Adaptive
	p.DryRun = z.DryRun
	p.base = p
	if z.base != nil {
		p.base = z.base
	}
	// No RateLimit header item: its limit moves with the upstream's
	// latency, not a quota a client can plan by.
	p.quota = ratelimitheader.Quota{Name: z.name, Limit: &p.spec.Limit}
	return p, nil
}

// admitAdaptive decides the request's adaptive parts before the others
// (see shared.AdmitAdaptive), counting a shed in its zone's metrics, and
// returns the index of the part that shed it, or -1.
func (h *Handler) admitAdaptive(r *http.Request, adaptive []result, now int64) int {
	shed := shared.AdmitAdaptive(now, adaptive)
	decided := adaptive
	if shed >= 0 {
		decided = adaptive[:shed+1] // the parts after it were not asked
	}
	for i := range decided {
		// A zone of concurrency adaptive alone is counted here, and a
		// zone whose adaptive part shed the request (its other parts
		// are not decided); another is counted with its other parts.
		if res := &decided[i]; res.Z.base == res.Z || i == shed {
			res.Z.base.metrics.count(zoneResult(decided[i:i+1]), nil)
		}
	}
	h.noteDryRuns(r, decided)
	return shed
}

// shed answers a request that adaptive[i] shed: its zone's status (503
// by default, as load shedding), and a Retry-After of the key's recent
// round trip, jittered, at least a second.
//
//go:noinline
func (h *Handler) shed(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, adaptive []result, i int) error {
	res := &adaptive[i]
	retryAfter := ratelimitheader.RetryAfter(res.D.Wait, h.Jitter, res.Z.name, res.Key)
	w.Header().Set("Retry-After", strconv.FormatInt(retryAfter, 10))
	p := placeholdersOf(r, repl)
	p.rejected, p.retryAfter = res.Z, retryAfter
	h.logReject(r, res, false)
	h.emitExceeded(r, res, false)
	return answer(w, r, res.Z.status, errRateLimited{zone: res.Z.name})
}

// endAdaptive ends the requests the adaptive parts hold, teaching
// nothing: the request did not go on (another part rejected it, or its
// client left while it was delayed), or its end was already taught.
func (h *Handler) endAdaptive(adaptive []result) {
	if len(adaptive) > 0 {
		now := h.now()
		shared.EndAdaptive(now, adaptive, now, algorithms.Cancelled)
	}
}

// outcome is how a request that went on ended, as the adaptive
// controller learns it: a client gone before an answer teaches nothing,
// and a 5xx (the upstream failing, a proxy timeout) is a drop.
func outcome(r *http.Request, wrote bool, status int) algorithms.Outcome {
	switch {
	case !wrote && r.Context().Err() != nil:
		return algorithms.Cancelled
	case status >= 500:
		return algorithms.Drop
	}
	return algorithms.OK
}

// serveTapped sends the request on through a tap on its response, and
// when the handler chain returns, in whatever way (an error, a panic, a
// client gone), settles the charges of results (settles) and ends the
// requests adaptive holds: their round trip lasts until the response's
// status was written (a streamed body's time is the client's, not the
// upstream's queue), or the chain returned.
func (h *Handler) serveTapped(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, results []result, settles bool, adaptive []result) (err error) {
	tap := newResponseTap(w, results)
	if tap.scan != nil {
		// The body is read: ask the upstream (or `encode`) only for
		// codings the scanner reads.
		bodyscan.NarrowAcceptEncoding(r.Header)
	}
	if len(adaptive) > 0 {
		tap.clock = h.now
	}
	returned := false
	defer func() {
		status := tap.status
		switch {
		case tap.wrote:
		case !returned:
			status = http.StatusInternalServerError // a panic
		case err != nil:
			status = http.StatusInternalServerError
			var he caddyhttp.HandlerError
			if errors.As(err, &he) && he.StatusCode != 0 {
				status = he.StatusCode
			}
		default:
			status = http.StatusOK // nothing written: net/http sends 200
		}
		if len(adaptive) > 0 {
			now := h.now()
			answered := now
			if tap.wrote {
				answered = tap.at
			}
			shared.EndAdaptive(now, adaptive, answered, outcome(r, tap.wrote, status))
		}
		if settles {
			h.settle(r, results, tap, status)
		}
	}()
	err = next.ServeHTTP(tap, r)
	returned = true
	return err
}
