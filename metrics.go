package tollgate

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// Tollgate's Prometheus metrics. Caddy gives every configuration a fresh
// registry (caddy.Context.GetMetricsRegistry), so the collectors below are
// created once per process and registered on the registry of each
// configuration that has Caddy's metrics on: a counter keeps counting
// across config reloads, as the memory store keeps its state, and no
// reload registers a series twice or loses one. A zone's series are
// deleted when no live configuration defines the zone any more (see
// forgetZoneMetrics), so removed zones do not linger.
//
// No metric has a per-key label: keys are unbounded, zones are not.
var rateLimitMetrics = struct {
	requests     *prometheus.CounterVec
	storeSeconds *prometheus.HistogramVec
	stores       *storeCollector
	adaptive     *adaptiveCollector
	settlements  *settlementCollector
	leases       *leaseCollector
}{
	requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy",
		Subsystem: "http",
		Name:      "rate_limit_requests_total",
		Help:      "Rate-limit decisions by zone and result: allowed, rejected, banned (refused by a ban in force), dry_run_rejected (a dry-run zone would have rejected), storage_error (the store failed).",
	}, []string{"zone", "result"}),
	storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy",
		Subsystem: "http",
		Name:      "rate_limit_storage_seconds",
		Help:      "Latency of rate-limit decisions on the store, by storage backend.",
		// 1µs to about 4s by factors of 4: an in-memory decision takes
		// about a microsecond, a Redis round trip about a millisecond.
		Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
	}, []string{"backend"}),
	stores: &storeCollector{
		keys: prometheus.NewDesc("caddy_http_rate_limit_keys",
			"Keys held by the zone's memory store.", []string{"zone"}, nil),
		evictions: prometheus.NewDesc("caddy_http_rate_limit_evictions_total",
			"Keys the zone's memory store evicted to stay within max_keys.", []string{"zone"}, nil),
	},
	settlements: &settlementCollector{
		pending: prometheus.NewDesc("caddy_http_rate_limit_settlements_pending",
			"Settlements (give-backs, owed excesses) that Redis could not hear yet, kept until it does.", nil, nil),
		applied: prometheus.NewDesc("caddy_http_rate_limit_settlements_applied_total",
			"Kept settlements that reached Redis once it answered.", nil, nil),
		dropped: prometheus.NewDesc("caddy_http_rate_limit_settlements_dropped_total",
			"Kept settlements dropped: their window ended before Redis heard them (they could no longer change a decision), too many were kept, or Redis may have applied them.", nil, nil),
	},
	leases: &leaseCollector{
		taken: prometheus.NewDesc("caddy_http_rate_limit_leases_taken_total",
			"Quota leases taken on Redis: slices of a hot key's quota debited before they are spent, to decide its requests in memory.", nil, nil),
		returned: prometheus.NewDesc("caddy_http_rate_limit_leases_returned_total",
			"Quota leases that gave back what they did not spend (unspent events, a bucket's refill not lived).", nil, nil),
		expired: prometheus.NewDesc("caddy_http_rate_limit_leases_expired_total",
			"Quota leases that ended with nothing to give back.", nil, nil),
		lost: prometheus.NewDesc("caddy_http_rate_limit_leases_lost_total",
			"Quota leases whose return failed: what they held is lost until their key's window ends or its bucket refills (never over the limit).", nil, nil),
		decisions: prometheus.NewDesc("caddy_http_rate_limit_lease_decisions_total",
			"Requests decided from a quota lease, without a round trip to Redis.", nil, nil),
	},
	adaptive: &adaptiveCollector{
		limit: prometheus.NewDesc("caddy_http_rate_limit_adaptive_limit",
			"concurrency adaptive: the requests the zone admits in flight now, its keys' limits added up.", []string{"zone"}, nil),
		inFlight: prometheus.NewDesc("caddy_http_rate_limit_adaptive_in_flight",
			"concurrency adaptive: the zone's requests in flight, its keys' added up.", []string{"zone"}, nil),
		baseline: prometheus.NewDesc("caddy_http_rate_limit_adaptive_baseline_seconds",
			"concurrency adaptive: the round trip of the upstream not queueing, averaged over the zone's keys that learnt one.", []string{"zone"}, nil),
		recent: prometheus.NewDesc("caddy_http_rate_limit_adaptive_recent_seconds",
			"concurrency adaptive: the last sample window's percentile round trip, averaged over the zone's keys that learnt one.", []string{"zone"}, nil),
		gradient: prometheus.NewDesc("caddy_http_rate_limit_adaptive_gradient",
			"concurrency adaptive: the last window's gradient (1: no queueing; down to 0.5), averaged over the zone's keys that learnt one.", []string{"zone"}, nil),
		shed: prometheus.NewDesc("caddy_http_rate_limit_adaptive_shed_total",
			"concurrency adaptive: requests the zone shed (in a dry run: would have shed).", []string{"zone"}, nil),
	},
}

// Results of a zone's decision, the values of the result label.
const (
	resultAllowed        = "allowed"
	resultRejected       = "rejected"
	resultBanned         = "banned"
	resultDryRunRejected = "dry_run_rejected"
	resultStorageError   = "storage_error"
)

// zoneMetrics are one zone's series, resolved once at provision so that
// the request path only adds to atomics: no label lookup, no lock, no
// allocation.
type zoneMetrics struct {
	allowed      prometheus.Counter
	rejected     prometheus.Counter // dry_run_rejected in a dry-run zone
	banned       prometheus.Counter // dry_run_rejected in a dry-run zone
	storageError prometheus.Counter
}

// metricsEnabled reports whether the configuration being provisioned has
// Caddy's metrics on. Tests replace it.
var metricsEnabled = httpMetricsEnabled

// httpMetricsEnabled reports whether the HTTP app has metrics on: the
// Caddyfile's `metrics` global option (or a server's deprecated `metrics`
// option, which the app hoists) sets apps.http.metrics. Caddy stores an app
// in the configuration before provisioning it, so that its modules can
// look at it while they are provisioned: this finds the HTTP app that is
// provisioning the handler, and never loads a second one.
func httpMetricsEnabled(ctx caddy.Context) bool {
	app, err := ctx.AppIfConfigured("http")
	if err != nil {
		return false
	}
	httpApp, ok := app.(*caddyhttp.App)
	return ok && httpApp.Metrics != nil
}

// provisionMetrics registers the collectors on the configuration's
// registry, if Caddy's metrics are on and the handler does not disable
// them, and resolves each zone's series.
func (h *Handler) provisionMetrics(ctx caddy.Context) error {
	if h.DisableMetrics || !metricsEnabled(ctx) {
		return nil
	}
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return nil
	}
	m := &rateLimitMetrics
	for _, c := range rateLimitCollectors() {
		if err := reg.Register(c); err != nil {
			// Another handler of this configuration registered it.
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) || are.ExistingCollector != c {
				return fmt.Errorf("registering metrics: %w", err)
			}
		}
	}
	h.storeSeconds = m.storeSeconds.WithLabelValues(backendName(h.backend))
	for _, z := range h.zones {
		rejected, banned := resultRejected, resultBanned
		if z.DryRun {
			rejected, banned = resultDryRunRejected, resultDryRunRejected
		}
		z.metrics = &zoneMetrics{
			allowed:      m.requests.WithLabelValues(z.name, resultAllowed),
			rejected:     m.requests.WithLabelValues(z.name, rejected),
			storageError: m.requests.WithLabelValues(z.name, resultStorageError),
		}
		if z.ban != nil {
			z.metrics.banned = m.requests.WithLabelValues(z.name, banned)
		}
	}
	return nil
}

// rateLimitCollectors are the collectors provisionMetrics registers:
// every metric Tollgate exports (docs/grafana-dashboard.json and
// docs/prometheus-alerts.yml are tested against them).
func rateLimitCollectors() []prometheus.Collector {
	m := &rateLimitMetrics
	return []prometheus.Collector{m.requests, m.storeSeconds, m.stores, m.adaptive, m.settlements, m.leases}
}

// clockBase is what store latencies are timed from, on the monotonic
// clock.
var clockBase = time.Now()

// storeStart returns the time a store decision starts, for storeDone.
func (h *Handler) storeStart() time.Duration {
	if h.storeSeconds == nil {
		return 0
	}
	return time.Since(clockBase)
}

// storeDone records the latency of one store decision: one per request,
// however many zones it decided.
func (h *Handler) storeDone(start time.Duration) {
	if h.storeSeconds != nil {
		h.storeSeconds.Observe((time.Since(clockBase) - start).Seconds())
	}
}

// count counts one zone's decision of a request, or its store's failure
// err.
func (m *zoneMetrics) count(o zoneOutcome, err error) {
	if m == nil {
		return
	}
	switch {
	case err != nil:
		m.storageError.Inc()
	case o == outcomeAllowed:
		m.allowed.Inc()
	case o == outcomeBanned:
		m.banned.Inc()
	default:
		m.rejected.Inc()
	}
}

// forgetZoneMetrics deletes the series of a zone that no live
// configuration defines any more.
func forgetZoneMetrics(zone string) {
	rateLimitMetrics.requests.DeletePartialMatch(prometheus.Labels{"zone": zone})
}

// backendName is the storage backend's module name ("memory", "redis"),
// the backend label of the storage latency histogram.
func backendName(b Backend) string {
	if m, ok := b.(caddy.Module); ok {
		return m.CaddyModule().ID.Name()
	}
	return fmt.Sprintf("%T", b)
}

// storeCollector reports the key count and evictions of the live zones'
// memory stores, read from the stores when Prometheus scrapes. A zone name
// that several live handlers define is reported once, adding up its
// distinct stores; stores that keep no count (Redis) are not reported.
type storeCollector struct {
	keys, evictions *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.evictions
}

// Collect implements prometheus.Collector.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range liveStoreCounts() {
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(s.keys), s.zone)
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(s.evictions), s.zone)
	}
}

// Interface guard.
var _ prometheus.Collector = (*storeCollector)(nil)

// adaptiveCollector reports the controllers of the live zones with
// concurrency adaptive, read when Prometheus scrapes: per zone name, over
// its distinct states (one across reloads) and their keys.
type adaptiveCollector struct {
	limit, inFlight, baseline, recent, gradient, shed *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *adaptiveCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.limit, c.inFlight, c.baseline, c.recent, c.gradient, c.shed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *adaptiveCollector) Collect(ch chan<- prometheus.Metric) {
	for _, a := range liveAdaptive() {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, a.zone)
		}
		g(c.limit, float64(a.limit))
		g(c.inFlight, float64(a.inFlight))
		if a.learnt > 0 {
			n := float64(a.learnt)
			g(c.baseline, a.baseline/n/microsPerSecond)
			g(c.recent, a.recent/n/microsPerSecond)
			g(c.gradient, a.gradient/n)
		}
		ch <- prometheus.MustNewConstMetric(c.shed, prometheus.CounterValue, float64(a.shed), a.zone)
	}
}

// adaptiveSum is a zone name's controllers added up.
type adaptiveSum struct {
	zone                       string
	limit, inFlight, shed      int64
	learnt                     int // keys that closed a window
	baseline, recent, gradient float64
}

// liveAdaptive adds up the controllers of the live zones with
// concurrency adaptive and metrics, one per zone name, sorted by name.
func liveAdaptive() []adaptiveSum {
	var sums []adaptiveSum
	seen := map[*shared.Adaptive]bool{}
	for _, lz := range liveZones() {
		a := lz.z.adaptive
		if a == nil || lz.z.metrics == nil || seen[a.Adaptive] {
			continue
		}
		seen[a.Adaptive] = true
		if len(sums) == 0 || sums[len(sums)-1].zone != lz.z.name {
			sums = append(sums, adaptiveSum{zone: lz.z.name})
		}
		s := &sums[len(sums)-1]
		s.shed += a.Adaptive.Shed()
		a.Adaptive.Each(func(_ string, st shared.AdaptiveState, _ bool) {
			s.limit += st.Limit
			s.inFlight += st.InFlight
			if st.Windows > 0 {
				s.learnt++
				s.baseline += float64(st.Baseline)
				s.recent += float64(st.Recent)
				s.gradient += st.Gradient
			}
		})
	}
	return sums
}

// Interface guard.
var _ prometheus.Collector = (*adaptiveCollector)(nil)

// settlementCollector reports the settlements this process keeps for
// Redis (see shared.Owed): read from its counts when Prometheus scrapes.
type settlementCollector struct {
	pending, applied, dropped *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *settlementCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.applied
	ch <- c.dropped
}

// Collect implements prometheus.Collector.
func (c *settlementCollector) Collect(ch chan<- prometheus.Metric) {
	pending, applied, dropped := shared.Settlements()
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(pending))
	ch <- prometheus.MustNewConstMetric(c.applied, prometheus.CounterValue, float64(applied))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(dropped))
}

// Interface guard.
var _ prometheus.Collector = (*settlementCollector)(nil)

// leaseCollector reports the quota leases of this process's Redis stores
// (see redisstore.LeaseTotals), counted across reloads.
type leaseCollector struct {
	taken, returned, expired, lost, decisions *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *leaseCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.taken
	ch <- c.returned
	ch <- c.expired
	ch <- c.lost
	ch <- c.decisions
}

// Collect implements prometheus.Collector.
func (c *leaseCollector) Collect(ch chan<- prometheus.Metric) {
	taken, returned, expired, lost, decisions := redisstore.LeaseTotals()
	ch <- prometheus.MustNewConstMetric(c.taken, prometheus.CounterValue, float64(taken))
	ch <- prometheus.MustNewConstMetric(c.returned, prometheus.CounterValue, float64(returned))
	ch <- prometheus.MustNewConstMetric(c.expired, prometheus.CounterValue, float64(expired))
	ch <- prometheus.MustNewConstMetric(c.lost, prometheus.CounterValue, float64(lost))
	ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(decisions))
}

// Interface guard.
var _ prometheus.Collector = (*leaseCollector)(nil)
