package tollgate

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// eventExceeded is the Caddy event emitted on every rejection, and on
// every would-be rejection of a dry-run zone.
const eventExceeded = "rate_limit_exceeded"

// eventBanned is the Caddy event emitted when a zone's rejection of a
// key starts a ban (once per ban).
const eventBanned = "rate_limit_banned"

// eventGranted is the Caddy event emitted when the admin API (or `caddy
// rate-limit grant`) gives a key extra quota.
const eventGranted = "rate_limit_granted"

// eventQueueSize is how many events wait for the emitter before new ones
// are dropped.
const eventQueueSize = 1024

// emitter hands rate_limit_exceeded events to the events app on a
// goroutine of its own. The events app runs subscribers synchronously,
// and a subscriber may be slow (an exec, a webhook): a rejection only
// puts a small value on a bounded queue and never waits, and when the
// queue is full the event is dropped and counted.
type emitter struct {
	app     *caddyevents.App
	ctx     caddy.Context // the handler's: the event's origin module
	queue   chan exceeded
	dropped atomic.Int64
	dropLog shared.LogThrottle
	logger  *zap.Logger
	now     func() int64

	// Which events a subscription can receive: the others are not emitted.
	exceeded, banned, granted bool
}

// wants reports whether event is one a subscription can receive.
func (e *emitter) wants(event string) bool {
	if event == eventBanned {
		return e.banned
	}
	return e.exceeded
}

// exceeded is one rejection, as queued.
type exceeded struct {
	event    string // eventExceeded or eventBanned
	zone     string
	wait     int64 // µs, or algorithms.Never
	dryRun   bool
	clientIP string
	key      string // only with log_key
}

// provisionEvents finds the events app if the configuration has one (the
// JSON apps.events, where subscriptions are configured, or an app another
// module loaded), and emits only the events that one of its configured
// subscriptions can receive. Without one, nothing could subscribe and no
// event is emitted. The events app does its own work for every event
// whether or not anything listens (a logger, an ID, a replacer: about 1.2
// KB of garbage and 5% of Caddy's CPU under a flood of rejections), and
// Caddy's own TLS app loads it in most configurations.
func (h *Handler) provisionEvents(ctx caddy.Context) error {
	app, err := ctx.AppIfConfigured("events")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("getting events app: %w", err)
	}
	events, ok := app.(*caddyevents.App)
	if !ok {
		return fmt.Errorf("getting events app: unexpected type %T", app)
	}
	id := h.CaddyModule().ID
	onExceeded := subscribed(events.Subscriptions, eventExceeded, id)
	onBanned := subscribed(events.Subscriptions, eventBanned, id)
	onGranted := subscribed(events.Subscriptions, eventGranted, id)
	if !onExceeded && !onBanned && !onGranted {
		return nil
	}
	h.events = &emitter{
		app:      events,
		ctx:      ctx,
		queue:    make(chan exceeded, eventQueueSize),
		logger:   h.logger,
		now:      h.now,
		exceeded: onExceeded,
		banned:   onBanned,
		granted:  onGranted,
	}
	return nil
}

// granted logs a grant made to key in part p (the zone's rate or a
// tier's) and emits rate_limit_granted, with the key's state after it:
// zone, key, tier (if any), amount (events), remaining and reset
// (seconds). An admin action is rare: the event is emitted at once, and
// the API answers when its subscribers have run.
func (h *Handler) granted(p *zone, key string, amount float64, d algorithms.Decision) {
	h.logger.Info("rate limit grant", zap.String("zone", p.base.name), zap.String("key", key), zap.String("tier", p.tier),
		zap.Float64("amount", amount), zap.Int64("remaining", ratelimitheader.ShownRemaining(d.Remaining)), zap.Float64("reset", float64(d.Reset)/microsPerSecond))
	if e := h.events; e != nil && e.granted {
		data := map[string]any{"zone": p.base.name, "key": key, "amount": amount, "remaining": ratelimitheader.ShownRemaining(d.Remaining), "reset": float64(d.Reset) / microsPerSecond}
		if p.tier != "" {
			data["tier"] = p.tier
		}
		e.app.Emit(e.ctx, eventGranted, data)
	}
}

// subscribed reports whether one of subs can receive event from module:
// one that names the event, or no event (all), from the module, a
// namespace above it (Caddy passes an event up the origin's namespaces:
// "http.handlers" receives it too) or any module.
func subscribed(subs []*caddyevents.Subscription, event string, module caddy.ModuleID) bool {
	for _, s := range subs {
		if s == nil {
			continue
		}
		if len(s.Events) > 0 && !slices.Contains(s.Events, event) && !slices.Contains(s.Events, "") {
			continue
		}
		if len(s.Modules) == 0 || slices.ContainsFunc(s.Modules, func(m caddy.ModuleID) bool {
			return m == "" || m == module || strings.HasPrefix(string(module), string(m)+".")
		}) {
			return true
		}
	}
	return false
}

// emitExceeded queues the rate_limit_exceeded event for res's rejection
// (dryRun: a dry-run zone's would-be rejection). It never blocks.
func (h *Handler) emitExceeded(r *http.Request, res *result, dryRun bool) {
	h.emit(r, eventExceeded, res, dryRun)
}

// emit queues event for res (for eventBanned, res is the ban's result and
// wait the ban's length).
func (h *Handler) emit(r *http.Request, event string, res *result, dryRun bool) {
	e := h.events
	if e == nil || !e.wants(event) {
		return
	}
	ev := exceeded{event: event, zone: res.Z.name, wait: res.D.Wait, dryRun: dryRun}
	ev.clientIP, _ = caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if h.LogKey {
		ev.key = res.Key
	}
	select {
	case e.queue <- ev:
	default:
		e.dropped.Add(1)
	}
}

// emitPause is how long the emitter rests after emitting what was queued:
// during a flood of rejections it wakes once per pause, not once per
// event (waking a goroutine costs the rejecting request more than the
// rest of its event).
const emitPause = 10 * time.Millisecond

// run emits queued events until stop is closed: it waits for one, emits
// it and whatever queued meanwhile, then rests for emitPause.
func (e *emitter) run(stop <-chan struct{}) {
	pause := time.NewTimer(emitPause)
	pause.Stop()
	for {
		select {
		case <-stop:
			return
		case ev := <-e.queue:
			e.emit(ev)
		}
	drain:
		for {
			select {
			case ev := <-e.queue:
				e.emit(ev)
			default:
				break drain
			}
		}
		pause.Reset(emitPause)
		select {
		case <-stop:
			return
		case <-pause.C:
		}
	}
}

// emit hands one event to the events app, and logs the events dropped
// since the last line, at most once per shared.LogInterval.
func (e *emitter) emit(ev exceeded) {
	e.app.Emit(e.ctx, ev.event, ev.data())
	if n := e.dropped.Load(); n > 0 {
		if _, ok := e.dropLog.Allow(e.now(), shared.LogInterval); ok {
			e.dropped.Add(-n)
			e.logger.Warn("rate_limit events dropped: event subscribers are too slow",
				zap.Int64("dropped", n))
		}
	}
}

// data is the event's data: zone, wait in seconds (-1 for a request that
// can never be admitted), dry_run, client_ip, and key only with log_key.
func (ev *exceeded) data() map[string]any {
	wait := -1.0
	if ev.wait != algorithms.Never {
		wait = float64(ev.wait) / microsPerSecond
	}
	d := map[string]any{
		"zone":      ev.zone,
		"wait":      wait,
		"dry_run":   ev.dryRun,
		"client_ip": ev.clientIP,
	}
	if ev.key != "" {
		d["key"] = ev.key
	}
	return d
}
