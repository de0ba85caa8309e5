package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// monotonicMicros is the process's clock: µs since the Unix epoch,
// monotonic (see shared.Micros).
func monotonicMicros() int64 { return shared.Micros() }

// clock is what handlers provisioned from now on read the time with; tests
// replace it with a fake.
var clock = monotonicMicros

// result is one applied zone part's decision for a request: the store
// runtime's Part, carrying the handler's zone.
type result = shared.Part[*zone]

// inlineResults is how many applied zone parts a request tracks without
// allocating (a decision's own arrays hold shared.InlineParts). It is on the
// stack while a rejected request's answer is written, deep in net/http,
// and a request goroutine that outgrows 8 KiB copies its stack to a
// larger one, again after every garbage collection shrinks it (2% of
// Caddy's CPU under a flood of rejections). A request with more results
// (zones, and their ban and concurrency parts) allocates.
const inlineResults = 4

// ServeHTTP decides the request against every zone that applies, as one
// step: the request goes on only if every zone admits it, and a request
// that any zone rejects is charged in no zone, not even for a moment (the
// memory store locks every applied key's shard, Redis runs one script).
// When the store fails, each zone's on_storage_error applies.
//
// The decision is made in gate, whose frame (the request's results among
// its locals) is gone by the time an admitted request goes on down the
// handler chain: a request goroutine whose stack outgrows 8 KiB copies it
// to a larger one, again after every garbage collection shrinks it, and
// that copying was 1.5% of Caddy's CPU on a route with a memory zone.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	goOn, err := h.gate(w, r, next)
	if goOn {
		return next.ServeHTTP(w, r)
	}
	return err
}

// gate decides the request (see ServeHTTP). goOn reports that it was
// admitted and that the caller sends it on; otherwise gate has answered
// it (a rejection, an error), or sent it on itself (a request that holds
// concurrency slots or is delayed, see admit), and err is the result.
func (h *Handler) gate(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) (goOn bool, err error) {
	repl := replacerOf(r)
	now := h.now()
	var buf [inlineResults]result
	results := buf[:0]
	var abuf [1]result
	adaptive := abuf[:0]      // concurrency adaptive parts, decided first
	readJSON := h.requestJSON // the request's JSON is yet to be read
	for _, z := range h.zones {
		if len(z.matchers) > 0 {
			ok, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return false, matchError(z, err)
			}
			if !ok {
				continue
			}
		}
		if readJSON && z.requestJSON {
			// Only a request that a zone reading its JSON applies to is
			// read: any other body reaches the upstream as it comes.
			readRequestJSON(r, repl)
			readJSON = false
		}
		rate := z
		if z.tiers != nil {
			var ok bool
			if rate, ok = z.tierFor(r, repl); !ok {
				continue // an unlimited tier: the zone does not apply
			}
		}
		key := z.resolveKey(r, repl)
		if key == "" {
			z.emptyKey.note(h.logger, z)
		}
		if a := z.adaptive; a != nil {
			adaptive = append(adaptive, result{Z: a, Zone: &a.Zone, Key: key})
			if a == z {
				continue // no other part
			}
		}
		if len(z.parts) == 1 {
			results = append(results, result{Z: rate, Zone: &rate.Zone, Key: key, Cost: z.resolveCost(repl)})
			continue
		}
		results = appendParts(results, z, rate, key, repl)
	}
	if len(adaptive) > 0 {
		if shed := h.admitAdaptive(r, adaptive, now); shed >= 0 {
			return false, h.shed(w, r, repl, adaptive, shed)
		}
	}
	if len(results) == 0 {
		if len(adaptive) > 0 {
			return h.admit(w, r, repl, next, results, adaptive, now)
		}
		return true, nil
	}
	rejected, err := h.decide(r, results, now)
	if err != nil {
		if results, err = h.onStoreError(results, err); err != nil {
			h.endAdaptive(adaptive)
			return false, unavailable(w, r, err)
		}
		rejected = shared.DecideLocal(now, results)
	}
	h.noteDryRuns(r, results)
	if h.bans {
		h.noteBans(r, results)
	}
	if rejected >= 0 {
		h.endAdaptive(adaptive)
		return false, h.reject(w, r, repl, results, rejected, now)
	}
	return h.admit(w, r, repl, next, results, adaptive, now)
}

// The rare paths of gate are functions of their own, kept out of its
// frame (see inlineResults).

//go:noinline
func replacerOf(r *http.Request) *caddy.Replacer {
	if repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); repl != nil {
		return repl
	}
	return caddy.NewReplacer()
}

//go:noinline
func matchError(z *zone, err error) error {
	return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("rate_limit zone %s: matching: %w", z.name, err))
}

// unavailable answers a request that no store could decide: 503, and a
// Retry-After of one second.
//
//go:noinline
func unavailable(w http.ResponseWriter, r *http.Request, err error) error {
	w.Header().Set("Retry-After", "1")
	return answer(w, r, http.StatusServiceUnavailable, err)
}

// decide decides every applied zone on the handler's store as one step
// and returns the index of the first rejecting zone that is not a dry run,
// or -1. When err is not nil, nothing was decided and nothing is charged.
func (h *Handler) decide(r *http.Request, results []result, now int64) (rejected int, err error) {
	start := h.storeStart()
	rejected, err = h.store.Decide(r.Context(), now, results)
	h.storeDone(start)
	for i := 0; i < len(results); {
		j := zoneEnd(results, i)
		results[i].Z.base.metrics.count(zoneResult(results[i:j]), err)
		i = j
	}
	return rejected, err
}

// onStoreError applies each zone's on_storage_error after the store failed
// to decide results: it returns the zones that are to be decided from this
// instance's memory (local), dropping those that fail open (allow), or an
// error if a zone fails closed (deny).
func (h *Handler) onStoreError(results []result, err error) ([]result, error) {
	n := 0
	for i := range results {
		z := results[i].Z
		if i == 0 || results[i-1].Z.base != z.base {
			h.logStoreError(z.base, err) // once per zone
		}
		switch z.onError {
		case zoneconf.FailDeny:
			return nil, errStoreUnavailable{zone: z.name, err: err}
		case zoneconf.FailLocal:
			if z.Memory != nil { // the memory store, or the local copy
				results[n] = results[i]
				if results[n].Strike > 0 {
					// Its zone's ban moved up with it, past the parts
					// dropped before the zone.
					results[n].Strike -= i - n
				}
				n++
			}
		}
	}
	return results[:n], nil
}

// noteDryRuns logs and emits the rejections of dry-run zones, which let the
// request through.
func (h *Handler) noteDryRuns(r *http.Request, results []result) {
	for i := range results {
		if res := &results[i]; res.Z.DryRun && !res.D.Allowed {
			h.logReject(r, res, true)
			h.emitExceeded(r, res, true)
		}
	}
}

// admit readies an admitted request: its headers and placeholders. A
// request that holds no concurrency slot, waits for no shaping delay and
// is in flight in no adaptive part goes on from ServeHTTP (goOn);
// admitHeld sends the others on itself.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler, results, adaptive []result, now int64) (goOn bool, err error) {
	h.writeHeaders(w.Header(), results, -1, -1, now)
	if len(results) > 0 {
		placeholdersOf(r, repl).setQuota(&results[ratelimitheader.MostRestrictive(results, -1)])
	}
	if h.slots || len(adaptive) > 0 || maxDelay(results) > 0 || (h.responses && shared.Settles(results)) {
		return false, h.admitHeld(w, r, next, results, adaptive)
	}
	return true, nil
}

// admitHeld sends on a request that holds concurrency slots (or is in
// flight in adaptive parts) until the handler chain returns, or that a
// shaping zone delays first. A client that goes away while delayed gives
// its place back.
func (h *Handler) admitHeld(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, results, adaptive []result) error {
	if len(adaptive) > 0 {
		defer h.endAdaptive(adaptive) // ended with its outcome by serveTapped, unless it never went on
	}
	settles := h.responses && shared.Settles(results)
	if shared.Holds(results) {
		defer h.store.Settled(results) // after the settlements and the give-back of a wait, deferred below
	}
	if h.slots {
		if hold := shared.HoldSlots(results); hold != nil {
			defer func() { hold.Release(r.Context(), h.now(), h.logStoreError) }()
		}
	}
	if delay := maxDelay(results); delay > 0 {
		t := time.NewTimer(time.Duration(delay) * time.Microsecond)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			h.logUndoErrors(shared.Undo(context.WithoutCancel(r.Context()), results, h.now()))
			return caddyhttp.Error(499, fmt.Errorf("rate_limit: client went away while its request was delayed: %w", r.Context().Err()))
		}
		// The upstream's round trip starts now, not at the admission.
		shared.SentAdaptive(h.now(), adaptive)
	}
	if settles || len(adaptive) > 0 {
		return h.serveTapped(w, r, next, results, settles, adaptive)
	}
	return next.ServeHTTP(w, r)
}

// logUndoErrors logs a give-back that failed.
func (h *Handler) logUndoErrors(z *zone, err error) {
	if err != nil {
		h.logStoreError(z, err)
	}
}

// reject answers a request that results[rejected] rejected. Retry-After is
// the time until every zone that applied (dry runs aside) would admit the
// request, none if one of them never can.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, results []result, rejected int, now int64) error {
	res := &results[rejected]
	quota := &results[ratelimitheader.Shown(results, rejected)] // a ban's zone reports its rate
	retryAfter := int64(-1)
	if wait := ratelimitheader.AdmitWait(results); wait != algorithms.Never {
		retryAfter = ratelimitheader.RetryAfter(wait, h.Jitter, res.Z.name, res.Key)
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfter, 10))
	}
	h.writeHeaders(w.Header(), results, rejected, retryAfter, now)
	p := placeholdersOf(r, repl)
	p.setQuota(quota)
	p.rejected, p.retryAfter = res.Z, retryAfter
	h.logReject(r, res, false)
	h.emitExceeded(r, res, false)
	return answer(w, r, h.status, errRateLimited{zone: res.Z.name})
}

// errRateLimited is the error a rejected request is answered with.
type errRateLimited struct{ zone string }

func (e errRateLimited) Error() string { return "rate limit exceeded in zone " + e.zone }

// maxDelay is the longest shaping delay among results. A dry-run zone's
// delay is charged (its state is what enforcing would have built) but not
// waited: a dry run never acts on a request.
func maxDelay(results []result) int64 {
	var d int64
	for i := range results {
		if !results[i].Z.DryRun {
			d = max(d, results[i].D.Delay)
		}
	}
	return d
}

// logReject logs a rejection at debug level: zone, wait and client IP, and
// the key only with log_key.
//
// Whether the logger takes debug lines is known from Provision on: a
// logger that does not costs a rejection no call into zap, whose depth
// below the handler's frames made request goroutines grow their stacks
// (again after every garbage collection shrank them) on a flood of
// rejections.
func (h *Handler) logReject(r *http.Request, res *result, dryRun bool) {
	if !h.logRejects {
		return
	}
	ce := h.logger.Check(zap.DebugLevel, "rate limit exceeded")
	if ce == nil {
		return
	}
	clientIP, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	fields := []zap.Field{
		zap.String("zone", res.Z.name),
		zap.Duration("wait", time.Duration(res.D.Wait)*time.Microsecond),
		zap.String("client_ip", clientIP),
		zap.Bool("dry_run", dryRun),
	}
	if h.LogKey {
		fields = append(fields, zap.String("key", res.Key))
	}
	ce.Write(fields...)
}

// logStoreError logs a store failure at error level, at most one line per
// zone per shared.LogInterval, with the count of failures not logged
// since the last line: an outage of the store cannot flood the log.
func (h *Handler) logStoreError(z *zone, err error) {
	suppressed, ok := z.errLog.Allow(h.now(), shared.LogInterval)
	if !ok {
		return
	}
	h.logger.Error("rate limit store failed", zap.String("zone", z.name), zap.Error(err),
		zap.Int64("suppressed", suppressed))
}

// answer ends a request the handler refuses with status. When the server
// has handle_errors routes, it returns the error for them to shape the
// response (and Caddy logs it at debug level). Without them it writes the
// status itself: Caddy would log a returned 5xx at error level once per
// request, flooding the log during a store outage that the handler already
// logs once, and an error costs a stack trace and a random ID per request.
func answer(w http.ResponseWriter, r *http.Request, status int, err error) error {
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil &&
		(srv.Errors == nil || len(srv.Errors.Routes) == 0) {
		w.WriteHeader(status)
		return nil
	}
	return caddyhttp.Error(status, err)
}

// errStoreUnavailable is the error of a request refused because its zone's
// store failed, with on_storage_error deny.
type errStoreUnavailable struct {
	zone string
	err  error
}

func (e errStoreUnavailable) Error() string {
	return "rate_limit zone " + e.zone + ": store unavailable: " + e.err.Error()
}

func (e errStoreUnavailable) Unwrap() error { return e.err }
