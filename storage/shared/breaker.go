package shared

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// ErrDown is the error of a call made while Redis is known to be
// unreachable: it fails at once, without waiting for a timeout.
var ErrDown = errors.New("redis unreachable: waiting to retry")

// RetryEvery is how long after the breaker opens Redis is tried
// again. Until then calls fail at once; then one call at a time probes it.
const RetryEvery = 250 * time.Millisecond

// FailStreak is how many calls in a row must fail, none answered in
// between, before failures that prove nothing on their own (a reply slower
// than the timeout, an error reply) open the breaker.
const FailStreak = 5

// Breaker is a circuit breaker shared by every zone on one client. It
// opens only on evidence that Redis is down, so that an outage costs each
// request nothing beyond the first failures and is logged once when it
// starts and once when it ends:
//
//   - a connection refused, reset or closed by the peer, or a dial that
//     fails other than by timing out, opens it at once;
//   - any other failure (a reply slower than the timeout: a busy machine, a
//     stalled server) opens it only when FailStreak calls in a row
//     fail; a single slow reply never does;
//   - a call that waited too long for a pool connection, or that its own
//     caller cancelled (a client gone), says nothing about Redis.
//
// A call that fails without opening the breaker still gets its zone's
// on_storage_error, for that request only. Every call goes through Do,
// whose halves admit and observe are called nowhere else.
type Breaker struct {
	downSince atomic.Int64 // unix ns of the failure that opened the breaker; 0 when closed
	retryAt   atomic.Int64 // unix ns after which one call may probe
	probing   atomic.Bool  // a call in do holds the probe
	streak    atomic.Int64 // failures in a row since the last answer
	Logger    *zap.Logger  // where an outage's start and end are logged
}

// Do makes one call to Redis through the breaker: while the breaker is
// open it fails at once with ErrDown, but for one call at a time
// once the retry time has come, its probe. fn makes the call and reports
// whether Redis itself answered it (false for a request the deny cache
// answered, which never reached Redis) and the call's error; parent is
// the caller's context, without the call's own timeout. Only a reply of
// Redis's closes the breaker. The probe is taken and given back here, in
// one function, whatever fn does (panics included): no path can hold it.
func (h *Breaker) Do(parent context.Context, fn func() (reached bool, err error)) error {
	probe, ok := h.admit()
	if !ok {
		return ErrDown
	}
	if probe {
		defer h.probing.Store(false)
	}
	reached, err := fn()
	if reached || err != nil {
		h.observe(parent, err)
	}
	return err
}

// admit reports whether a call may go to Redis now, and whether it is the
// breaker's probe, which the caller must give back (see Do).
func (h *Breaker) admit() (probe, ok bool) {
	if h.downSince.Load() == 0 {
		return false, true
	}
	if time.Now().UnixNano() < h.retryAt.Load() {
		return false, false
	}
	ok = h.probing.CompareAndSwap(false, true) // one probe at a time
	return ok, ok
}

// observe records the outcome of a call that admit let through. parent is
// the caller's context, without the call's own timeout.
func (h *Breaker) observe(parent context.Context, err error) {
	switch failure(parent, err) {
	case answered:
		h.streak.Store(0)
		if since := h.downSince.Swap(0); since != 0 {
			h.Logger.Info("redis reachable again: rate limits are shared again",
				zap.Duration("outage", time.Since(time.Unix(0, since))))
		}
	case noEvidence:
	case weakEvidence:
		if h.streak.Add(1) >= FailStreak || h.downSince.Load() != 0 {
			h.open(err)
		}
	case down:
		h.streak.Add(1)
		h.open(err)
	}
}

// open opens the breaker (or keeps it open after a failed probe) until
// RetryEvery from now, logging the outage once when it starts.
func (h *Breaker) open(err error) {
	now := time.Now().UnixNano()
	h.retryAt.Store(now + int64(RetryEvery))
	if h.downSince.CompareAndSwap(0, now) {
		h.Logger.Error("redis unreachable: each zone's on_storage_error applies until it answers",
			zap.Error(err), zap.Int64("failures_in_a_row", h.streak.Load()))
	}
}

// What a call's outcome says about Redis.
type evidence uint8

const (
	answered     evidence = iota // Redis answered
	noEvidence                   // the call failed for a reason that is not Redis's
	weakEvidence                 // Redis may be slow or struggling
	down                         // Redis is unreachable
)

// failure classifies a call's error; parent is the caller's context.
func failure(parent context.Context, err error) evidence {
	switch {
	case err == nil, errors.Is(err, goredis.Nil):
		return answered
	case parent.Err() != nil, errors.Is(err, goredis.ErrPoolTimeout):
		// The caller went away, or the call never got a connection: the
		// pool is busy, which is load on this instance, not a failure of
		// Redis (if Redis is slow, the calls holding the connections fail
		// and count).
		return noEvidence
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, goredis.ErrClosed),
		dialRefused(err):
		return down
	}
	return weakEvidence
}

// Unsent reports whether a call that failed with err did not run on
// Redis: the breaker was open, no pool connection was free, the
// connection could not be made or was found closed by the peer (a
// Redis that was gone: one that ran the call would have answered, unless
// it died in the µs between), or the request could not be written. A
// call that timed out may have run on Redis, or may still (a stalled
// Redis runs what it was sent once it resumes).
func Unsent(err error) bool {
	var opErr *net.OpError
	switch {
	case errors.Is(err, ErrDown), errors.Is(err, goredis.ErrPoolTimeout),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF):
		return true
	case errors.As(err, &opErr):
		return opErr.Op == "dial" || opErr.Op == "write"
	}
	return false
}

// dialRefused reports whether err is a dial that failed other than by a
// timeout. (Its own function: the target of errors.As escapes to the heap,
// which would cost every decision an allocation, answered or not.)
func dialRefused(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial" && !opErr.Timeout()
}

// Down reports whether the breaker is open.
func (h *Breaker) Down() bool { return h.downSince.Load() != 0 }

// Open opens the breaker as a failure proving Redis down would (for
// tests), and RetryNow has its retry time come at once.
func (h *Breaker) Open(err error) { h.open(err) }

// RetryNow has the breaker's retry time come at once: the next call
// probes.
func (h *Breaker) RetryNow() { h.retryAt.Store(0) }
