// Package tollgate is a rate limiter for the Caddy web server: the HTTP
// handler module http.handlers.rate_limit and its Caddyfile directive
// rate_limit. This package is the thin Caddy adapter; the algorithms live in
// package algorithms and the stores in package storage.
package tollgate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler rate-limits HTTP requests. Each zone is one limit with its own key,
// matchers and algorithm; a request passes only if every zone that applies
// admits it, and a request that any zone rejects consumes nothing in any
// zone. Rejected requests get a 429 (or Status) returned as a Caddy HTTP
// error, so that handle_errors can shape the body.
type Handler struct {
	// RateLimits are the zones, by name. Default: none, at least one zone
	// is required.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// ZoneOrder is the order zones are evaluated in and listed in the
	// RateLimit headers. The Caddyfile sets it to the order the zones are
	// written in. Zones it does not name follow in name order. Default:
	// name order.
	ZoneOrder []string `json:"zone_order,omitempty"`

	// StorageRaw is where limiter state lives: {"module": "memory"} (the
	// default, in this process) or {"module": "redis", ...} (shared by every
	// Caddy instance that points at the same Redis). Default: memory.
	StorageRaw json.RawMessage `json:"storage,omitempty" caddy:"namespace=http.handlers.rate_limit.storage inline_key=module"`

	// Headers are the rate-limit header modes: "ietf" (the default,
	// RateLimit and RateLimit-Policy), "ietf-draft-03" (RateLimit-Limit,
	// -Remaining, -Reset), "x-ratelimit" (X-RateLimit-*), or "none".
	// Retry-After is sent on a 429 whatever the mode. Default: ietf.
	Headers []string `json:"headers,omitempty"`

	// Status is the HTTP status of a rejected request. Default: 429.
	Status int `json:"status,omitempty"`

	// Jitter spreads Retry-After by up to this fraction, in [0, 1], by an
	// amount derived from a hash of the zone and key, so that one client
	// always gets the same spread and different clients different ones.
	// Default: 0.
	Jitter float64 `json:"jitter,omitempty"`

	// MaxKeys bounds the keys the memory store keeps per zone; the least
	// recently used keys are evicted first. Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`

	// SweepInterval is how often the memory store forgets keys whose state
	// is fresh again. Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// LogKey adds the resolved key to the rejection log line. Off by
	// default, since a key may be an API key or a user name. Default:
	// false.
	LogKey bool `json:"log_key,omitempty"`

	// DisableMetrics keeps this handler's zones out of Caddy's Prometheus
	// metrics even when Caddy's metrics are on (as in
	// mholt/caddy-ratelimit). Default: false.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Distributed is mholt/caddy-ratelimit's sync of its state through
	// Caddy storage. Tollgate refuses it with an error that says to use
	// the redis storage instead, whose decisions are exact across
	// instances. Default: none, refused.
	Distributed json.RawMessage `json:"distributed,omitempty"`

	// requestJSON: a zone reads the request's JSON body (its key, cost,
	// tier_key or cost_response names {http.rate_limit.request.json.*} or
	// {http.rate_limit.request.size}).
	requestJSON bool

	zones      []*zone
	headers    ratelimitheader.Modes
	status     int
	backend    Backend
	mem        *MemoryStorage      // the default backend, or on_storage_error local's local copies
	memory     bool                // the backend is the memory store
	redis      *RedisStorage       // the backend, if it is Redis
	store      shared.Store[*zone] // decides, settles and gives back on the backend
	bans       bool                // a zone has a ban
	slots      bool                // a zone has concurrency slots
	responses  bool                // a zone has count_response or cost_response
	logger     *zap.Logger
	logRejects bool         // the logger takes debug lines (see logReject)
	now        func() int64 // µs since the Unix epoch: clock, at provision

	storeSeconds prometheus.Observer // store latency; nil when metrics are off
	stop         chan struct{}
	events       *emitter // nil when the configuration has no events app
}

// Backend is a storage module: it opens one limiter per zone. Modules in the
// http.handlers.rate_limit.storage namespace implement it.
type Backend interface {
	OpenLimiter(z storage.Zone) (storage.Limiter, error)
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults, builds the zones and opens their limiters.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.logRejects = h.logger.Core().Enabled(zap.DebugLevel)
	h.now = clock
	// The checks first, so that a bad value opens no store and starts no
	// goroutine. Caddy calls Validate again after Provision; it is cheap.
	if err := h.Validate(); err != nil {
		return err
	}
	h.headers, _ = ratelimitheader.ParseModes(h.Headers)
	h.status = h.Status
	if h.status == 0 {
		h.status = 429
	}

	h.mem = new(MemoryStorage)
	if h.StorageRaw != nil {
		h.mem.local = true // on_storage_error local's, if the backend is not memory
		mod, err := ctx.LoadModule(h, "StorageRaw")
		if err != nil {
			return fmt.Errorf("loading storage module: %w", err)
		}
		b, ok := mod.(Backend)
		if !ok {
			return fmt.Errorf("storage: module %T is not a rate_limit storage backend", mod)
		}
		h.backend = b
		// Held by its type, not an interface: the request's results stay
		// on the stack only if escape analysis can see where they go.
		h.redis, _ = b.(*RedisStorage)
		_, h.memory = b.(*MemoryStorage)
	} else {
		h.backend = h.mem
		h.memory = true
	}
	h.store = shared.Store[*zone]{Memory: h.memory, Clock: h.now}
	if h.redis != nil {
		h.store.Pool = h.redis.client
	}

	order, err := zoneconf.Order(h.ZoneOrder, h.RateLimits)
	if err != nil {
		return err
	}
	for _, name := range order {
		z, err := h.provisionZone(ctx, name, h.RateLimits[name])
		if err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		h.zones = append(h.zones, z)
		h.bans = h.bans || z.ban != nil
		h.responses = h.responses || z.response != nil
		h.requestJSON = h.requestJSON || z.requestJSON
		for _, p := range z.parts {
			h.slots = h.slots || p.role == roleSlots
		}
	}
	if err := h.claimRedisZoneNames(ctx); err != nil {
		return err
	}
	if h.redis != nil {
		h.warnIfRedisUnreachable(ctx)
	}

	if err := h.provisionMetrics(ctx); err != nil {
		return err
	}
	if err := h.provisionEvents(ctx); err != nil {
		return err
	}

	h.stop = make(chan struct{})
	go h.sweep(time.Duration(h.SweepInterval), h.stop)
	if h.events != nil {
		go h.events.run(h.stop)
	}
	registerLive(h) // for the admin API and the store metrics
	return nil
}

// Validate checks every value of the handler and its zones, naming the
// field and the value, without a caddy.Context: it is the one set of
// checks, which the Caddyfile adapter runs (so that `caddy adapt` fails
// with the file and line of the field) and Provision runs first for a
// JSON config. Its errors start with the field they are about.
func (h *Handler) Validate() error {
	if isSet(h.Distributed) {
		return errDistributed
	}
	if err := checkStorageModule(h.StorageRaw); err != nil {
		return err
	}
	if _, err := ratelimitheader.ParseModes(h.Headers); err != nil {
		return err
	}
	if h.Status != 0 && (h.Status < 400 || h.Status > 599) {
		return fmt.Errorf("status: must be an HTTP error status (400-599), got %d", h.Status)
	}
	if h.Jitter < 0 || h.Jitter > 1 || h.Jitter != h.Jitter {
		return fmt.Errorf("jitter: must be in [0, 1], got %v", h.Jitter)
	}
	if h.MaxKeys < 0 {
		return fmt.Errorf("max_keys: must not be negative, got %d", h.MaxKeys)
	}
	if h.SweepInterval < 0 {
		return fmt.Errorf("sweep_interval: must not be negative, got %s", time.Duration(h.SweepInterval))
	}
	if len(h.RateLimits) == 0 {
		return fmt.Errorf("rate_limits: at least one zone is required")
	}
	order, err := zoneconf.Order(h.ZoneOrder, h.RateLimits)
	if err != nil {
		return err
	}
	for _, name := range order {
		if err := zoneconf.ValidName(name); err != nil {
			return err
		}
		zc := h.RateLimits[name]
		if zc == nil {
			return fmt.Errorf("zone %q: zone is empty: events and window are required", name)
		}
		if err := zc.validate(); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
	}
	return nil
}

// errDistributed refuses mholt/caddy-ratelimit's distributed option, in
// the Caddyfile and in JSON.
var errDistributed = errors.New("distributed: mholt/caddy-ratelimit's sync through Caddy storage is not supported, " +
	"since it over-admits between syncs; use the redis storage (storage redis { url ... } in the Caddyfile, " +
	`"storage": {"module": "redis", ...} in JSON) for one exact limit across instances`)

// isSet reports whether a JSON value is present and not null.
func isSet(raw json.RawMessage) bool {
	v := bytes.TrimSpace(raw)
	return len(v) > 0 && !bytes.Equal(v, []byte("null"))
}

// storageNamespace is the module namespace of the storage backends.
const storageNamespace = "http.handlers.rate_limit.storage"

// checkStorageModule checks that the storage config names a rate_limit
// storage module: mholt/caddy-ratelimit's storage is a Caddy storage
// module (file_system, ...) and gets an error that says what to use.
func checkStorageModule(raw json.RawMessage) error {
	if !isSet(raw) {
		return nil
	}
	var m struct {
		Module string `json:"module"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("storage: want an object with a module name: %v", err)
	}
	return storageModuleError(m.Module)
}

// storageModuleError returns an error if name is not a storage backend.
func storageModuleError(name string) error {
	if name == "" {
		return fmt.Errorf("storage: a module name is required: memory or redis")
	}
	if _, err := caddy.GetModule(storageNamespace + "." + name); err == nil {
		return nil
	}
	if _, err := caddy.GetModule("caddy.storage." + name); err == nil {
		return fmt.Errorf("storage: %q is a Caddy storage module, which mholt/caddy-ratelimit's distributed option syncs through; "+
			"Tollgate keeps its state in memory (the default) or redis: use redis for one exact limit across instances", name)
	}
	return fmt.Errorf("storage: unknown rate_limit storage %q: want memory (the default) or redis", name)
}

// warnIfRedisUnreachable logs at warning level, without failing the start,
// when the Redis storage does not answer a PING: it names each zone and
// what its on_storage_error will do until Redis answers.
func (h *Handler) warnIfRedisUnreachable(ctx caddy.Context) {
	err := h.redis.ping(ctx)
	if err == nil {
		return
	}
	zones := make([]string, len(h.zones))
	for i, z := range h.zones {
		zones[i] = z.name + ": " + z.onError.Effect()
	}
	h.logger.Warn("redis storage unreachable at start: each zone's on_storage_error applies until it answers",
		zap.Error(err), zap.Strings("zones", zones))
}

// Cleanup withdraws the zones from the admin API (and the series of zones
// no configuration defines any more from the metrics), stops the sweeper
// and the event emitter, and releases the zones' limiters. It is safe
// after a failed Provision.
func (h *Handler) Cleanup() error {
	for _, name := range unregisterLive(h) {
		forgetZoneMetrics(name)
	}
	if h.stop != nil {
		// Closed without writing h: the events app reads a copy of *h
		// (CaddyModule has a value receiver) while it emits our events.
		select {
		case <-h.stop:
		default:
			close(h.stop)
		}
	}
	for _, z := range h.zones {
		z.release()
	}
	if h.mem != nil {
		return h.mem.Cleanup()
	}
	return nil
}

// sweep forgets fresh keys from the memory stores every interval until stop
// is closed (by Cleanup, which must not race with this goroutine reading a
// field).
func (h *Handler) sweep(interval time.Duration, stop <-chan struct{}) {
	if interval == 0 {
		interval = time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			now := h.now()
			for _, z := range h.zones {
				z.sweep(now)
			}
		}
	}
}

// Interface guards.
var (
	_ caddy.Module                = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
