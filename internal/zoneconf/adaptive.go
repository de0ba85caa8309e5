package zoneconf

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// Adaptive is concurrency adaptive's settings as given; a zero field is a
// setting not given.
type Adaptive struct {
	Min, Max, Initial int64
	Window            time.Duration
	MinSamples        int64
	Percentile        float64
	Tolerance         float64
	Smoothing         float64
	Epoch             int64
	MaxKeys           int
	Status            int
}

// AdaptiveSettings are concurrency adaptive's settings, checked, defaults
// applied.
type AdaptiveSettings struct {
	Config  algorithms.AdaptiveConfig
	MaxKeys int // keys with a controller of their own
	Status  int // of a shed request
}

// DefaultAdaptiveMaxKeys is concurrency adaptive's max_keys when it is not
// set: a controller is about 1.3 KB, so 10,000 keys hold at most 13 MB. A
// zone keyed per upstream or per route has a few keys; one keyed per
// client beyond this many shares one controller among the rest.
const DefaultAdaptiveMaxKeys = 10000

// DefaultAdaptiveStatus is the status of a request concurrency adaptive
// sheds: 503, as load shedding (the upstream is busy, not the client over
// a quota), with Retry-After.
const DefaultAdaptiveStatus = http.StatusServiceUnavailable

// adaptive checks and parses the zone's concurrency adaptive into s.
func (zc *Zone) adaptive(s *Settings) error {
	a := zc.Adaptive
	if a == nil {
		return nil
	}
	if zc.Concurrency != 0 {
		return fmt.Errorf("concurrency: give a number or adaptive, not both; got concurrency %d and concurrency adaptive", zc.Concurrency)
	}
	if zc.ConcurrencyLease != 0 {
		return fmt.Errorf("concurrency_lease: a lease is a Redis slot's, and concurrency adaptive keeps its state in each instance's memory; got concurrency_lease %s", zc.ConcurrencyLease)
	}
	if a.Window < 0 || (a.Window > 0 && a.Window < time.Microsecond) {
		return fmt.Errorf("concurrency adaptive: window: must be at least 1µs, got %s", a.Window)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"min", a.Min}, {"max", a.Max}, {"initial", a.Initial}, {"min_samples", a.MinSamples}, {"epoch", a.Epoch}, {"max_keys", int64(a.MaxKeys)}} {
		if f.v < 0 {
			return fmt.Errorf("concurrency adaptive: %s: must be greater than 0, got %d", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"percentile", a.Percentile}, {"tolerance", a.Tolerance}, {"smoothing", a.Smoothing}} {
		if f.v < 0 {
			return fmt.Errorf("concurrency adaptive: %s: must be greater than 0, got %g", f.name, f.v)
		}
	}
	cfg, err := algorithms.NewAdaptive(algorithms.AdaptiveConfig{
		Floor: a.Min, Ceiling: a.Max, Initial: a.Initial,
		Window: a.Window.Microseconds(), MinSamples: a.MinSamples,
		Percentile: a.Percentile, Tolerance: a.Tolerance, Smoothing: a.Smoothing,
		Epoch: a.Epoch,
	})
	if err != nil {
		return fmt.Errorf("concurrency adaptive: %w", err)
	}
	as := &AdaptiveSettings{Config: cfg, MaxKeys: a.MaxKeys, Status: a.Status}
	if as.MaxKeys == 0 {
		as.MaxKeys = DefaultAdaptiveMaxKeys
	}
	if as.Status == 0 {
		as.Status = DefaultAdaptiveStatus
	}
	if as.Status < 400 || as.Status > 599 {
		return fmt.Errorf("concurrency adaptive: status: must be a 4xx or 5xx code, got %d", as.Status)
	}
	s.Adaptive = as
	return nil
}
